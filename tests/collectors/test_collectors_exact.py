"""Counts are exact: checked against an independent ground truth that never looks at the router.

For every MoE block we capture its input during the monitored forward, then re-run the block once per
expert with that expert's weights zeroed: the tokens whose output changes are exactly the tokens that
were routed to it (with a non-zero weight). That number must equal the monitor's count.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from moe_monitor.collectors import attach
from tests.support.tiny_models import REQUIRED, STANDARD, build

warnings.filterwarnings("ignore", category=UserWarning)


def _block_and_experts(model, layer):
    """(MoE block to re-run, module whose [E, ...] parameters are the routed experts' weights)."""
    modules = dict(model.named_modules())
    path = layer.name.rsplit(".", 1)[0] if layer.kind in ("standard", "llama4", "jetmoe", "doge") else None
    block = modules[path]
    if layer.kind == "standard":
        return block, layer.module
    if layer.kind == "llama4":
        return block, block.experts
    if layer.kind == "jetmoe":
        return block, block.output_linear
    return block, block.up_embed  # doge: down_embed's parent is the DogeCDMoE block


def _truth_counts(block, experts, num_experts, args, kwargs) -> torch.Tensor:
    """int64 [E]: tokens whose block output changes when expert e's weights are zeroed."""
    def run():
        out = block(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(-1, out.shape[-1])

    base = run()
    assert torch.equal(base, run()), "the block must be deterministic for this test to mean anything"
    truth = torch.zeros(num_experts, dtype=torch.int64)
    params = [p for p in experts.parameters() if p.dim() >= 1 and p.shape[0] >= num_experts]
    assert params, "found no per-expert weights to zero"
    for e in range(num_experts):
        saved = [p.data[e].clone() for p in params]
        for p in params:
            p.data[e].zero_()
        changed = (run() != base).any(dim=-1)
        for p, s in zip(params, saved):
            p.data[e].copy_(s)
        truth[e] = int(changed.sum())
    return truth


def _capture_block_inputs(model, blocks):
    captured, handles = {}, []
    for name, block in blocks.items():
        def hook(module, args, kwargs, name=name):
            captured[name] = (tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args), dict(kwargs))
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    return captured, handles


@pytest.mark.parametrize("family", REQUIRED + STANDARD)
def test_counts_match_zeroed_expert_ground_truth(family):
    model = build(family)
    monitor = attach(model, sample_tokens=0)
    blocks = {layer.name: _block_and_experts(model, layer) for layer in monitor.layers}
    captured, handles = _capture_block_inputs(model, {n: b for n, (b, _) in blocks.items()})
    input_ids = torch.randint(3, 90, (3, 7), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        model(input_ids=input_ids)
        counts = monitor.counts()
        assert monitor.stats()["last_error"] == ""
        for h in handles:
            h.remove()
        monitor.close()
        assert counts.shape == (len(monitor.layers), monitor.num_experts)
        for row, layer in enumerate(monitor.layers):
            block, experts = blocks[layer.name]
            args, kwargs = captured[layer.name]
            truth = _truth_counts(block, experts, monitor.num_experts, args, kwargs)
            assert counts[row].tolist() == truth.tolist(), f"{family} {layer.name}"
    # every family routes 21 tokens; each takes top-k slots minus those that went to skip/zero experts
    assert counts.sum(axis=1).max() <= 21 * monitor.top_k
    assert counts.sum() > 0


def test_deepseek_v3_counts_differ_from_unbiased_topk():
    """The ground truth above holds for DeepSeek-V3's biased, group-limited router, where top-k of the
    router logits would be wrong: prove the two really differ on this model."""
    model = build("deepseek_v3")
    monitor = attach(model, sample_tokens=0)
    logits = []
    gate = model.model.layers[0].mlp.gate
    h = gate.register_forward_hook(lambda m, a, out: logits.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        model(input_ids=torch.randint(3, 90, (4, 16), generator=torch.Generator().manual_seed(3)))
    h.remove()
    naive = torch.bincount(torch.topk(logits[0], monitor.top_k, dim=-1).indices.reshape(-1),
                           minlength=monitor.num_experts)
    assert naive.tolist() != monitor.counts()[0].tolist()
    monitor.close()


def test_masked_families_skip_zero_compute_and_skip_slots():
    """LongCat's zero-compute experts and ZAYA's weight-0 skip slot never reach the counts."""
    model = build("longcat_flash")
    with torch.no_grad():
        model.model.layers[0].mlp.router.e_score_correction_bias[8] = 10.0  # zero-compute expert 8 in every top-2
    monitor = attach(model, sample_tokens=0)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 90, (2, 5)))
    assert monitor.stats()["last_error"] == ""
    assert monitor.counts().shape[1] == 8
    assert monitor.counts().sum(axis=1).tolist() == [10] * len(monitor.layers)  # one real expert per token
    monitor.close()

    model = build("zaya")
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None) if hasattr(layer, "mlp") else None
            if gate is not None:
                gate.balancing_biases[-1] = 50.0  # the skip slot wins every top-1
    monitor = attach(model, sample_tokens=0)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 90, (2, 5)))
    assert monitor.stats()["last_error"] == ""
    assert monitor.counts().sum() == 0
    monitor.close()
