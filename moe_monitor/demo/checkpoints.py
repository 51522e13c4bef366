"""Tiny MoE checkpoints with random weights, written with save_pretrained for vLLM to load (float32, no
tokenizer: prompts travel as token ids). Two families vLLM runs on the CPU: Qwen3-MoE and Mixtral."""
from __future__ import annotations

from pathlib import Path

import torch

# attention head_dim 32: vLLM's CPU attention kernels take 32, 64, 80, 96, 112, 128, 256 (not 16)
_COMMON = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=32, max_position_embeddings=256, tie_word_embeddings=False)


def write_checkpoint(family: str, path: Path, seed: int = 0) -> Path:
    """Save a tiny `family` ("qwen3_moe" or "mixtral") model with random weights into path."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    if family == "qwen3_moe":
        config = Qwen3MoeConfig(**_COMMON, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                                mlp_only_layers=[])
        model = Qwen3MoeForCausalLM(config)
    elif family == "mixtral":
        config = MixtralConfig(**_COMMON, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)
        model = MixtralForCausalLM(config)
    else:
        raise ValueError(f"unknown family {family!r}")
    model.to(torch.float32).save_pretrained(path)
    return path
