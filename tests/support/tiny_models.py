"""Tiny transformers MoE models with random weights, built from each family's own config class.

SMALL holds sizes that every family reads under one name or another; FAMILY adds what a family needs.
"""
from __future__ import annotations

import dataclasses
import inspect

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

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


# ---------------------------------------------------------------------------------------------------------
# Any family, nested configs included, with configs a real checkpoint could carry.
#
# build() above passes SMALL whole: a config keeps keys it does not know as plain attributes, so discovery
# can find "top_k" on a family whose real config has no such field. build_any() passes only the keys the
# config class declares (its fields and attribute_map), puts the MoE sizes into whichever sub-config holds
# them (text_config, thinker_config.text_config, ffn_config, ...) and shrinks every other sub-config
# (vision, audio) so the model builds in seconds.

_EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_SHRINK = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, depth=1, num_layers=1, n_layers=1,
               num_attention_heads=4, num_heads=4, num_key_value_heads=4, head_dim=8, embed_dim=32, d_model=32,
               out_hidden_size=32, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32,
               encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=48, decoder_layers=1,
               decoder_attention_heads=4, decoder_ffn_dim=48, output_dim=32, text_hidden_size=32,
               num_mel_bins=16, n_window=8, downsample_hidden_size=8, ffn_hidden_size=48, vocab_size=96)
# Per model type: sizes a (sub-)config needs on top of SMALL (the MoE part) or _SHRINK (anything else).
NESTED_FAMILY: dict[str, dict] = {
    "dbrx": dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=128, vocab_size=96),
    "dbrx_ffn": dict(hidden_size=32, ffn_hidden_size=16, moe_num_experts=NUM_EXPERTS, moe_top_k=TOP_K),
    "dbrx_attn": dict(kv_n_heads=2),
    "gemma4_text": dict(enable_moe_block=True, num_experts=NUM_EXPERTS, top_k_experts=TOP_K,
                        layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0,
                        hidden_size_per_layer_input=0, vocab_size_per_layer_input=96),
    "diffusion_gemma_text": dict(num_experts=NUM_EXPERTS, top_k_experts=TOP_K,
                                 layer_types=["sliding_attention", "full_attention"]),
}


def _fields(config_cls: type) -> set[str]:
    """The keys config_cls declares: its dataclass fields and its attribute_map's aliases."""
    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set(
        inspect.signature(config_cls.__init__).parameters)
    return names | set(getattr(config_cls, "attribute_map", {}) or {})


def _holds_experts(config: PretrainedConfig) -> bool:
    """True when config itself (not a sub-config) declares an expert-count field."""
    return any(key in _fields(type(config)) for key in _EXPERT_FIELDS)


def tiny_overrides(config: PretrainedConfig, **overrides) -> dict:
    """The keyword arguments that make `config` (a default instance of its class) tiny: SMALL's MoE sizes
    when it declares an expert count, _SHRINK otherwise, NESTED_FAMILY per model type, and the same for each
    sub-config, recursively (passed as dicts, with their model_type where the parent takes any AutoConfig)."""
    cls, fields = type(config), _fields(type(config))
    base = SMALL if _holds_experts(config) else _SHRINK
    kwargs = {k: v for k, v in base.items() if k in fields}
    kwargs.update(FAMILY.get(config.model_type, {}))
    kwargs.update(NESTED_FAMILY.get(config.model_type, {}))
    for name in getattr(cls, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if isinstance(sub, PretrainedConfig):
            kwargs[name] = {"model_type": sub.model_type, **tiny_overrides(sub)} if sub.model_type else \
                tiny_overrides(sub)
    kwargs.update(overrides)
    return kwargs


def tiny_config(model_type: str, **overrides) -> PretrainedConfig:
    """A tiny config of model_type with only the keys its classes declare (see tiny_overrides)."""
    default = AutoConfig.for_model(model_type)
    return AutoConfig.for_model(model_type, **tiny_overrides(default, **overrides))


_AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModelForMultimodalLM",
                 "AutoModelForSeq2SeqLM", "AutoModel")


def build_any(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random-weight model of model_type (the causal LM, else the image-text-to-text or multimodal
    model, else the bare model), in eval mode, float32 on the CPU, from tiny_config()."""
    import transformers
    config = tiny_config(model_type, **overrides)
    errors = []
    for auto_name in _AUTO_CLASSES:
        auto = getattr(transformers, auto_name, None)
        if auto is None or type(config) not in auto._model_mapping:
            continue
        torch.manual_seed(seed)
        try:
            model = auto.from_config(config, dtype=torch.float32).eval()
        except Exception as exc:  # noqa: BLE001 - try the next head
            errors.append(f"{auto_name}: {type(exc).__name__}: {exc}")
            continue
        _randomise_biases(model)
        return model
    raise ValueError(f"{model_type}: no auto class builds it: {errors or 'none maps its config'}")


_LANGUAGE_PARTS = ("language_model", "thinker", "text_model", "model.language_model", "model")


def text_forward(model: torch.nn.Module, input_ids: torch.Tensor) -> object:
    """Run model on text only (input_ids [B, S]); a multimodal model that refuses it gets the call on its
    language model part (the first of _LANGUAGE_PARTS that takes it). Raises the first error if none does."""
    try:
        return model(input_ids=input_ids)
    except Exception as first:  # noqa: BLE001
        for path in _LANGUAGE_PARTS:
            try:
                part = model.get_submodule(path)
            except AttributeError:
                continue
            try:
                return part(input_ids=input_ids)
            except Exception:  # noqa: BLE001, S112
                continue
        raise first
