"""The vLLM plugin's physical-load path without vLLM (its CPU build cannot run EPLB): EplbState.step wrapped on a
class of our own shaped like vLLM's (recent: model_states[name].expert_load_pass [L, P]; older: on the state),
the pass load read before the step zeroes it and published by the binding as the open step's physical record
into a real redis-server; dummy and profile steps skipped; a local-experts-only shape turns it off, said once."""
from __future__ import annotations

import types

import numpy as np
import redis
import torch

from moe_monitor import core
from moe_monitor.collectors import ExpertLoadMonitor
from moe_monitor.collectors.vllm import _eplb_pass
from moe_monitor.collectors.vllm.binding import BINDINGS, RunnerBinding, pass_load
from moe_monitor.collectors.vllm.patch import patch_module, step_flags


class EplbState:
    """Like vLLM's: one model state with expert_load_pass [L, P], copied to the window and zeroed by step()."""

    def __init__(self, load_LP):
        self.model_states = {"main": types.SimpleNamespace(expert_load_pass=torch.tensor(load_LP))}
        self.window = []

    def step(self, is_dummy: bool = False, is_profile: bool = False, log_stats: bool = False) -> None:
        for model_state in self.model_states.values():
            if not is_dummy:
                self.window.append(model_state.expert_load_pass.clone())
            model_state.expert_load_pass.zero_()


def _binding(mon: ExpertLoadMonitor, state: EplbState) -> RunnerBinding:
    """A RunnerBinding around mon for a runner holding state (the parts physical_pass uses)."""
    binding = RunnerBinding.__new__(RunnerBinding)
    binding.monitor, binding.runner = mon, types.SimpleNamespace(eplb_state=state)
    binding.in_step, binding.tokens, binding.physical_off = False, 0, ""
    return binding


def test_step_flags_and_pass_load():
    assert step_flags((), {}) == (False, False)
    assert step_flags((True,), {}) == (True, False)
    assert step_flags((object(), False, True), {}) == (False, True)   # older vLLM: step(model, is_dummy, ...)
    assert step_flags((), {"is_dummy": True}) == (True, False)
    state = EplbState([[1, 2, 3, 4]])
    assert pass_load(state, 1) is state.model_states["main"].expert_load_pass and pass_load(state, 2) is None
    old = types.SimpleNamespace(expert_load_pass=torch.zeros(3, 8))
    assert pass_load(old, 3) is old.expert_load_pass


def test_each_real_pass_is_published_before_eplb_zeroes_it(redis_url):
    module = types.ModuleType("vllm.distributed.eplb.eplb_state")
    module.EplbState = EplbState
    patch_module(module, bind=lambda runner: None, on_commit=lambda: None, on_pass=_eplb_pass)
    patch_module(module, bind=lambda runner: None, on_commit=lambda: None, on_pass=_eplb_pass)  # twice: once
    state = EplbState([[3, 1, 0, 2], [1, 1, 4, 0]])
    mon = ExpertLoadMonitor(2, 4, 1, redis_url=redis_url, run="vphys", gpus=2, nvml=False)
    binding = _binding(mon, state)
    BINDINGS.append(binding)
    try:
        binding.in_step, binding.tokens = True, 6          # inside execute_model: the runner's eplb_step()
        state.step()
        state.step(True)                                   # a dummy step: not published
        state.step(is_profile=True)
        mon.end_step("decode", tokens=6)
        binding.in_step = False
        state.model_states["main"].expert_load_pass += 5
        state.step()                                       # outside a step (warm-up): not published
        binding.in_step, binding.tokens = True, 1
        state.model_states["main"].expert_load_pass = torch.zeros(2, 2, dtype=torch.int64)  # local experts only
        state.step()
        state.step()
        assert binding.physical_off.startswith("physical counts are [2, 2]")
    finally:
        BINDINGS.remove(binding)
        mon.close()
    client = redis.Redis.from_url(redis_url)
    got = [core.decode_physical(f) for _, f in client.xrange(core.physical_key("vphys"))]
    client.close()
    assert [(r.step, r.rank, r.source) for r in got] == [(0, 0, "vllm")]
    np.testing.assert_array_equal(got[0].counts_LP, [[3, 1, 0, 2], [1, 1, 4, 0]])
    np.testing.assert_array_equal(state.window[0], [[3, 1, 0, 2], [1, 1, 4, 0]])  # vLLM's own step still ran


def test_a_binding_that_does_not_publish_its_own_tokens_stays_off():
    state = EplbState([[1, 1]])
    binding = _binding(types.SimpleNamespace(num_layers=1, step=0), state)
    binding.physical_off, binding.in_step, binding.tokens = "scope dp-group", True, 3
    binding.physical_pass(state)  # would raise AttributeError on the fake monitor if it tried to record
