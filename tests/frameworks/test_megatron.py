"""The Megatron-Core collector on real megatron-core 0.16.1 modules training on the CPU (gloo), exact against a
ground truth that never looks at the router (tests/frameworks/megatron_support.py: re-run each MoE layer with
one expert's weights zeroed; the tokens whose output changes are the tokens routed to it), published to a
private redis-server and read back as phase "train" steps, one per training iteration."""
from __future__ import annotations

import json
import socket
import warnings

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from moe_monitor import core
from moe_monitor.collectors.megatron import attach_megatron
from tests.frameworks import megatron_support as ms
from tests.support.published import published_steps

warnings.filterwarnings("ignore", category=UserWarning)
MICRO_BATCHES, MICRO_TOKENS = 2, 2 * ms.SEQ  # per iteration; tokens of one micro-batch (B = 2, S = 16)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def megatron_world():
    """Megatron's parallel state over a one-process gloo group (torn down after the test)."""
    ms.init_parallel(port=_free_port())
    yield
    ms.shutdown_parallel()


def _train(model, monitor, config, iterations: int) -> list[np.ndarray]:
    """Train with the monitor attached; returns the ground truth int [L, E] of each iteration."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    truth = []
    for step in range(iterations):
        captured: dict[int, list[ms.Captured]] = {}
        with ms.capture_moe_inputs(model, captured), monitor.iteration():
            ms.train_iteration(model, optimizer, step, MICRO_BATCHES)
        assert all(len(captured[n]) == MICRO_BATCHES for n in monitor.layer_numbers)
        truth.append(np.array([ms.truth_counts(config, captured[n]).numpy() for n in monitor.layer_numbers]))
    return truth


def test_training_iterations_are_exact_train_steps_in_redis(megatron_world, redis_url):
    """Three iterations (2 micro-batches each, forward + backward + AdamW step) through Megatron's GPTModel with
    a biased, group-limited sigmoid router: one published step per iteration, phase train, every layer's counts
    exactly the ground truth's, and a plain top-k of the router's scores would have been wrong."""
    config = ms.tiny_config()
    model = ms.build_model(config)
    monitor = attach_megatron(model, redis_url=redis_url, run="mcore-tiny", sample_tokens=4, nvml=False)
    assert monitor.layer_numbers == [1, 2] and monitor.layer_names == ["decoder.layers.0", "decoder.layers.1"]
    assert (monitor.num_experts, monitor.top_k, monitor.rank, monitor.world_size) == (8, 2, 0, 1)
    captured: dict[int, list[ms.Captured]] = {}
    with ms.capture_moe_inputs(model, captured):
        model(*ms.batch(99, 0), attention_mask=None)  # a plain forward, then one more ...
    first = ms.truth_counts(config, captured[1])
    assert first.tolist() != ms.naive_topk_counts(config, captured[1]).tolist()
    monitor.end_step()  # ... closed as a step of its own
    truth = _train(model, monitor, config, iterations=3)
    monitor.close()
    assert monitor.stats()["last_error"] == ""
    steps = published_steps(redis_url, "mcore-tiny")
    assert [s.step for s in steps] == [0, 1, 2, 3]
    assert {s.phase for s in steps} == {"train"} and {(s.rank, s.world_size) for s in steps} == {(0, 1)}
    assert steps[0].counts_LE[0].tolist() == first.tolist()
    for record, truth_LE in zip(steps[1:], truth):
        assert record.counts_LE.tolist() == truth_LE.tolist()
        assert record.tokens == MICRO_BATCHES * MICRO_TOKENS
        assert record.counts_LE.sum(axis=1).tolist() == [MICRO_BATCHES * MICRO_TOKENS * 2] * 2  # no drops: 2 each
    assert np.array_equal(monitor.counts(), sum(s.counts_LE.astype(np.int64) for s in steps))
    assert any(s.sample_ids_LNK is not None for s in steps)


def test_capacity_dropping_counts_only_the_dispatched_tokens(megatron_world, redis_url):
    """moe_expert_capacity_factor 1.0 (aux-loss router, softmax scores): the tokens Megatron drops are not
    counted, exactly as the ground truth sees them."""
    config = ms.tiny_config(moe_expert_capacity_factor=1.0, moe_router_load_balancing_type="aux_loss",
                            moe_aux_loss_coeff=0.01, moe_router_score_function="softmax",
                            moe_router_enable_expert_bias=False, moe_router_num_groups=None,
                            moe_router_group_topk=None)
    model = ms.build_model(config)
    monitor = attach_megatron(model, redis_url=redis_url, run="mcore-drop", sample_tokens=0, nvml=False)
    truth = _train(model, monitor, config, iterations=2)
    monitor.close()
    steps = published_steps(redis_url, "mcore-drop")
    assert [s.counts_LE.tolist() for s in steps] == [t.tolist() for t in truth]
    assert all(s.counts_LE.sum() < 2 * MICRO_BATCHES * MICRO_TOKENS * 2 for s in steps)  # some tokens dropped
    assert all(s.phase == "train" for s in steps)


@pytest.mark.parametrize("reentrant", [True, False])
def test_recomputed_forwards_are_not_counted_again(megatron_world, reentrant):
    """Each MoE layer checkpointed (torch.utils.checkpoint: reentrant, as Megatron's own CheckpointFunction,
    which needs CUDA RNG state and cannot run here, and non-reentrant): its router runs again inside backward,
    and the counts are still the ground truth's, once."""
    config = ms.tiny_config()
    model = ms.build_model(config)
    for layer in ms.moe_layers(model):
        plain = layer.forward

        def checkpointed(hidden_states, *args, plain=plain, **kwargs):
            return torch.utils.checkpoint.checkpoint(lambda h: plain(h, *args, **kwargs), hidden_states,
                                                     use_reentrant=reentrant)
        layer.forward = checkpointed
    monitor = attach_megatron(model, sample_tokens=0, nvml=False)
    calls = []
    handle = monitor.sites[0].module.register_forward_hook(lambda *a: calls.append(1))
    truth = _train(model, monitor, config, iterations=2)
    handle.remove()
    monitor.close()
    assert len(calls) == 2 * 2 * MICRO_BATCHES  # forward and recomputation, every micro-batch of both iterations
    assert monitor.counts().tolist() == sum(truth).tolist()


def test_two_data_parallel_ranks_publish_as_the_run_s_ranks(redis_url, tmp_path):
    """World size 2 over gloo (data parallel 2; expert parallel cannot run on the CPU, docs/megatron.md): this
    process and one spawned process each train on its own batches and publishes as global rank r of 2 under one run name; each rank's
    steps are exactly its own ground truth."""
    args = (2, _free_port(), redis_url, "mcore-dp2", 2, str(tmp_path))
    other = mp.get_context("spawn").Process(target=ms.dp_worker, args=(1, *args))
    other.start()
    try:
        ms.dp_worker(0, *args)  # this process is rank 0 (one import of megatron fewer)
    finally:
        other.join(timeout=240)
        if other.exitcode is None:
            other.kill()
    assert other.exitcode == 0
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [f["last_error"] for f in facts] == ["", ""] and {f["run"] for f in facts} == {"mcore-dp2"}
    assert [(f["parallel"]["dp"], f["parallel"]["dp_rank"], f["parallel"]["ep"]) for f in facts] == [(2, 0, 1),
                                                                                                      (2, 1, 1)]
    steps = published_steps(redis_url, "mcore-dp2")
    assert sorted((s.rank, s.step) for s in steps) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(s.world_size, s.phase) for s in steps} == {(2, "train")}
    for s in steps:
        assert s.counts_LE.tolist() == facts[s.rank]["truth_TLE"][s.step]
    assert facts[0]["truth_TLE"] != facts[1]["truth_TLE"]  # the ranks routed different tokens
    meta = core.decode_meta(core.connect(redis_url).get(core.meta_key("mcore-dp2")))
    assert meta.extra["framework"] == "megatron-core" and meta.extra["parallel"]["dp"] == 2  # the run's metadata


def test_two_expert_parallel_ranks_route_exactly(redis_url, tmp_path):
    """World size 2 with expert parallelism 2 (gloo): the model is built with 4 local experts per rank and each
    rank's routers run on its own tokens (forward, backward, an optimizer step on the routers; the MoE layers'
    dispatch cannot run on the CPU, docs/megatron.md). Each rank publishes as rank r of 2 under one run name with
    the expert-parallel layout (gpus 2), and each rank's counts are the ground truth of what its routers saw,
    computed afterwards in a one-rank world by full MoE layers loaded with those routers' weights."""
    args = (2, _free_port(), redis_url, "mcore-ep2", 2, str(tmp_path))
    other = mp.get_context("spawn").Process(target=ms.ep_router_worker, args=(1, *args))
    other.start()
    try:
        ms.ep_router_worker(0, *args)
    finally:
        other.join(timeout=240)
        if other.exitcode is None:
            other.kill()
    assert other.exitcode == 0
    saved = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [s["facts"]["ep_rank"] for s in saved] == [0, 1]
    assert all((f["ep"], f["gpus"], f["local_experts"], f["last_error"], f["run"]) == (2, 2, 4, "", "mcore-ep2")
               for f in (s["facts"] for s in saved))
    steps = published_steps(redis_url, "mcore-ep2")
    assert sorted((s.rank, s.step) for s in steps) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(s.world_size, s.phase, s.tokens) for s in steps} == {(2, "train", MICRO_BATCHES * MICRO_TOKENS)}
    ms.init_parallel(port=_free_port())  # the ground truth: one rank, every expert local
    try:
        config = ms.tiny_config()
        for s in steps:
            seen = saved[s.rank]["seen_T"][s.step]
            truth = [ms.truth_counts(config, ms.captured_of(seen[str(n)])).tolist() for n in (1, 2)]
            assert s.counts_LE.tolist() == truth
    finally:
        ms.shutdown_parallel()


def test_a_model_without_routers_is_refused_and_a_failing_hook_never_raises(megatron_world):
    with pytest.raises(ValueError, match="found no Megatron-Core MoE router"):
        attach_megatron(torch.nn.Linear(4, 4))
    config = ms.tiny_config()
    model = ms.build_model(config)
    monitor = attach_megatron(model, sample_tokens=0, nvml=False)
    hook = monitor.sites[1].module._forward_hooks  # the router's hooks: ours, called as torch calls it
    ours = next(iter(hook.values()))
    assert ours(monitor.sites[1].module, (), (torch.zeros(3, 8), "not a routing map")) is None
    captured: dict[int, list[ms.Captured]] = {}
    with ms.capture_moe_inputs(model, captured), monitor.iteration():
        model(*ms.batch(0, 0), attention_mask=None)
    monitor.close()
    stats = monitor.stats()
    assert stats["hook_errors"] == 1 and "decoder.layers.1" in stats["last_error"]
    assert monitor.counts().tolist() == [ms.truth_counts(config, captured[n]).tolist() for n in (1, 2)]
