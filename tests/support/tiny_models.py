"""Tiny transformers MoE models with random weights, built from each family's own config class.

SMALL holds sizes that every family reads under one name or another; FAMILY adds what a family needs.
"""
from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

NUM_EXPERTS, TOP_K = 8, 2
SMALL = dict(
    vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
    num_experts=NUM_EXPERTS, n_routed_experts=NUM_EXPERTS, num_local_experts=NUM_EXPERTS,
    moe_num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K, moe_topk=TOP_K, top_k=TOP_K,
    first_k_dense_replace=0, decoder_sparse_step=1, mlp_only_layers=[], moe_layer_freq=1,
    n_shared_experts=1, shared_expert_intermediate_size=16, tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, layer_types=None, use_cache=True,
)
FAMILY = {
    "deepseek_v2": dict(kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=8, num_key_value_heads=4, n_group=2, topk_group=1, topk_method="group_limited_greedy"),
    "deepseek_v3": dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=8, num_key_value_heads=4, n_group=4, topk_group=2),
    "gpt_oss": dict(num_local_experts=NUM_EXPERTS, layer_types=["full_attention", "full_attention"],
                    sliding_window=16),
    "llama4_text": dict(intermediate_size_mlp=48, interleave_moe_layer_step=1, no_rope_layers=[1, 1],
                        attention_chunk_size=64, layer_types=["full_attention", "full_attention"]),
    "jetmoe": dict(kv_channels=8, num_key_value_heads=2, num_local_experts=NUM_EXPERTS),
    "doge": dict(num_experts=16, n_routed_experts=16, num_local_experts=16, moe_num_experts=16, is_moe=True),
    "zaya": dict(num_experts_per_tok=1, top_k=1),
    "longcat_flash": dict(zero_expert_num=2, expert_ffn_hidden_size=16, ffn_hidden_size=48, kv_lora_rank=16,
                          q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4,
                          num_layers=1),
}
for _mla in ("deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "axk2"):
    FAMILY[_mla] = dict(FAMILY["deepseek_v3"])
# Families the exact-count test must cover (the list plus the adapters).
REQUIRED = ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss",
            "llama4_text", "jetmoe", "doge", "zaya", "longcat_flash"]
# Every other transformers 5 family with the standard experts signature that builds tiny from SMALL.
STANDARD = ["afmoe", "aria_text", "cohere2_moe", "deepseek_v4", "dots1", "ernie4_5_moe", "exaone_moe",
            "flex_olmo", "flint", "glm4_moe", "granitemoe", "granitemoe_swa", "granitemoeshared", "hunyuan_v1_moe",
            "hy_v3", "hy_v4", "kolibri1", "laguna", "lara_mini", "mellum", "mimo_v2_flash", "minimax", "minimax_m2",
            "phimoe", "solar_open", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "axk2"]


def build(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random-weight causal LM of model_type, in eval mode, float32 on the CPU."""
    kwargs = {**SMALL, **FAMILY.get(model_type, {}), **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomise_biases(model)
    return model


def _randomise_biases(model: torch.nn.Module) -> None:
    """Routing state that checkpoints carry starts at zero; make it look trained: score-correction biases
    that matter, and DeepSeek-V4's token -> experts hash table with k distinct experts per token."""
    gen = torch.Generator().manual_seed(1)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.rand(buf.shape, generator=gen) * 0.5)
        elif name.endswith("tid2eid"):
            num_experts = getattr(model.config.get_text_config(), "n_routed_experts", NUM_EXPERTS)
            rows = torch.rand(buf.shape[0], num_experts, generator=gen).argsort(dim=1)[:, : buf.shape[1]]
            buf.copy_(rows)
