"""Built-in random-weight models of real architectures, built on the spot (no download).

``tiny`` is a Qwen2.5-VL and ``tiny-llava-onevision`` a LLaVA-OneVision: real model classes,
the official processors, and a byte-level BPE tokenizer trained in memory with the real special
tokens. Same seed, same weights. Their answers are noise: they exist for smoke runs, tests and
benchmarks, and are always announced as random weights.
"""

from __future__ import annotations

from typing import Any

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


def _seeded(build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return build().eval()


def tiny_qwen(num_layers: int = 10, max_positions: int = 32768):
    """(model, processor) of a random-weight Qwen2.5-VL with ``num_layers`` decoder layers."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer = make_tokenizer(QWEN_SPECIALS)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        text_config=dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
            bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
        ),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, window_size=56,
            fullatt_block_indexes=[1], patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
            tokens_per_second=2,
        ),
        video_token_id=ids("<|video_pad|>"), image_token_id=ids("<|image_pad|>"),  # type: ignore[arg-type]  # transformers' typed config __init__ omits inherited kwargs
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),  # type: ignore[arg-type]  # transformers' typed config __init__ omits inherited kwargs
        bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
    )
    size = {"shortest_edge": 56 * 56, "longest_edge": 112 * 84}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(size=size),
        chat_template=chat_template("<|vision_start|><|video_pad|><|vision_end|>"),
    )
    return _seeded(lambda: Qwen2_5_VLForConditionalGeneration(config)), processor


def tiny_llava_onevision(num_layers: int = 10, max_positions: int = 32768):
    """(model, processor) of a random-weight LLaVA-OneVision with ``num_layers`` decoder layers."""
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, LlavaOnevisionProcessor
    from transformers.models.llava_onevision.image_processing_llava_onevision import (
        LlavaOnevisionImageProcessor,
    )
    from transformers.models.llava_onevision.video_processing_llava_onevision import (
        LlavaOnevisionVideoProcessor,
    )

    tokenizer = make_tokenizer(LLAVA_SPECIALS)
    ids = tokenizer.convert_tokens_to_ids
    image_size, patch = 56, 14  # 4×4 patches, pooled to 2×2 = 4 tokens per frame
    config = LlavaOnevisionConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=image_size, patch_size=patch,
        ),
        text_config=dict(
            model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4},
            bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
        ),
        image_token_id=ids("<image>"), video_token_id=ids("<video>"),
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=[[image_size, image_size]],
    )
    size = {"height": image_size, "width": image_size}
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size=size, image_grid_pinpoints=[[image_size, image_size]]),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size=size),
        num_image_tokens=(image_size // patch) ** 2,
        vision_feature_select_strategy="full",
        chat_template=chat_template("<video>\n"),
    )
    return _seeded(lambda: LlavaOnevisionForConditionalGeneration(config)), processor


def _qwen3_vl_config(moe: bool, num_layers: int, max_positions: int, ids):
    """A tiny Qwen3-VL configuration: interleaved M-RoPE (sections 4, 2, 2 of 8 frequencies), a
    3-block vision tower whose blocks 0 and 1 feed DeepStack, 16-pixel patches merged 2×2."""
    text = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2],
                         "mrope_interleaved": True},
        bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
    )
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
    vision = dict(
        depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0, 1],
    )
    return dict(
        text_config=text, vision_config=vision,
        video_token_id=ids("<|video_pad|>"), image_token_id=ids("<|image_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
    )


def tiny_qwen3_vl(num_layers: int = 10, max_positions: int = 32768, moe: bool = False):
    """(model, processor) of a random-weight Qwen3-VL (``moe``: Qwen3-VL-MoE, 4 experts, top 2).

    Frames keep their area up to 16 cells of 32×32 pixels each (``max_video_tokens``) whatever
    the chunk length, so a chunk's frames are processed exactly as in the whole video. The chat
    template renders the video as the bare ``<|video_pad|>`` that the processor expands into
    ``<t seconds><|vision_start|>cells<|vision_end|>`` per temporal patch.
    """
    import transformers
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    Config: Any = transformers.Qwen3VLMoeConfig if moe else transformers.Qwen3VLConfig
    Model: Any = transformers.Qwen3VLMoeForConditionalGeneration if moe else transformers.Qwen3VLForConditionalGeneration

    tokenizer = make_tokenizer(QWEN_SPECIALS)
    config = Config(**_qwen3_vl_config(moe, num_layers, max_positions, tokenizer.convert_tokens_to_ids))
    size = {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 100_000}
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, patch_size=16),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(size=size, max_video_tokens=16),
        chat_template=chat_template("<|video_pad|>"),
    )
    return _seeded(lambda: Model(config)), processor
