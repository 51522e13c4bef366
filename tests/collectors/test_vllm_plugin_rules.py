"""The vLLM plugin's pure parts, without vLLM: settings from the environment, who publishes, the phase of a
scheduler step, and the runner wrapping (on a runner class of our own; the real vLLM runs in tests/engines)."""
from __future__ import annotations

import types

import pytest

from moe_monitor.collectors.vllm.patch import patch_module
from moe_monitor.collectors.vllm.rules import batch_phase, publishing_rule, run_name_for, settings_from_env, step_facts


def test_settings_from_env():
    assert settings_from_env({}).redis_url is None
    s = settings_from_env({"MOE_MONITOR_REDIS_URL": " rediss://u:p@h:6380/0 ", "MOE_MONITOR_RUN": "prod",
                           "MOE_MONITOR_SAMPLE_TOKENS": "0", "MOE_MONITOR_MEMORY_BUDGET_MB": "64",
                           "MOE_MONITOR_NVML": "0", "MOE_MONITOR_QUEUE_STEPS": "10"})
    assert s.redis_url == "rediss://u:p@h:6380/0" and s.run == "prod"
    assert s.options == {"sample_tokens": 0, "memory_budget_bytes": 64 << 20, "nvml": False, "queue_steps": 10}
    for bad in ({"MOE_MONITOR_SAMPLE_TOKENS": "-1"}, {"MOE_MONITOR_QUEUE_STEPS": "0"}, {"MOE_MONITOR_NVML": "yes"},
                {"MOE_MONITOR_MEMORY_BUDGET_MB": "1e9"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            settings_from_env(bad)
    assert run_name_for("deepseek-ai/DeepSeek-V3") == "DeepSeek-V3"
    assert run_name_for("/models/my model:v2/") == "my-model-v2"


@pytest.mark.parametrize("tp,dp,ep,expect", [
    # (tensor-parallel size, data-parallel size, expert parallel) -> (publishers, scope, layout GPUs)
    (1, 1, False, (1, "rank", 1)),
    (8, 1, False, (1, "dp-group", 1)),      # TP attention, experts TP-sharded: one publisher
    (8, 1, True, (1, "dp-group", 8)),       # TP attention, experts spread over 8 GPUs
    (1, 8, True, (8, "rank", 8)),           # DP attention (DeepSeek-style): every rank its own tokens
    (2, 4, True, (4, "dp-group", 8)),       # both: rank 0 of each of the 4 groups publishes
])
def test_each_token_is_published_once(tp, dp, ep, expect):
    rules = [publishing_rule(t, tp, d, dp, 1, ep) for d in range(dp) for t in range(tp)]
    publishers = [r for r in rules if r.publishes]
    assert (len(publishers), publishers[0].scope, publishers[0].gpus) == expect
    assert sorted(r.rank for r in publishers) == list(range(dp)) and {r.world_size for r in rules} == {dp}
    assert not any(r.publishes for r in (publishing_rule(0, tp, 0, dp, 2, ep),)), "pipeline parallel: off"


def test_batch_phase():
    assert batch_phase({"a": 7, "b": 3}, {}, {"a", "b"}) == "prefill"
    assert batch_phase({"a": 1, "b": 1}, {}, set()) == "decode"
    assert batch_phase({"a": 3}, {"a": [5, 6]}, set()) == "decode"          # 1 + two speculative tokens
    assert batch_phase({"a": 1, "b": 9}, {}, {"b"}) == "mixed"
    assert batch_phase({"a": 1}, {}, {"a"}) == "prefill"                     # a one-token prompt
    assert batch_phase({}, {}, set()) == "unknown"
    out = types.SimpleNamespace(total_num_scheduled_tokens=10, num_scheduled_tokens={"a": 1, "b": 9},
                                scheduled_spec_decode_tokens={}, scheduled_new_reqs=[types.SimpleNamespace(req_id="b")])
    assert step_facts(out) == (10, "mixed")
    assert step_facts(object()) == (0, "unknown")


@pytest.mark.parametrize("per_request, new_ids, spec", [
    ({"a": 1, "b": 1, "c": 1}, [], {}),          # decode: the shortcut
    ({"a": 2, "b": 0, "c": 1}, [], {}),          # as many tokens as requests, yet not one each
    ({"a": 1, "b": 1}, ["b"], {}),               # a new one-token prompt
    ({"a": 3, "b": 1}, [], {"a": [5, 6]}),       # speculative tokens
    ({"a": 1, "b": 4}, [], {}),
])
def test_step_facts_agree_with_batch_phase(per_request, new_ids, spec):
    """The per-step shortcut for a decode batch gives batch_phase's answer on every batch."""
    out = types.SimpleNamespace(total_num_scheduled_tokens=sum(per_request.values()), num_scheduled_tokens=per_request,
                                scheduled_spec_decode_tokens=spec,
                                scheduled_new_reqs=[types.SimpleNamespace(req_id=r) for r in new_ids])
    assert step_facts(out) == (sum(per_request.values()), batch_phase(per_request, spec, set(new_ids)))


class _Binding:
    def __init__(self, fail: bool = False):
        self.calls: list[str] = []
        self.fail = fail
        self.monitor = types.SimpleNamespace(_note_failure=lambda message: self.calls.append(f"failure {message}"))

    def begin(self, scheduler_output):
        self.calls.append(f"begin {scheduler_output}")
        if self.fail:
            raise RuntimeError("boom")

    def end(self):
        self.calls.append("end")


def _runner_module(binding):
    class GPUModelRunner:
        def load_model(self):
            self.model = "loaded"

        def execute_model(self, scheduler_output):
            binding.calls.append("forward")
            return "output"

    module = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    module.GPUModelRunner = GPUModelRunner
    return module


@pytest.mark.parametrize("fail", [False, True])
def test_runner_wrapping_marks_steps_and_never_breaks_the_runner(fail):
    binding = _Binding(fail)
    module = _runner_module(binding)
    patch_module(module, bind=lambda runner: binding, on_commit=lambda: None)
    patch_module(module, bind=lambda runner: binding, on_commit=lambda: None)   # twice: wrapped once
    runner = module.GPUModelRunner()
    runner.load_model()
    assert runner.model == "loaded" and runner._moe_binding is binding
    assert runner.execute_model("s1") == "output"
    expected = ["begin s1", "forward", "end"]
    if fail:
        expected.insert(1, "failure step begin: RuntimeError: boom")
    assert binding.calls == expected


def test_a_binding_that_cannot_bind_leaves_the_model_serving():
    binding = _Binding()
    module = _runner_module(binding)

    def refuse(runner):
        raise ValueError("no MoE layer")
    patch_module(module, bind=refuse, on_commit=lambda: None)
    runner = module.GPUModelRunner()
    runner.load_model()
    assert runner._moe_binding is False and runner.execute_model("s") == "output" and binding.calls == ["forward"]


def test_eplb_commits_are_noted():
    module = types.ModuleType("vllm.distributed.eplb.eplb_state")
    module._commit_eplb_maps = lambda *a: "committed"
    noted = []
    patch_module(module, bind=lambda r: None, on_commit=lambda: noted.append(1))
    assert module._commit_eplb_maps(1, 2) == "committed" and noted == [1]


def test_scope_travels_with_the_step_and_bad_scopes_are_refused():
    import numpy as np

    from moe_monitor import core
    rec = core.StepRecord(run="r", rank=1, world_size=4, step=3, time_s=1.0, phase="decode", tokens=2,
                          counts_LE=np.ones((2, 4), dtype=np.int32), scope="dp-group")
    fields = core.encode_step(rec)
    assert core.decode_step(fields).scope == "dp-group"
    assert "scope" not in core.encode_step(core.StepRecord(**{**rec.__dict__, "scope": "rank"}))
    assert core.decode_step({k: v for k, v in fields.items() if k != "scope"}).scope == "rank"   # older records
    with pytest.raises(ValueError, match="scope"):
        core.decode_step({**fields, "scope": "everyone"})
    with pytest.raises(ValueError, match="scope"):
        core.encode_step(core.StepRecord(**{**rec.__dict__, "scope": "nobody"}))


def test_a_monitor_takes_the_engines_publisher_numbering():
    from moe_monitor.collectors import ExpertLoadMonitor, MonitorOptions

    mon = ExpertLoadMonitor(2, 4, 1, rank=2, world_size=4, scope="dp-group", nvml=False)
    assert (mon.rank, mon.world_size, mon.scope, mon.meta.world_size) == (2, 4, "dp-group", 4)
    for bad in ({"rank": 1}, {"rank": 4, "world_size": 4}, {"rank": -1, "world_size": 2}, {"scope": "all"}):
        with pytest.raises(ValueError):
            MonitorOptions(**bad)


def test_fp8_quantized_experts_weigh_one_byte():
    from moe_monitor.collectors.vllm.rules import weight_bytes

    assert weight_bytes("fp8", 2) == 1 and weight_bytes("FBGEMM_FP8", 2) == 1
    assert weight_bytes(None, 2) == 2 and weight_bytes("awq", 2) == 2 and weight_bytes("", 4) == 4
