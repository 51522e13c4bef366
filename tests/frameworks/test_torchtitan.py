"""The torchtitan collector on real torchtitan (0.3.0) training on the CPU: exact against a black-box truth.

A tiny DeepSeek-V3 built by torchtitan's own builders (tests/frameworks/torchtitan_support.py) trains for a few
iterations (micro-batches of forward + backward, then torchtitan's OptimizersContainer step with its
expert-bias pre-hook); the monitor publishes one step per iteration (phase "train") into a private
redis-server, and each step's counts, read back, equal the truth of that iteration's forwards.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.collectors.torchtitan import attach, find_moe_layers
from tests.frameworks import torchtitan_support as tt
from tests.support.published import published_steps

warnings.filterwarnings("ignore", category=UserWarning)  # torchtitan's router: "In CPU autocast, ..."


def test_every_training_iteration_is_one_exact_train_step_in_redis(redis_url):
    model = tt.build_model(seed=0)
    optimizers = tt.build_optimizers(model)
    truth = tt.RoutingTruth(model)
    bias_before = [moe.expert_bias_E.clone() for moe in tt.moe_modules(model)]
    monitor = attach(model, redis_url, run="titan-train", optimizers=optimizers, sample_tokens=4, sample_every=1)
    try:
        tokens = tt.train(model, optimizers, iterations=3, micro_batches=2, truth=truth)
        monitor.close()
        steps = published_steps(redis_url, "titan-train")
        assert [s.step for s in steps] == [0, 1, 2]
        assert {s.phase for s in steps} == {"train"}
        assert {(s.rank, s.world_size) for s in steps} == {(0, 1)}
        assert sum(s.tokens for s in steps) == tokens == 3 * 2 * 2 * 15
        for step, want_LE in zip(steps, truth.step_counts):
            np.testing.assert_array_equal(step.counts_LE, want_LE.numpy())
            assert (step.counts_LE.sum(axis=1) == step.tokens * tt.TOP_K).all()
            assert step.sample_ids_LNK is not None and step.sample_ids_LNK.shape[0] == tt.MOE_LAYERS
        np.testing.assert_array_equal(monitor.counts(), truth.counts_LE.numpy())
        # the routing the counts follow moved under torchtitan's expert-bias updates (the optimizer pre-hook)
        assert any(not torch.equal(before, moe.expert_bias_E) for before, moe in zip(bias_before, truth.moes))
        meta = core.decode_meta(core.connect(redis_url).get(core.meta_key("titan-train")))
        assert (meta.num_experts, meta.top_k, meta.hidden_size, meta.moe_intermediate_size) == (8, 2, 64, 32)
        assert meta.layer_names == ["layers.1.moe", "layers.2.moe", "layers.3.moe"]
        assert meta.extra["framework"] == "torchtitan" and isinstance(meta.extra["parallel"], dict)
        assert monitor.stats()["hook_errors"] == 0
    finally:
        monitor.close()
        truth.remove()


@pytest.mark.parametrize("ac", ["full", "selective"])
def test_activation_checkpointing_recompute_is_not_counted_again(ac):
    model = tt.build_model(seed=2, ac=ac)
    optimizers = tt.build_optimizers(model)
    truth = tt.RoutingTruth(model)
    monitor = attach(model, optimizers=optimizers)
    try:
        tt.train(model, optimizers, iterations=1, micro_batches=2, truth=truth)
        forwards = 2
        assert truth.calls_L == [2 * forwards] * tt.MOE_LAYERS, "torchtitan's AC re-runs every MoE in backward"
        assert monitor.step == 1
        np.testing.assert_array_equal(monitor.counts(), truth.counts_LE.numpy())
        assert int(monitor.counts().sum()) == forwards * 2 * 15 * tt.TOP_K * tt.MOE_LAYERS
    finally:
        monitor.close()
        truth.remove()


def test_eval_forwards_are_not_training_steps():
    model = tt.build_model(seed=3)
    monitor = attach(model)
    try:
        model.eval()
        with torch.no_grad():
            model(torch.randint(0, tt.VOCAB, (2, 8)))
        assert int(monitor.counts().sum()) == 0
        model.train()
        model(torch.randint(0, tt.VOCAB, (2, 8))).sum().backward()
        assert monitor.end_step() == 0
        assert int(monitor.counts().sum()) == 2 * 8 * tt.TOP_K * tt.MOE_LAYERS
    finally:
        monitor.close()


def test_find_moe_layers_names_them_through_the_activation_checkpoint_wrapper():
    layers = find_moe_layers([tt.build_model(seed=4, ac="full")])
    assert [layer.name for layer in layers] == ["layers.1.moe", "layers.2.moe", "layers.3.moe"]
    assert {(layer.num_experts, layer.top_k) for layer in layers} == {(tt.NUM_EXPERTS, tt.TOP_K)}
    with pytest.raises(ValueError, match="no torchtitan MoE"):
        find_moe_layers([torch.nn.Linear(2, 2)])


def test_torchtitans_per_block_compile_counts_exactly_and_compiles_once_per_block_kind():
    """torchtitan's apply_compile (each block torch.compile(fullgraph=True); aot_eager: no C++ toolchain needed)
    with the hooks inside the compiled blocks: no graph break, no recompilation per layer, and the counts equal
    torchtitan's own tokens_per_expert_E (exact without activation checkpointing), read before each step."""
    import torch._dynamo.utils as dynamo_utils
    from torchtitan.config import CompileConfig
    from torchtitan.distributed.compile import apply_compile

    class NoTensorParallel:
        tp_enabled = False

    torch._dynamo.reset()
    model = tt.build_model(seed=7)
    optimizers = tt.build_optimizers(model)
    monitor = attach(model, optimizers=optimizers)
    try:
        apply_compile(model, compile_config=CompileConfig(enable=True, backend="aot_eager"),
                      parallel_dims=NoTensorParallel())
        moes, titan_counts = tt.moe_modules(model), []
        dynamo_utils.counters.clear()
        tt.train(model, optimizers, iterations=2, micro_batches=2, before_step=lambda: titan_counts.append(
            torch.stack([moe.tokens_per_expert_E.clone() for moe in moes])))
        assert monitor.step == 2 and monitor.stats()["hook_errors"] == 0
        np.testing.assert_array_equal(monitor.counts(), torch.stack(titan_counts).sum(0).to(torch.int64).numpy())
        assert int(monitor.counts().sum()) == 2 * 2 * 2 * 15 * tt.TOP_K * tt.MOE_LAYERS
        assert not dynamo_utils.counters["graph_break"]
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        assert graphs == 2, f"one graph for the dense block and one for all MoE blocks, not {graphs}"
    finally:
        monitor.close()
        torch._dynamo.reset()
