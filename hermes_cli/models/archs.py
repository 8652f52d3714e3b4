"""Full-size random-weight models of real architectures, for benchmarks without weights.

``--arch NAME --random-weights`` builds the real model class from the shipped configuration of a
published model (``hermes_cli/configs/*.json``: sizes, layers, heads, vocabulary, rotary and
vision-tower facts; no weights) and fills every weight with seeded random numbers. Speed and
memory are those of the real model; answers are noise. The tokenizer is made on the spot (a
small byte-level BPE with the model's special tokens, whole words for the built-in texts, so the
pseudo-queries have their real length); the model keeps its real vocabulary size, so the
embedding table and the output head have their real cost.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources

import torch

from .registry import ARCHS, ModelLoadError, resolve_arch
from .tiny import LLAVA_SPECIALS, QWEN_SPECIALS, SEED, WHOLE_WORDS, chat_template, make_tokenizer


@dataclass(frozen=True)
class BuildInfo:
    """What was built and how long it took."""

    arch: str
    hub_id: str
    parameters: int
    dtype: torch.dtype
    build_s: float


def arch_config(name: str) -> dict:
    """The shipped configuration (a dict as in the model's config.json) of an architecture."""
    text = resources.files("hermes_cli.models.configs").joinpath(ARCHS[resolve_arch(name)]).read_text()
    return json.loads(text)


def parameter_estimate(name: str) -> int:
    """Parameters the architecture has, computed from its configuration without building it."""
    cfg = arch_config(name)
    t = cfg["text_config"]
    h, layers, inter, vocab = t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"], t["vocab_size"]
    head = h // t["num_attention_heads"]
    kv = t["num_key_value_heads"] * head
    attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (bias), k, v (bias), o
    if cfg["model_type"] == "qwen3_vl":  # explicit head_dim; no biases; per-head q/k norms
        q, kv = t["num_attention_heads"] * t["head_dim"], t["num_key_value_heads"] * t["head_dim"]
        attn = h * q + 2 * h * kv + q * h + 2 * t["head_dim"]
    per_layer = attn + 3 * h * inter + 2 * h
    text = vocab * h * (1 if t.get("tie_word_embeddings") else 2) + layers * per_layer + h
    return int(text)  # the vision tower and projector are counted after building


def build_random_model(name: str, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, processor, BuildInfo) of a full-size random-weight model of architecture ``name``.

    Construction skips the library's weight initialisation (slow for billions of weights) and
    then fills every parameter with seeded random numbers in ``dtype`` on ``device``: weights
    N(0, 0.02), norm scales 1, biases 0 — the usual initialisation, done in place and fast.
    """
    from transformers.initialization import no_init_weights

    key = resolve_arch(name)
    cfg = arch_config(key)
    t0 = time.perf_counter()
    if cfg["model_type"] == "llava_onevision":
        config, processor, cls = _llava_onevision(cfg)
    elif cfg["model_type"] == "qwen2_5_vl":
        config, processor, cls = _qwen2_5_vl(cfg)
    elif cfg["model_type"] == "qwen3_vl":
        config, processor, cls = _qwen3_vl(cfg)
    else:  # pragma: no cover - shipped configs only
        raise ModelLoadError(f"unsupported model type {cfg['model_type']!r} in {ARCHS[key]}")
    device = torch.device(device)
    previous = torch.get_default_dtype()
    try:
        with torch.no_grad(), no_init_weights(), torch.device(device):
            torch.set_default_dtype(dtype)
            model = cls(config)
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(f"{key} does not fit on {device} in {dtype}: {exc}".splitlines()[0]) from exc
    finally:
        torch.set_default_dtype(previous)
    model = model.to(dtype=dtype)
    model.tie_weights()  # skipped with the initialisation: the output head shares the embeddings where tied
    _fill_random(model, SEED)
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    info = BuildInfo(key, cfg.get("hub_id", key), n, dtype, time.perf_counter() - t0)
    return model, processor, info


@torch.no_grad()
def _fill_random(model: torch.nn.Module, seed: int) -> None:
    """Seeded in-place initialisation: matrices N(0, 0.02), norm weights 1, other vectors 0."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    norm_types = (torch.nn.LayerNorm,)
    done: set[int] = set()  # tied parameters are filled once
    for module in model.modules():
        is_norm = isinstance(module, norm_types) or "norm" in type(module).__name__.lower()
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in done:
                continue
            done.add(id(p))
            if p.dim() >= 2 and p.device.type == "cpu":
                p.normal_(0.0, 0.02, generator=gen)
            elif p.dim() >= 2:
                # draw on the CPU in float32 chunks (same numbers as on a CPU), then copy
                flat = p.view(-1)
                step = 1 << 24
                for start in range(0, flat.numel(), step):
                    part = torch.empty(min(step, flat.numel() - start), dtype=torch.float32)
                    part.normal_(0.0, 0.02, generator=gen)
                    flat[start : start + part.numel()].copy_(part)
            elif is_norm and pname == "weight":
                p.fill_(1.0)
            else:
                p.zero_()


def _token_ids(tokenizer, names: dict[str, str]) -> dict[str, int]:
    return {key: tokenizer.convert_tokens_to_ids(tok) for key, tok in names.items()}


def _llava_onevision(cfg: dict):
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, LlavaOnevisionProcessor
    from transformers.models.llava_onevision.image_processing_llava_onevision import LlavaOnevisionImageProcessor
    from transformers.models.llava_onevision.video_processing_llava_onevision import LlavaOnevisionVideoProcessor

    tokenizer = make_tokenizer(LLAVA_SPECIALS, WHOLE_WORDS)
    ids = _token_ids(tokenizer, {"eos": "<|im_end|>", "pad": "<|endoftext|>", "image": "<image>", "video": "<video>"})
    text = {k: v for k, v in cfg["text_config"].items()}
    text.update(bos_token_id=ids["pad"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    vision = dict(cfg["vision_config"])
    size = vision["image_size"]
    config = LlavaOnevisionConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        vision_config=vision,
        text_config=text,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        projector_hidden_act=cfg.get("projector_hidden_act", "gelu"),
        vision_feature_layer=cfg.get("vision_feature_layer", -1),
        vision_feature_select_strategy=cfg.get("vision_feature_select_strategy", "full"),
        vision_aspect_ratio=cfg.get("vision_aspect_ratio", "anyres_max_9"),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
    )
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size={"height": size, "width": size}),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size={"height": size, "width": size}),
        num_image_tokens=(size // vision["patch_size"]) ** 2,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        chat_template=chat_template("<video>\n"),
    )
    return config, processor, LlavaOnevisionForConditionalGeneration


def _qwen_text(cfg: dict):
    """(tokenizer, special token ids, text config) shared by the Qwen-VL families."""
    tokenizer = make_tokenizer(QWEN_SPECIALS, WHOLE_WORDS)
    ids = _token_ids(tokenizer, {
        "eos": "<|im_end|>", "pad": "<|endoftext|>", "image": "<|image_pad|>", "video": "<|video_pad|>",
        "vstart": "<|vision_start|>", "vend": "<|vision_end|>",
    })
    text = dict(cfg["text_config"])
    text.update(bos_token_id=ids["pad"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    return tokenizer, ids, text


def _qwen2_5_vl(cfg: dict):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer, ids, text = _qwen_text(cfg)
    config = Qwen2_5_VLConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        text_config=text,
        vision_config=dict(cfg["vision_config"]),
        video_token_id=ids["video"], image_token_id=ids["image"],
        vision_start_token_id=ids["vstart"], vision_end_token_id=ids["vend"],
        bos_token_id=ids["pad"], eos_token_id=ids["eos"], pad_token_id=ids["pad"],
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),  # the library's defaults: Qwen2.5-VL's video sizes
        chat_template=chat_template("<|vision_start|><|video_pad|><|vision_end|>"),
    )
    return config, processor, Qwen2_5_VLForConditionalGeneration


def _qwen3_vl(cfg: dict):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer, ids, text = _qwen_text(cfg)
    config = Qwen3VLConfig(
        text_config=text, vision_config=dict(cfg["vision_config"]),
        video_token_id=ids["video"], image_token_id=ids["image"],
        vision_start_token_id=ids["vstart"], vision_end_token_id=ids["vend"],
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
    )
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),  # the library's defaults: Qwen3-VL's video sizes
        chat_template=chat_template("<|vision_start|><|video_pad|><|vision_end|>"),
    )
    return config, processor, Qwen3VLForConditionalGeneration


def load_random_arch(name: str, *, device: str | None = None, dtype: str | None = None):
    """A full-size random-weight model behind its adapter (``random_weights=True``)."""
    from .loading import ADAPTERS, pick_device, pick_dtype
    from .registry import family_of_type

    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    model, processor, info = build_random_model(name, device=dev, dtype=dt)
    family = family_of_type(arch_config(name)["model_type"])
    assert family is not None, "shipped configs are of supported families"
    cls = ADAPTERS[family.name]
    adapter = cls(model, processor, name=f"{info.arch} (random weights, {info.hub_id} architecture)",
                  random_weights=True)
    adapter.build_info = info  # type: ignore[attr-defined]
    return adapter
