"""``hermes pull MODEL``: download a model into the Hugging Face cache ahead of use, with progress.

The download is ``huggingface_hub``'s own (``snapshot_download``): files land in the hub cache
(``$HF_HOME/hub``) where every command finds them, finished files are kept and a partial one
continues from where it stopped, so running the command again resumes. A hub that cannot be
reached fails in one line within about two seconds (``hub.probe_hub``), before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .console import Interrupted, UserError, err, note, out, quiet, set_debug, set_verbosity, verbose
from .info import _size
from .options import DebugOpt, QuietOpt, VerboseOpt

# other frameworks' copies of the weights: never read by hermes (transformers loads safetensors)
IGNORE = ["*.msgpack", "*.h5", "*.ot", "*.onnx", "*.onnx_data", "*.gguf", "*.tflite", "*.mlmodel", "original/*",
          "coreml/*", "onnx/*"]
PYTORCH_BINARIES = ["*.bin", "*.pt", "*.pth"]  # skipped when the repo has safetensors


def pull(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Hub id, e.g. Qwen/Qwen2.5-VL-3B-Instruct (see `hermes models`).", show_default=False)],
    revision: Annotated[str | None, typer.Option("--revision", metavar="REV", help="Branch, tag or commit (default: main).")] = None,
    quiet_: QuietOpt = False,
    verbose_: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Download a model into the Hugging Face cache, with progress; run it again to resume.

    The files go where every hermes command looks for them ($HF_HOME/hub, by default
    ~/.cache/huggingface/hub); `hermes models` then shows the model as present, with its size
    on disk. HF_ENDPOINT names a mirror.

    \b
    Examples:
      hermes pull llava-hf/llava-onevision-qwen2-0.5b-ov-hf
      hermes pull Qwen/Qwen2.5-VL-3B-Instruct --revision main
    """
    set_debug(debug)
    set_verbosity(quiet_, verbose_)
    repo = _check_name(model)
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    from .hub import hub_endpoint

    endpoint = hub_endpoint()
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    try:
        HfApi(endpoint=endpoint).repo_info(repo, revision=revision, timeout=10)  # a clear error for a bad name first
        disable_progress_bars()  # the plan: no bar of its own
        try:
            plan = snapshot_download(repo, revision=revision, ignore_patterns=IGNORE, dry_run=True)
        finally:
            if not quiet():
                enable_progress_bars()
        names = {f.filename for f in plan}
        if any(n.endswith(".safetensors") for n in names):
            plan = [f for f in plan if not any(Path(f.filename).match(p) for p in PYTORCH_BINARIES)]
        wanted = sum(f.file_size or 0 for f in plan if f.will_download)
        if not quiet():
            have = len(plan) - sum(f.will_download for f in plan)
            err.print(f"pulling {repo}: {len(plan)} files, {_size(wanted)} to download"
                      + (f" ({have} already here)" if have else "") + f" into {constants.HF_HUB_CACHE}",
                      soft_wrap=True, highlight=False)
        ignore = IGNORE + (PYTORCH_BINARIES if any(n.endswith(".safetensors") for n in names) else [])
        path = snapshot_download(repo, revision=revision, ignore_patterns=ignore)
    except GatedRepoError as exc:
        raise UserError(f"{repo} is gated: accept its terms on {endpoint}/{repo} and log in (hf auth login), "
                        "then rerun hermes pull") from exc
    except RevisionNotFoundError as exc:
        raise UserError(f"{repo} has no revision {revision!r} on {endpoint}") from exc
    except RepositoryNotFoundError as exc:
        raise UserError(f"{repo} is not on the model hub at {endpoint} (or it is private: log in with "
                        "hf auth login) — `hermes models` lists the supported families") from exc
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: the files finished so far are kept — rerun hermes pull {repo} "
                          "to resume") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise UserError(f"the model hub at {endpoint} refused {repo}" + (f" (HTTP {status})" if status else "")
                        + " — check the name (`hermes models` lists the supported families) or HF_ENDPOINT") from exc
    except (OSError, ConnectionError) as exc:
        text = str(exc).strip().splitlines()
        raise UserError(f"the download of {repo} stopped ({type(exc).__name__}: {text[0] if text else ''}) — "
                        f"rerun hermes pull {repo} to resume where it stopped") from exc
    except Exception as exc:  # httpx's transport errors are no OSError
        if type(exc).__module__.split(".")[0] not in ("httpx", "httpx2", "httpcore", "httpcore2"):
            raise
        raise UserError(f"the download of {repo} stopped ({type(exc).__name__}: {exc}) — "
                        f"rerun hermes pull {repo} to resume where it stopped") from exc
    _check_family(Path(path), repo)
    from .hub import cached_size

    out.print(f"{repo}: {_size(cached_size(repo) or 0)} on disk in {path}", soft_wrap=True, highlight=False)


def _check_name(model: str) -> str:
    """The hub id to pull, or a one-line ``UserError`` for what cannot or need not be pulled."""
    from ..models.registry import TINY_NAMES, hub_offline, looks_like_path
    from .hub import probe_hub, quiet_hub_logs

    if model in TINY_NAMES:
        raise UserError(f"{model} is built in (random weights, made on the spot): nothing to download")
    if Path(model).expanduser().is_dir():
        raise UserError(f"{model} is a local directory: nothing to download — use it as --model {model}")
    if looks_like_path(model) or model.count("/") != 1 or not all(model.split("/")):
        raise UserError(f"{model!r} is not a hub id: pass ORGANISATION/NAME, e.g. llava-hf/llava-onevision-qwen2-0.5b-ov-hf")
    if hub_offline():
        raise UserError("hermes pull downloads from the model hub, and HF_HUB_OFFLINE is set — unset it to download")
    quiet_hub_logs(verbose())
    if why := probe_hub():
        from .hub import hub_endpoint

        raise UserError(f"cannot pull {model}: the model hub at {hub_endpoint()} is unreachable ({why}) — "
                        "connect to the network, or set HF_ENDPOINT to a mirror")
    return model


def _check_family(path: Path, repo: str) -> None:
    """A note when the model is not of a family hermes runs (it is downloaded all the same)."""
    import json

    from ..models.registry import family_of_type

    try:
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        note(f"{repo} has no readable config.json: hermes cannot load it as a model")
        return
    if model_type and family_of_type(model_type) is None:
        note(f"{repo} is a {model_type!r} model, which hermes does not run (see `hermes models`)")

