"""The vLLM plugin on a real vLLM (its CPU build), in .venv-engines: `make test-engines`.

Each engine runs in its own process with the plugin configured by environment, exactly as a user serves:
the package installed, MOE_MONITOR_REDIS_URL set. Counts published through a real redis-server are compared
with the counts attach() gives when the same checkpoint reads the same tokens in transformers (float32 both).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from moe_monitor import core
from moe_monitor.demo.checkpoints import write_checkpoint
from tests.engines.engine import Engine, total_counts, wait_for_tokens
from tests.support.redisfaults import FaultyRedis

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [100, 200, 300, 400, 5, 6, 7, 8, 9, 10, 11], [42]]
MAX_TOKENS = 6
TOP_K = 2


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {family: write_checkpoint(family, root / family) for family in ("qwen3_moe", "mixtral")}


@pytest.fixture(scope="module")
def reference(checkpoints, tmp_path_factory):
    """Outputs of each family with the plugin off (no MOE_MONITOR_REDIS_URL), eager, and its log."""
    out = {}
    for family in ("qwen3_moe",):
        log = tmp_path_factory.mktemp("logs") / f"{family}-off.log"
        engine = Engine(checkpoints[family], "eager", {}, log)
        try:
            out[family] = (engine.generate(PROMPTS, MAX_TOKENS), log)
        finally:
            engine.close()
    return out


def transformers_counts(checkpoint, prompts, outputs) -> np.ndarray:
    """int64 [L, E]: attach()'s counts when transformers reads every prompt and the tokens vLLM generated
    from it (all but the last, which no step reads)."""
    from transformers import AutoModelForCausalLM

    from moe_monitor.collectors import attach

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    monitor = attach(model, nvml=False, sample_tokens=0)
    with torch.no_grad():
        for prompt, generated in zip(prompts, outputs):
            model(torch.tensor([prompt + generated[:-1]]))
            monitor.end_step()
    counts = monitor.counts()
    monitor.close()
    return counts


def expected_tokens(outputs) -> int:
    return sum(len(p) + len(g) - 1 for p, g in zip(PROMPTS, outputs))


def check_steps(steps, outputs, checkpoint, num_layers: int):
    """Every token counted once: per step tokens x k per layer; over the run, the transformers counts."""
    assert steps, "nothing was published"
    assert sum(s.tokens for s in steps) == expected_tokens(outputs)
    for s in steps:
        assert s.counts_LE.shape[0] == num_layers
        assert (s.counts_LE.sum(axis=1) == s.tokens * TOP_K).all(), f"step {s.step}: padding or a token lost"
        assert s.scope == "rank" and s.rank == 0 and s.world_size == 1
    assert [s.step for s in steps] == list(range(len(steps)))
    phases = {s.phase for s in steps}
    assert "prefill" in phases and "decode" in phases
    np.testing.assert_array_equal(total_counts(steps), transformers_counts(checkpoint, PROMPTS, outputs))


def test_without_url_the_plugin_only_logs_one_line(reference, redis_url):
    outputs, log = reference["qwen3_moe"]
    text = log.read_text()
    assert "moe monitor: off (set MOE_MONITOR_REDIS_URL" in text
    assert "MoE layers x" not in text   # never bound
    assert all(len(o) == MAX_TOKENS for o in outputs)


@pytest.mark.parametrize("family,mode", [("qwen3_moe", "eager"), ("qwen3_moe", "compiled"), ("mixtral", "compiled")])
def test_counts_through_redis_equal_transformers(family, mode, checkpoints, reference, redis_url, tmp_path):
    run = f"vllm-{family}-{mode}".replace("_", "-")
    engine = Engine(checkpoints[family], mode, {"MOE_MONITOR_REDIS_URL": redis_url, "MOE_MONITOR_RUN": run,
                                                "MOE_MONITOR_NVML": "0"}, tmp_path / "engine.log")
    try:
        outputs = engine.generate(PROMPTS, MAX_TOKENS)
        client = core.connect(redis_url)
        steps = wait_for_tokens(client, run, expected_tokens(outputs))
        meta = core.decode_meta(client.get(core.meta_key(run)))
        watched = dashboard_reads(client, redis_url, run)
    finally:
        engine.close()
    if family in reference:
        assert outputs == reference[family][0], "the plugin changed vLLM's output"
    assert meta.top_k == TOP_K and meta.layer_names[0].startswith("model.layers.0.")
    check_steps(steps, outputs, checkpoints[family], len(meta.layer_names))
    assert any(s.sample_ids_LNK is not None for s in steps), "no sampled routing rows"
    assert watched.bad_records == 0 and watched.window is not None and watched.window.size == len(steps)


def dashboard_reads(client, redis_url: str, run: str):
    """The dashboard's live window over the run, as the pages poll it (dashboard.live needs numpy only)."""
    from moe_monitor.dashboard.live.watched import WatchedRun
    from moe_monitor.dashboard.sources.redis import RedisSource

    watched = WatchedRun(RedisSource(client, redis_url, run, window_steps=256), window_steps=256)
    for _ in range(3):
        watched.tick()
    return watched


def test_redis_outage_changes_nothing_and_loses_nothing(checkpoints, reference, tmp_path):
    server = FaultyRedis(tmp_path)
    run = "vllm-outage"
    engine = Engine(checkpoints["qwen3_moe"], "eager", {"MOE_MONITOR_REDIS_URL": server.url, "MOE_MONITOR_RUN": run,
                                                        "MOE_MONITOR_NVML": "0"}, tmp_path / "engine.log")
    try:
        first = engine.generate(PROMPTS[:2], MAX_TOKENS)
        steps = wait_for_tokens(server.client(), run, expected_tokens(first[:2]) - 0)
        landed_before = len(steps)
        server.kill()                                   # Redis gone while vLLM serves
        outputs = engine.generate(PROMPTS, MAX_TOKENS)
        assert outputs == reference["qwen3_moe"][0], "a Redis outage changed vLLM's output"
        server.start()                                  # back, empty: the queued steps land
        client = server.client()
        steps = wait_for_tokens(client, run, expected_tokens(outputs), timeout_s=30)
        health = client.hgetall(core.health_key(run))
    finally:
        engine.close()
        server.stop()
    assert landed_before > 0
    assert sum(s.tokens for s in steps) == expected_tokens(outputs), "steps queued during the outage were lost"
    assert b"0" in health
    np.testing.assert_array_equal(total_counts(steps), transformers_counts(checkpoints["qwen3_moe"], PROMPTS, outputs))


def test_a_graph_compiled_without_the_plugin_is_never_loaded_with_it(checkpoints, redis_url, tmp_path):
    """vLLM's compile cache (AOT artifacts) is keyed before Dynamo traces the plugin's capture ops: an engine with
    the plugin, after one without it compiled the same model into the same cache, finds no graph under its key
    (the plugin's factor) and counts every token; a second engine with the plugin finds the first one's graph
    under that key and counts every token too (on vLLM 0.32's CPU build the load fails, "'function' object has
    no attribute 'finalize_loading'", and vLLM compiles again)."""
    cache = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    checkpoint = checkpoints["qwen3_moe"]
    plain = Engine(checkpoint, "compiled", cache, tmp_path / "off.log")
    try:
        reference_outputs = plain.generate(PROMPTS, MAX_TOKENS)
    finally:
        plain.close()
    client = core.connect(redis_url)
    for attempt in ("compiles", "loads"):
        run = f"vllm-cache-{attempt}"
        log = tmp_path / f"{attempt}.log"
        engine = Engine(checkpoint, "compiled", {**cache, "MOE_MONITOR_REDIS_URL": redis_url, "MOE_MONITOR_RUN": run,
                                                 "MOE_MONITOR_NVML": "0"}, log)
        try:
            outputs = engine.generate(PROMPTS, MAX_TOKENS)
            steps = wait_for_tokens(client, run, expected_tokens(outputs))
        finally:
            engine.close()
        assert outputs == reference_outputs
        text = log.read_text()
        found = "Directly load AOT compilation from path" in text or "due to a load failure from" in text
        assert found == (attempt == "loads"), f"{attempt}: a cached graph was {'' if found else 'not '}found"
        check_steps(steps, outputs, checkpoint, 2)
    saved = {line.split("torch_aot_compile")[1].split("/")[1] for name in ("off", "compiles")
             for line in (tmp_path / f"{name}.log").read_text().splitlines() if "saved AOT compiled function" in line}
    assert len(saved) == 2, f"the engines with and without the plugin share a compile-cache key: {saved}"
