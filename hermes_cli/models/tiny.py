"""Built-in random-weight models of real architectures, built on the spot (no download).

``tiny`` is a Qwen2.5-VL, ``tiny-llava-onevision`` a LLaVA-OneVision, ``tiny-qwen3-vl(-moe)`` a
Qwen3-VL (``families.py`` lists them): real model classes, the official processors, and a
byte-level BPE tokenizer trained in memory with the real special tokens. Same seed, same
weights. Their answers are noise: they exist for smoke runs, tests and benchmarks, and are
always announced as random weights. Each family's module builds its own (``tiny_model``) from
the shared parts here: the tokenizer, the chat template, the seed; ``build_tiny`` picks it.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SEED = 0
QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|video_pad|>", "<|image_pad|>",
]
LLAVA_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
CORPUS = (
    "system user assistant You are a helpful assistant. What is happening in the video? "
    "Describe the current scene in detail, focusing on specific objects, fine-grained actions, "
    "and spatial relationships. Summarize the video narrative, identifying main characters, key "
    "events, timeline changes, and the overall theme. Question: Answer: Context summary: Find "
    "recent details related to: a person walks to the red door, a blue car, the green ball rolls "
    "left and right; when did the scene change? what colour is the square? yes no one two three "
    "A B C D (A) (B) (C) (D) Options: Best option:"
)


def chat_template(video: str) -> str:
    return (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
        "{% if c.type == 'video' %}" + video + "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


# A vocabulary large enough that every word of CORPUS becomes one token (the merges run out
# first), as under the real Qwen2 tokenizer: the built-in pseudo-queries then take 65 tokens,
# as with Qwen's BPE ranks (43 mixed + 22 global), instead of 135 with the tiny models' 400.
WHOLE_WORDS = 1024


def make_tokenizer(specials: list[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained in memory, with ``specials`` as single tokens.

    The default 400 fits the tiny models' 512-entry embeddings; ``WHOLE_WORDS`` gives the
    full-size builds texts of realistic length (words outside CORPUS are still split finely).
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def seeded(build):
    """``build()`` in eval mode, its weights drawn from the fixed seed (same seed, same weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return build().eval()


def token_ids(tokenizer, names: dict[str, str]) -> dict[str, int]:
    """{key: id} of the special tokens named by ``names`` ({key: token})."""
    return {key: tokenizer.convert_tokens_to_ids(tok) for key, tok in names.items()}


def build_tiny(name: str, **sizes: int):
    """(model, processor) of the built-in random-weight model ``name`` (``registry.BUILTIN``),
    built by its family's ``tiny_model``; ``sizes``: ``num_layers``, ``max_positions``."""
    from .registry import BUILTIN, family_named

    return family_named(BUILTIN[name]).build_tiny(name, **sizes)
