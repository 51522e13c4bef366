"""Families whose config keeps E / top-k in a nested sub-config or under names discovery does not know.

attach() reads E and top-k from the layer's own model's config, then the nested sub-configs (text_config,
thinker_config, ffn_config, ...), then E from the experts' weights and top-k from the router's attributes or,
when nobody says, from the width of the ids at the first forward (the monitor starts then). Every case
here is checked against the zeroed-expert ground truth of test_collectors_exact.py: for each MoE block,
re-run it once per expert with that expert's weights zeroed; the tokens whose output changes are the
tokens routed to it. Models are built from configs that hold only the keys their classes declare
(tiny_models.build_any), the way a real checkpoint's config.json does.
"""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors import attach
from tests.support.tiny_models import MORE, NESTED, NUM_EXPERTS, TOP_K, build, build_any, text_forward

warnings.filterwarnings("ignore", category=UserWarning)


def _per_expert_weights(experts: torch.nn.Module, num_experts: int) -> list[list[torch.Tensor]]:
    """For each expert e, views of the weights that are e's alone: the parameters of child e of a
    ModuleList / ModuleDict of experts, else row block e of every parameter whose leading dim is a multiple
    of E ([E, ...] stacked weights; DBRX's flat [E * F, H])."""
    if isinstance(experts, (torch.nn.ModuleList, torch.nn.ModuleDict)):
        children = list(experts.children())
        assert len(children) == num_experts
        return [[p.data for p in child.parameters()] for child in children]
    params = [p for p in experts.parameters() if p.dim() >= 2 and p.shape[0] % num_experts == 0]
    assert params, "found no per-expert weights to zero"
    return [[p.data.view(num_experts, -1)[e] for p in params] for e in range(num_experts)]


def _truth(block: torch.nn.Module, experts: torch.nn.Module, num_experts: int, args, kwargs) -> list[int]:
    """int [E]: the tokens whose block output changes when expert e's weights are zeroed. The output is read
    as [tokens, hidden] with the input's hidden size (Ernie-VL's block returns its output flattened)."""
    hidden = (args[0] if args else kwargs["hidden_states"]).shape[-1]

    def run() -> torch.Tensor:
        out = block(*copy.deepcopy(args), **copy.deepcopy(kwargs))  # a cache in kwargs is not grown
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(-1, hidden)

    base = run()
    assert torch.equal(base, run()), "the block must be deterministic for this test to mean anything"
    truth = []
    for weights in _per_expert_weights(experts, num_experts):
        saved = [w.clone() for w in weights]
        for w in weights:
            w.zero_()
        truth.append(int((run() != base).any(dim=-1).sum()))
        for w, s in zip(weights, saved):
            w.copy_(s)
    return truth


def _block_and_experts(model: torch.nn.Module, layer) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the MoE block to re-run: the hooked module's parent, the module holding the routed experts' weights)."""
    block = model.get_submodule(layer.name.rsplit(".", 1)[0])
    experts = {"llama4": lambda: block.experts, "jetmoe": lambda: block.output_linear,
               "doge": lambda: block.up_embed}.get(layer.kind, lambda: layer.module)()
    return block, experts


def _check_exact(model: torch.nn.Module, monitor, forward) -> np.ndarray:
    """Run forward() under the monitor, close it (the ground truth re-runs the blocks) and compare every
    layer that ran with the ground truth; returns the counts."""
    blocks = {layer.name: _block_and_experts(model, layer)[0] for layer in monitor.layers}
    captured, handles = {}, []
    for name, block in blocks.items():
        def grab(module, args, kwargs, name=name):  # deep copies: the forward goes on mutating its cache
            captured[name] = (copy.deepcopy(args), copy.deepcopy(kwargs))
        handles.append(block.register_forward_pre_hook(grab, with_kwargs=True))
    with torch.no_grad():
        forward()
        counts = monitor.counts()
        assert monitor.stats()["last_error"] == ""
        monitor.close()
        for h in handles:
            h.remove()
        ran = 0
        for row, layer in enumerate(monitor.layers):
            if layer.name not in captured:
                assert counts[row].sum() == 0
                continue
            ran += 1
            args, kwargs = captured[layer.name]
            truth = _truth(*_block_and_experts(model, layer), monitor.num_experts, args, kwargs)
            assert counts[row].tolist() == truth, layer.name
    assert ran and counts.sum() > 0
    return counts


def _text_call(model: torch.nn.Module, input_ids: torch.Tensor):
    """forward() for _check_exact: tiny_models.text_forward (text only, no cache)."""
    return lambda: text_forward(model, input_ids)


@pytest.mark.parametrize("family", NESTED + MORE)
def test_nested_config_families_count_exactly(family):
    """tiny_models.NESTED: gemma4 / gemma4_text / diffusion_gemma (top_k_experts), dbrx (ffn_config) and
    switch_transformers (no top-k; a dispatch mask) were refused before; MORE: families new to the tests."""
    model = build_any(family)
    monitor = attach(model, sample_tokens=0, nvml=False)
    assert monitor.num_experts == NUM_EXPERTS
    assert monitor.top_k == (1 if family == "switch_transformers" else TOP_K)  # Switch routes top-1
    ids = torch.randint(3, 90, (3, 7), generator=torch.Generator().manual_seed(7))
    _check_exact(model, monitor, _text_call(model, ids))


def test_only_the_text_model_of_a_composite_model_is_counted():
    """dots3_note's vision encoder routes to 4 experts of its own, Qwen3-Omni's talker to experts of its
    own: the monitor holds the text model's layers, all of E = 8."""
    for family, other in (("dots3_note", "vision"), ("qwen3_omni_moe", "talker")):
        model = build_any(family)
        hooked = [n for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]
        assert any(other in name for name in hooked), f"{family} has no {other} experts to leave out"
        monitor = attach(model, sample_tokens=0, nvml=False)
        assert monitor.layers and all(other not in layer.name for layer in monitor.layers)
        assert monitor.num_experts == NUM_EXPERTS
        monitor.close()


def test_switch_capacity_dropped_tokens_are_not_counted():
    """Switch's experts receive a one-hot dispatch mask, not ids; a token over an expert's capacity has no 1
    and is computed by no expert. With capacity 2 most of 21 tokens are dropped: still exact."""
    model = build_any("switch_transformers", expert_capacity=2)
    monitor = attach(model, sample_tokens=0, nvml=False)
    assert {layer.kind for layer in monitor.layers} == {"switch"} and monitor.top_k == 1
    ids = torch.randint(3, 90, (3, 7), generator=torch.Generator().manual_seed(7))
    counts = _check_exact(model, monitor, _text_call(model, ids))
    assert counts.sum(axis=1).max() < 21


# ---------------------------------------------------------------------- names nobody knows
class _Wrapped(torch.nn.Module):
    """The block's own router, one level down: its attributes (top_k) are out of discovery's sight."""

    def __init__(self, router: torch.nn.Module):
        super().__init__()
        self.inner = router

    def forward(self, hidden_states: torch.Tensor):
        return self.inner(hidden_states)


def _unknown_names(family: str = "qwen3_moe", seed: int = 0) -> torch.nn.Module:
    """A tiny Qwen3-MoE whose config keeps E and top-k under names no discovery knows, and whose router's
    top_k attribute is out of sight: E must come from the experts' weights, k from the ids."""
    model = build(family, seed=seed)
    config = model.config
    for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok",
                "moe_topk", "top_k"):
        config.__dict__[key] = None  # not popped: that would uncover the config class's default
    config.__dict__["experts_in_this_checkpoint"] = NUM_EXPERTS   # a name from a remote-code model
    config.__dict__["experts_every_token_visits"] = TOP_K
    for layer in model.model.layers:
        layer.mlp.gate = _Wrapped(layer.mlp.gate)
    return model


def test_unknown_config_names_count_exactly_from_weights_and_ids():
    model = _unknown_names()
    assert getattr(model.config, "num_experts", None) is None and getattr(model.config, "top_k", None) is None
    monitor = attach(model, sample_tokens=4, sample_every=1, nvml=False)
    assert all(layer.num_experts_from == "weights" and layer.top_k is None for layer in monitor.layers)
    assert monitor.num_experts == NUM_EXPERTS and monitor.top_k == 0 and not monitor.started
    assert monitor.counts().shape == (len(monitor.layers), NUM_EXPERTS) and monitor.counts().sum() == 0
    assert monitor.stats()["steps"] == 0
    ids = torch.randint(3, 90, (3, 7), generator=torch.Generator().manual_seed(7))
    counts = _check_exact(model, monitor, lambda: model(input_ids=ids))
    assert monitor.started and monitor.top_k == TOP_K and monitor.step == 1
    assert counts.sum() == 21 * TOP_K * len(monitor.layers)


def test_top_k_from_ids_applies_the_first_steps_padding_mask(redis_server, redis_url):
    """The step that starts the monitor began before k was known: its padding mask and token count still
    apply; the published metadata carries the k read from the ids, and every step is published."""
    model = _unknown_names()
    taps: list[torch.Tensor] = []
    for module in model.modules():
        if type(module).__name__.endswith("Experts"):
            module.register_forward_pre_hook(lambda m, a: taps.append(a[1].clone()))
    monitor = attach(model, redis_url=redis_url, run="lazyk", sample_tokens=4, sample_every=1, nvml=False)
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding: 4 pad tokens in row 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model(input_ids=ids, attention_mask=mask)
    monitor.close()
    real = mask.reshape(-1).bool()
    layers = len(monitor.layers)
    expected = np.stack([np.bincount(taps[i][real].reshape(-1), minlength=NUM_EXPERTS) for i in range(layers)])
    assert monitor.counts().tolist() == (2 * expected).tolist()
    client = redis_server.client()
    meta = core.decode_meta(client.get(core.meta_key("lazyk")))
    assert meta.top_k == TOP_K and meta.num_experts == NUM_EXPERTS and meta.layer_names == monitor.layer_names
    records = [core.decode_step(fields) for _, fields in client.xrange(core.steps_key("lazyk"))]
    assert [r.step for r in records] == [0, 1] and [r.tokens for r in records] == [8, 8]
    for rec in records:
        assert rec.counts_LE.tolist() == expected.tolist()
        assert rec.sample_ids_LNK is not None and rec.sample_ids_LNK.shape[2] == TOP_K


def test_a_layer_of_another_width_is_counted_exactly():
    """A layer whose ids are wider than the monitor's k (its own top-k, or a router attribute the model
    does not use) goes through the validity-mask path: the same counts, padding still excluded."""
    model = build("qwen3_moe")
    monitor = attach(model, sample_tokens=4, nvml=False)
    second = model.model.layers[1].mlp.gate
    second.top_k = 3  # layer 1 now routes each token to 3 experts; the monitor's k stays 2
    taps: list[torch.Tensor] = []
    for module in model.modules():
        if type(module).__name__.endswith("Experts"):
            module.register_forward_pre_hook(lambda m, a: taps.append(a[1].clone()))
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    real = mask.reshape(-1).bool()
    assert taps[1].shape[1] == 3
    for row, tap in enumerate(taps):
        assert monitor.counts()[row].tolist() == np.bincount(tap[real].reshape(-1), minlength=NUM_EXPERTS).tolist()
    assert monitor.stats()["last_error"] == ""
    monitor.close()


def test_a_start_that_fails_never_reaches_the_forward(tmp_path):
    """The monitor starts inside the first MoE layer's call; when that fails (here: the trace file cannot be
    opened), the model runs on uncounted and the failure is reported, under warnings as errors too."""
    model = _unknown_names()
    blocker = tmp_path / "file"
    blocker.write_text("")
    monitor = attach(model, sample_tokens=0, nvml=False, trace_path=str(blocker / "trace.jsonl"))
    ids = torch.randint(3, 90, (1, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            out = model(input_ids=ids)
            model(input_ids=ids)
    assert out.logits.shape == (1, 4, 96)
    stats = monitor.stats()
    assert not monitor.started and stats["hook_errors"] == 1 and "start with top_k=2" in stats["last_error"]
    assert monitor.counts().sum() == 0
    monitor.close()


def test_attach_still_refuses_a_bad_option_before_the_first_forward():
    """With k read from the ids, what attach() refuses up front is still refused up front."""
    with pytest.raises(TypeError):
        attach(_unknown_names(), sample_token=3)
    with pytest.raises(ValueError):
        attach(_unknown_names(), redis_url="http://127.0.0.1:6379/0")


@pytest.mark.slow  # torch.compile: the first compiled call takes tens of seconds
def test_top_k_from_ids_under_torch_compile():
    """Attached before compiling, the monitor starts inside the first compiled call (outside the graph);
    the counts equal eager ones, and the steps after the warm-up do not recompile."""
    import torch._dynamo.utils as dynamo_utils
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(2))
    eager = _unknown_names()
    expected = attach(eager, nvml=False)
    compiled_model = _unknown_names()
    monitor = attach(compiled_model, sample_tokens=4, sample_every=2, nvml=False)
    compiled = torch.compile(compiled_model)
    with torch.no_grad():
        eager(input_ids=ids)
        for _ in range(3):  # the start, then a sampled step and an unsampled one
            compiled(input_ids=ids)
        frames_after_warmup = dynamo_utils.counters["frames"]["total"]
        for _ in range(4):
            compiled(input_ids=ids)
    assert monitor.started and monitor.top_k == TOP_K and monitor.step == 7
    assert np.array_equal(monitor.counts(), 7 * expected.counts())
    assert monitor.stats()["last_error"] == ""
    assert dynamo_utils.counters["frames"]["total"] == frames_after_warmup, "the hooks made dynamo recompile"
    monitor.close()
    expected.close()


def test_a_vision_encoders_expert_count_is_never_taken_for_the_text_model():
    """dots3_note's text config without its expert count: E comes from the text experts' weights (8), not
    from the vision encoder's config (4 experts of its own), and the counts are exact."""
    model = build_any("dots3_note")
    text = model.get_submodule("model.language_model").config
    for key in ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"):
        text.__dict__[key] = None
    assert model.config.vision_config.num_local_experts == 4
    monitor = attach(model, sample_tokens=0, nvml=False)
    assert monitor.num_experts == NUM_EXPERTS
    assert all(layer.num_experts_from == "weights" for layer in monitor.layers)
    ids = torch.randint(3, 90, (3, 7), generator=torch.Generator().manual_seed(7))
    _check_exact(model, monitor, _text_call(model, ids))
