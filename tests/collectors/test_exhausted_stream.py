"""A stream holding the last possible id (XADD key 18446744073709551615-18446744073709551615) refuses every later
entry. The writers say so once (log), keep saying it in their health, never block the model, and write again once
the stream is deleted. Real redis-server; the refusal is Redis's own."""
from __future__ import annotations

import json
import logging
import time

import pytest
import redis
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor
from moe_monitor.collectors.sglang import Bridge, BridgeOptions
from moe_monitor.core.runwrite import LAST_POSSIBLE_ID, exhausted_stream
from moe_monitor.traces.publish import RunPublisher
from tests.support.waiting import wait_until

QUEUE_STEPS = 64


def exhaust(url: str, key: str) -> None:
    """Put the one entry after which Redis takes no other into stream key."""
    core.connect(url, timeout_s=2.0).xadd(key, {"x": "1"}, id=LAST_POSSIBLE_ID)


def health_of(url: str, run: str, rank: int = 0) -> dict:
    raw = core.connect(url, timeout_s=2.0).hget(core.health_key(run), str(rank))
    return json.loads(raw) if raw else {}


def said(caplog, words: str) -> list[str]:
    return [rec.getMessage() for rec in caplog.records if words in rec.getMessage()]


def test_redis_refuses_every_entry_after_the_last_id(redis_url):
    exhaust(redis_url, "s")
    with pytest.raises(redis.ResponseError) as err:
        core.connect(redis_url).xadd("s", {"x": "2"})
    assert exhausted_stream(err.value)
    assert not exhausted_stream(redis.ResponseError("OOM command not allowed")) and not exhausted_stream(ValueError())


def test_monitor_says_it_once_keeps_it_in_health_and_resumes(redis_url, caplog):
    caplog.set_level(logging.INFO, logger="moe_monitor.collectors")
    run = "full"
    exhaust(redis_url, core.steps_key(run))
    mon = ExpertLoadMonitor(2, 4, 2, redis_url=redis_url, run=run, gpus=2, nvml=False, queue_steps=QUEUE_STEPS)
    try:
        for _ in range(10 * QUEUE_STEPS):  # the model goes on: end_step queues, never waits on Redis
            mon.record(0, torch.tensor([[0, 3], [1, 3]]))
            mon.record(1, torch.tensor([[2, 2], [0, 1]]))
            mon.end_step("decode")
        assert wait_until(lambda: mon.stats()["sinks"]["redis"]["failures"] >= 4, 15), mon.stats()
        stats = mon.stats()
        assert stats["steps"] == 10 * QUEUE_STEPS and stats["publisher_alive"]
        assert stats["published_steps"] == 0 and stats["dropped_steps"] > 0  # the bounded queue dropped the oldest
        assert "last possible id" in stats["last_error"] and core.steps_key(run) in stats["last_error"]
        found = said(caplog, "last possible id")
        assert len(found) == 1, found  # once, however many retries
        assert f"DEL {core.steps_key(run)}" in found[0]
        assert caplog.records[[r.getMessage() for r in caplog.records].index(found[0])].levelno == logging.ERROR
        health = health_of(redis_url, run)
        assert "last possible id" in health["last_error"] and health["published_steps"] == 0, health

        core.connect(redis_url).delete(core.steps_key(run))  # what the message says to do
        assert wait_until(lambda: mon.stats()["published_steps"] > 0, 15), mon.stats()
        assert wait_until(lambda: health_of(redis_url, run).get("last_error") == "", 15), health_of(redis_url, run)
    finally:
        mon.close()
    assert len(said(caplog, "last possible id")) == 1
    assert len(said(caplog, "takes entries again")) == 1
    assert core.connect(redis_url).xlen(core.steps_key(run)) > 0


def save_stat(folder, time_s: float, steps: int = 3, layers: int = 2, experts: int = 8):
    """A stat dump as SGLang's recorder writes it: int32 logical counts [steps, layers, experts]."""
    counts = torch.arange(steps * layers * experts, dtype=torch.int32).reshape(steps, layers, experts) % 7 + 1
    torch.save({"rank": 0, "logical_count": counts, "average_utilization_rate_over_window": None},
               folder / f"expert_distribution_recorder_{time_s}.pt")


def test_bridge_says_it_once_and_retries(tmp_path, redis_url):
    folder = tmp_path / "dumps"
    folder.mkdir()
    save_stat(folder, time.time())
    run = "bridged-full"
    exhaust(redis_url, core.steps_key(run))
    lines: list[str] = []
    opts = BridgeOptions(dump_dir=str(folder), redis_url=redis_url, run=run, poll_s=0.02, top_k=2, gpus=1)
    bridge = Bridge(opts, log=lines.append)
    try:
        bridge.poll()  # the first listing: a file is complete once it looks the same twice
        time.sleep(0.05)
        for _ in range(5):
            assert not bridge.poll()  # nothing lands, nothing is marked read
    finally:
        bridge.close()
    found = [line for line in lines if "last possible id" in line]
    assert len(found) == 1, lines
    assert not any("unreachable" in line for line in lines), lines
    assert "last possible id" in health_of(redis_url, run)["last_error"]
    core.connect(redis_url).delete(core.steps_key(run))
    rc = Bridge(opts, log=lines.append).run_once()
    assert rc == 0, lines
    assert core.connect(redis_url).xlen(core.steps_key(run)) == 3


def test_replay_names_the_stream(redis_url):
    meta = core.RunMeta(run="replayed", model_name="tiny", layer_names=["l0", "l1"], num_experts=4, top_k=2,
                        hidden_size=8, moe_intermediate_size=8, dtype_bytes=2,
                        layout=core.Layout(gpus=2, nodes=1, physical_to_logical_map=core.contiguous_layout(2, 4)))
    exhaust(redis_url, core.steps_key("replayed"))
    step = core.StepRecord(run="replayed", rank=0, world_size=1, step=0, time_s=1.0, phase="decode", tokens=2,
                           counts_LE=torch.tensor([[1, 1, 1, 1], [2, 0, 2, 0]]).numpy())
    publisher = RunPublisher(redis_url, meta)
    try:
        with pytest.raises(redis.ResponseError, match="last possible id") as err:
            publisher.publish([step])
    finally:
        publisher.close()
    assert core.steps_key("replayed") in str(err.value)
