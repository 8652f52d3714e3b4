"""The model hub as the command line meets it: one quick probe, quiet libraries, one-line errors.

Loading a hub id that is not cached while the hub cannot be reached would otherwise take half a
minute of retries (``huggingface_hub`` backs off five times) and print each retry. ``probe_hub``
answers in about two seconds whether the hub endpoint (``HF_ENDPOINT``, else huggingface.co)
answers at all; ``quiet_hub_logs`` silences the libraries' own retry and warning chatter.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 2.0


def hub_endpoint() -> str:
    """The hub address downloads use: ``HF_ENDPOINT`` if set, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def probe_hub(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the hub endpoint answers (any HTTP status), else why it does not, in a few words.

    One request, bounded by ``timeout_s`` in all (name lookup included: it runs in a thread).
    Proxies from the environment are honoured, as the download would honour them.
    """
    result: dict[str, str | None] = {}

    def attempt() -> None:
        try:
            request = urllib.request.Request(hub_endpoint() + "/api/models?limit=1", method="HEAD")
            with urllib.request.urlopen(request, timeout=timeout_s):
                pass
            result["why"] = None
        except urllib.error.HTTPError:  # the server answered: the hub is reachable
            result["why"] = None
        except urllib.error.URLError as exc:
            result["why"] = _reason(exc.reason)
        except (OSError, ValueError) as exc:
            result["why"] = _reason(exc)

    thread = threading.Thread(target=attempt, name="hermes-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 0.25)
    if thread.is_alive() or "why" not in result:
        return f"no answer within {timeout_s:g} s"
    return result["why"]


def _reason(exc: object) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc)
    return text.strip() or type(exc).__name__


def unreachable_message(model: str, why: str) -> str:
    """The one line for a hub model that cannot be downloaded because the hub is unreachable."""
    return (f"cannot download {model}: the model hub at {hub_endpoint()} is unreachable ({why}) — "
            "pass a local model directory with --model PATH, try --model tiny (random weights, no download), "
            "or connect to the network (HF_HUB_OFFLINE=1 uses only models already cached)")


def quiet_hub_logs(verbose: bool = False) -> None:
    """Silence huggingface_hub's retry messages and transformers' warnings (kept with --verbose)."""
    import logging

    level = logging.INFO if verbose else logging.ERROR
    for name in ("huggingface_hub", "transformers", "urllib3"):
        logging.getLogger(name).setLevel(level)
    if not verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")


def _cache_folder(model_id: str):
    from pathlib import Path

    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("models--" + model_id.replace("/", "--"))


def cached_size(model_id: str) -> int | None:
    """Bytes the hub cache holds for a hub id (its finished files), None when it holds none of it."""
    folder = _cache_folder(model_id)
    blobs = folder / "blobs"
    if not folder.is_dir():
        return None
    files = [p for p in blobs.iterdir() if p.is_file() and not p.name.endswith(".incomplete")] if blobs.is_dir() else []
    if not files:  # a cache without symbolic links keeps the files in its snapshots
        files = [p for p in (folder / "snapshots").rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files) if files else None


def cached_models() -> dict[str, str]:
    """Hub ids in the cache with a config.json: id -> its model_type ('' when unreadable)."""
    import json
    from pathlib import Path

    from huggingface_hub import constants

    found: dict[str, str] = {}
    root = Path(constants.HF_HUB_CACHE)
    if not root.is_dir():
        return found
    for folder in sorted(root.glob("models--*--*")):
        configs = sorted((folder / "snapshots").glob("*/config.json"))
        if not configs:
            continue
        model_id = folder.name[len("models--"):].replace("--", "/", 1)
        try:
            found[model_id] = json.loads(configs[-1].read_text(encoding="utf-8")).get("model_type") or ""
        except (OSError, ValueError):
            found[model_id] = ""
    return found
