"""The Overview's first screen in Streamlit's AppTest against a real redis-server: the answer first (the GPU
that holds the layers back, or "no persistent straggler"), its picture next, every other figure one click down,
and the phase the window spends its time in shown by default."""
import time

import numpy as np
import pytest

from moe_monitor import core
from tests.support import synthfill
from tests.support.apptest import run_app

pytestmark = pytest.mark.app


def _fill(client, run: str, counts_T, phases_T, gaps_s_T, gpus: int = 4) -> None:
    num_layers, num_experts = counts_T[0].shape
    client.set(core.meta_key(run), core.encode_meta(synthfill.make_meta(run, num_layers, num_experts, gpus=gpus)))
    t = time.time() - float(np.sum(gaps_s_T))
    for step, (counts, phase, gap) in enumerate(zip(counts_T, phases_T, gaps_s_T)):
        t += gap
        client.xadd(core.steps_key(run), core.encode_step(core.StepRecord(
            run=run, rank=0, world_size=1, step=step, time_s=t, phase=phase, tokens=int(counts.sum()),
            counts_LE=counts.astype(np.int32))))
    client.zadd(core.RUNS_KEY, {run: t})


def test_a_straggler_is_named_first_with_its_experts_and_marked(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill_skewed(client, "skew")       # every token to expert 0: GPU 0 of 4 does all the work
    at = run_app(redis_url, monkeypatch, phase="auto")
    answer = at.warning[0].value
    assert "**GPU 0 (node 0) holds the MoE layers back**" in answer
    assert "layer 0 expert 0 (50% of its tokens)" in answer and "To do:" in answer
    picture = at.get("vega_lite_chart")[0].proto
    assert "Mean load of each GPU" in picture.spec  # the first chart: the answer's picture
    assert any("phase: decode (auto: decode 100% of the window's time)" in c.value for c in at.caption)
    assert at.expander[0].label.startswith("Every figure")  # the nine balance figures are one click down
    assert {m.label for m in at.main.metric} >= {"balancedness now (p50 over layers)", "steps/s"}


def test_an_even_run_says_there_is_no_persistent_straggler(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    rng = np.random.default_rng(0)
    counts = [rng.multinomial(4096, np.full(16, 1 / 16), size=4) for _ in range(40)]
    _fill(client, "even", counts, ["decode"] * 40, [0.1] * 40)
    at = run_app(redis_url, monkeypatch, phase="auto")
    assert at.success and at.success[0].value.startswith("**No persistent straggler** (in tokens")
    assert not [w.value for w in at.warning if "holds the MoE layers back" in w.value]


def test_the_default_phase_is_where_the_run_spends_its_time(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    rng = np.random.default_rng(1)
    phases = ["prefill" if step % 10 == 0 else "decode" for step in range(60)]  # 6 prefill, 54 decode steps
    gaps = [0.3 if phase == "prefill" else 0.1 for phase in phases]  # decode 5.4 s; prefill 1.6 s (the first: median)
    counts = [rng.multinomial(4000 if phase == "prefill" else 64, np.full(16, 1 / 16), size=4) for phase in phases]
    _fill(client, "mixed", counts, phases, gaps)
    at = run_app(redis_url, monkeypatch, phase="auto")
    assert any("phase: decode (auto: decode 77% · prefill 23% of the window's time) · 54 steps in window" in c.value
               for c in at.caption), [c.value for c in at.caption]
    at.sidebar.radio(key="phase").set_value("prefill").run()
    assert any("phase: prefill · 6 steps in window" in c.value for c in at.caption)
