"""A real transformers DeepSeek-V3 with random weights in DeepSeek-V3's routing shape, small enough for a CPU:
256 routed experts, top-8, n_group 8, topk_group 4, one shared expert, a dense first layer, tiny widths.
Other dimensions (the cost-model bench's large experts) keep the rest; other expert counts route plain top-k."""
from __future__ import annotations

from typing import Any

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

VOCAB = 1024
# The model the tiny one stands in for, declared in the demos' run metadata: the cost model prices DeepSeek-V3's
# experts (fp8 weights, bf16 activations) on H100s, so the figures in time are "predicted for H100 SXM, ..."
IMITATED_SIZES: dict[str, Any] = {"hidden_size": 7168, "moe_intermediate_size": 2048, "expert_matrices": 3, "dtype_bytes": 1,
                                  "act_dtype_bytes": 2}
GPU_PROFILE = "H100 SXM"


def build_model(moe_layers: int = 4, seed: int = 0, hidden_size: int = 64, moe_intermediate_size: int = 32,
                num_experts: int = 256, top_k: int = 8) -> DeepseekV3ForCausalLM:
    groups, top_groups = (8, 4) if num_experts == 256 else (1, 1)  # group-limited routing: DeepSeek-V3's only
    # head_dim is a transformers 5 config field the class signature does not list (mypy sees the signature)
    config = DeepseekV3Config(  # type: ignore[call-arg]
        vocab_size=VOCAB, hidden_size=hidden_size, intermediate_size=128, moe_intermediate_size=moe_intermediate_size,
        num_hidden_layers=moe_layers + 1, first_k_dense_replace=1, n_routed_experts=num_experts,
        num_experts_per_tok=top_k, n_group=groups, topk_group=top_groups, n_shared_experts=1,
        routed_scaling_factor=2.5, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=64,
        qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, head_dim=16, max_position_embeddings=512,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    tiny = (hidden_size, moe_intermediate_size, num_experts, top_k) == (64, 32, 256, 8)
    config.name_or_path = "demo/deepseek-v3-tiny-random" if tiny else (
        f"demo/deepseek-v3-random-h{hidden_size}-i{moe_intermediate_size}-e{num_experts}-k{top_k}")
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():  # routers of trained models are decisive; the 0.02 init std leaves every score ~0.5
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.weight.normal_(0.0, 1.5 / config.hidden_size ** 0.5)
    return model
