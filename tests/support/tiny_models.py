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
# Per model type (or config class, for sub-configs without one): what a (sub-)config needs on top of SMALL (the
# MoE part) or _SHRINK (anything else): two layers that both route (and attend), sizes that fit each other.
_HYBRID = dict(layer_types=["linear_attention", "full_attention"])
NESTED_FAMILY: dict[str, dict] = {
    "DbrxConfig": dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=128, vocab_size=96),
    "DbrxFFNConfig": dict(hidden_size=32, ffn_hidden_size=16, moe_num_experts=NUM_EXPERTS, moe_top_k=TOP_K),
    "DbrxAttentionConfig": dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),  # real attn_configs have both
    "gemma4_text": dict(enable_moe_block=True, num_experts=NUM_EXPERTS, top_k_experts=TOP_K,
                        layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0,
                        hidden_size_per_layer_input=0, vocab_size_per_layer_input=96),
    "diffusion_gemma_text": dict(num_experts=NUM_EXPERTS, top_k_experts=TOP_K,
                                 layer_types=["sliding_attention", "full_attention"]),
    "qwen3_next": _HYBRID, "qwen3_5_moe_text": _HYBRID, "qwen3_5_moe": _HYBRID,
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=1, expert_layer_offset=0),
    "kimi_linear": dict(_HYBRID, mlp_layer_types=["sparse", "sparse"], num_key_value_heads=4, kv_lora_rank=16,
                        q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, linear_head_dim=8,
                        linear_num_heads=4, n_group=1, topk_group=1),
    "bailing_hybrid": dict(_HYBRID, mlp_layer_types=["sparse", "sparse"], n_group=1, topk_group=1,
                           num_key_value_heads=4),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=0),
    "nemotron_h": dict(layer_types=["full_attention", "moe", "linear_attention", "moe"], num_hidden_layers=4,
                       mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=1),
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"], mamba_n_heads=4, mamba_d_head=16,
                             mamba_n_groups=1, mamba_d_state=8),
    "glm4v_moe_text": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0]}),
    "ernie4_5_vl_moe_text": dict(moe_intermediate_size=[16, 16], mlp_layer_types=["sparse", "sparse"],
                                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0,
                                                  "mrope_section": [1, 1, 2]}),
    "dots3_note_text": dict(num_key_value_heads=4, mlp_layer_types=["sparse", "sparse"]),
    "glm5_next_text": dict(num_key_value_heads=4, layer_types=["linear_attention", "indexed_attention"],
                           mlp_layer_types=["sparse", "sparse"]),
    "qwen4_exp_text": dict(layer_types=["linear_attention", "indexed_attention"], indexer_budget=8,
                           indexer_compress_ratio=2, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8),
    "beam": dict(mlp_layer_types=["sparse", "sparse"], layer_types=["sliding_attention", "full_attention"],
                 n_group=1, topk_group=1),
    "step3p5": dict(mlp_layer_types=["sparse", "sparse"], sliding_window=16),
    "muse_spark_audio": dict(hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1], num_hidden_layers=4,
                             out_hidden_size=32),
    # a vision encoder with experts of its own (fewer than the text model's): attach() counts the text model
    "dots3_note_vision_encoder": dict(num_hidden_layers=2, mlp_layer_types=["dense", "sparse"],
                                      num_local_experts=4, num_experts_per_tok=2, per_layer_config={},
                                      moe_intermediate_size=16, adapter_in_dim=32, adapter_out_dim=32),
    "Qwen3OmniMoeTalkerConfig": dict(spatial_merge_size=2),  # a real talker config carries it
    "dots3_note_audio_encoder": dict(adapter_input_size=32, adapter_out_dim=32),
    "deepseek_ocr2_text": dict(mlp_layer_types=["sparse", "sparse"]),
    "qwen3_omni_moe_talker_text": dict(shared_expert_intermediate_size=16),  # a real talker config carries it
    "switch_transformers": dict(d_model=32, d_ff=48, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2,
                                num_sparse_encoder_layers=2, num_sparse_decoder_layers=2, expert_capacity=64,
                                vocab_size=96, decoder_start_token_id=0),
}
for _mla in ("axk1", "mistral_large4_text", "sarvam_mla"):
    NESTED_FAMILY[_mla] = dict(FAMILY["deepseek_v3"])
# Families of tests/collectors/test_collectors_nested.py, built with build_any() and run on text only.
# NESTED: the MoE sizes sit in a sub-config (text_config, thinker_config, ffn_config) of a composite model,
# or under a name discovery did not know (gemma4's top_k_experts); switch_transformers has no top-k at all.
NESTED = ["gemma4", "gemma4_text", "diffusion_gemma", "dbrx", "switch_transformers", "qwen3_vl_moe",
          "qwen3_5_moe", "qwen3_omni_moe", "qwen3_omni_moe_thinker", "llama4", "ernie4_5_vl_moe", "glm4v_moe",
          "glm5_next", "kimi_k25", "aria", "dots3_note", "minimax_m3_vl", "hy_v4_vl", "mistral_large4",
          "step3p7", "deepseek_ocr2", "inkling2", "inkling2_loop", "muse_spark", "qwen4_exp", "unlimited_ocr"]
# MORE: top-level MoE configs (hybrid attention, MLA, ...) that build tiny only with NESTED_FAMILY's sizes.
MORE = ["axk1", "bailing_hybrid", "beam", "dots3_note_text", "glm4v_moe_text", "glm5_next_text",
        "granitemoehybrid", "hy_v4_vl_text", "inkling_text", "inkling2_text", "inkling2_loop_text", "jamba",
        "kimi_linear", "lfm2_moe", "minimax_m3_vl_text", "mistral4", "mistral_large4_text", "muse_spark_text",
        "nemotron_h", "openai_privacy_filter", "qwen3_5_moe_text", "qwen3_next", "qwen3_vl_moe_text",
        "qwen4_exp_text", "sarvam_mla", "sarvam_moe"]


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
    sub-config, recursively (passed as dicts, with their model_type: a parent whose sub-config may be any
    AutoConfig needs it)."""
    cls, fields = type(config), _fields(type(config))
    base = SMALL if _holds_experts(config) else _SHRINK
    kwargs = {k: v for k, v in base.items() if k in fields}
    kwargs.update(FAMILY.get(config.model_type, {}))
    kwargs.update(NESTED_FAMILY.get(config.model_type) or NESTED_FAMILY.get(cls.__name__, {}))
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
    """A tiny random-weight model of model_type, in eval mode, float32 on the CPU, from tiny_config(): the
    causal LM (for a composite config: the image-text-to-text or multimodal model first), else the bare
    model."""
    import transformers
    config = tiny_config(model_type, **overrides)
    order = list(_AUTO_CLASSES)
    if not _holds_experts(config):  # the experts are in a sub-config: the whole multimodal model
        order = ["AutoModelForImageTextToText", "AutoModelForMultimodalLM"] + [
            name for name in order if name not in ("AutoModelForImageTextToText", "AutoModelForMultimodalLM")]
    errors = []
    for auto_name in order:
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
# Models whose text-only call fails after their language model ran (Llama4ForConditionalGeneration reads
# image outputs it never made): called on that part directly, so that no layer runs twice.
TEXT_PART = {"llama4": "language_model"}


def text_forward(model: torch.nn.Module, input_ids: torch.Tensor) -> object:
    """Run model on text only (input_ids [B, S]; an encoder-decoder gets them as its decoder's input too),
    without a cache (a test that re-runs a block must not grow it); a multimodal model that refuses it gets
    the call on its language model part (the first of _LANGUAGE_PARTS that takes it). Raises the first
    error if none does."""
    extra = {"decoder_input_ids": input_ids} if getattr(model.config, "is_encoder_decoder", False) else {}
    part = TEXT_PART.get(getattr(model.config, "model_type", ""))
    if part is not None:
        return model.get_submodule(part)(input_ids=input_ids, use_cache=False)
    try:
        return model(input_ids=input_ids, use_cache=False, **extra)
    except Exception as first:  # noqa: BLE001
        for path in _LANGUAGE_PARTS:
            try:
                part = model.get_submodule(path)
            except AttributeError:
                continue
            try:
                return part(input_ids=input_ids, use_cache=False)
            except Exception:  # noqa: BLE001, S112
                continue
        raise first
