"""RunMeta.dispatch: the engine's dispatch policy in the run's metadata, and the collectors' engine mapping."""
from __future__ import annotations

import json

import pytest

from moe_monitor import core
from moe_monitor.collectors.options import MonitorOptions
from moe_monitor.collectors.sglang.runmeta import ConfigError, sglang_dispatch
from moe_monitor.core.dispatch import DISPATCH_POLICIES


def _meta(**fields) -> core.RunMeta:
    layout = core.Layout(gpus=2, nodes=1, physical_to_logical_map=[[0, 1, 2, 0], [2, 1, 0, 1]])
    return core.RunMeta(run="m", model_name="x", layer_names=["a", "b"], num_experts=3, top_k=2, hidden_size=8,
                        moe_intermediate_size=4, dtype_bytes=2, layout=layout, **fields)


@pytest.mark.parametrize("policy", DISPATCH_POLICIES)
def test_dispatch_round_trips(policy):
    assert core.decode_meta(core.encode_meta(_meta(dispatch=policy))).dispatch == policy


def test_old_metadata_without_dispatch_reads_as_even():
    raw = json.loads(core.encode_meta(_meta(dispatch="lp")))
    del raw["dispatch"]
    assert core.decode_meta(json.dumps(raw)).dispatch == "even"
    assert _meta().dispatch == "even"


@pytest.mark.parametrize("value, message", [("random", "'dispatch' = 'random' is not a dispatch policy"),
                                            ("", "is not a dispatch policy"), (3, "'dispatch' has the wrong type"),
                                            (None, "'dispatch' has the wrong type")])
def test_unknown_dispatch_is_one_clear_error(value, message):
    raw = json.loads(core.encode_meta(_meta()))
    with pytest.raises(ValueError, match=message):
        core.decode_meta(json.dumps({**raw, "dispatch": value}))
    with pytest.raises(ValueError, match="dispatch"):
        core.encode_meta(_meta(dispatch="random"))


def test_engine_flags_map_to_policies():
    assert [sglang_dispatch(a) for a in ("static", "dynamic", "fake", "lp", None)] == [
        "round_robin", "even", "even", "lp", "round_robin"]
    with pytest.raises(ConfigError, match="--ep-dispatch-algorithm 'random'"):
        sglang_dispatch("random")
    assert MonitorOptions().dispatch == "even" and MonitorOptions(dispatch="round_robin").dispatch == "round_robin"
    with pytest.raises(ValueError, match="dispatch must be one of"):
        MonitorOptions(dispatch="fastest")
