"""The Megatron-Core hook's counting (collectors/megatron.py) on router outputs Megatron's own routers do not make,
published to the tests' private Redis and read back.

Megatron-Core is not installed here (it lives in .venv-frameworks): the test puts in sys.modules the two names the
collector imports from it, a `Router` module class and `parallel_state` not initialised. Each router returns a
(probs, routing_map) pair the test chose; everything else (the hook, the counter, the publisher) is the
collector's own.
"""
from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest
import torch

from moe_monitor.collectors.megatron import attach_megatron
from tests.support.published import published_steps

E, K, N = 8, 2, 12   # experts, top-k, tokens of one forward


class Router(torch.nn.Module):
    """Stands for megatron.core.transformer.moe.router.Router: returns the (probs, routing_map) it was given."""

    def __init__(self, config, layer_number: int, output):
        super().__init__()
        self.config, self.layer_number, self.output = config, layer_number, output

    def forward(self, hidden):
        return self.output


@pytest.fixture
def megatron_names(monkeypatch):
    """sys.modules entries for `megatron.core.parallel_state` and `megatron.core.transformer.moe.router`."""
    parallel_state = types.SimpleNamespace(model_parallel_is_initialized=lambda: False)
    router = types.ModuleType("megatron.core.transformer.moe.router")
    router.Router = Router
    core = types.ModuleType("megatron.core")
    core.parallel_state = parallel_state
    for name, module in (("megatron", types.ModuleType("megatron")), ("megatron.core", core),
                         ("megatron.core.parallel_state", parallel_state),
                         ("megatron.core.transformer", types.ModuleType("megatron.core.transformer")),
                         ("megatron.core.transformer.moe", types.ModuleType("megatron.core.transformer.moe")),
                         ("megatron.core.transformer.moe.router", router)):
        monkeypatch.setitem(sys.modules, name, module)


def config(num_layers: int = 2) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_moe_experts=E, moe_router_topk=K, num_layers=num_layers, moe_layer_freq=1,
                                 hidden_size=16, moe_ffn_hidden_size=32, params_dtype=torch.float32,
                                 moe_pad_expert_input_to_capacity=False)


def model_of(*routers: Router) -> torch.nn.Module:
    model = torch.nn.Module()
    model.embed = torch.nn.Linear(4, 4)
    model.routers = torch.nn.ModuleList(routers)
    return model


def top_k_map(seed: int) -> torch.Tensor:
    """A router's map: exactly K distinct experts per token."""
    scores = torch.rand(N, E, generator=torch.Generator().manual_seed(seed))
    return torch.zeros(N, E, dtype=torch.bool).scatter(1, scores.topk(K, dim=1).indices, True)


def one_step(model, redis_url: str, run: str):
    """Attach, run every router once as one step, publish; (monitor, record, stats, warning texts)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = attach_megatron(model, redis_url=redis_url, run=run, nvml=False)
        hidden = torch.zeros(N, 4)
        for router in model.routers:
            router(hidden)
        monitor.end_step()
        monitor.close()
    (record,) = published_steps(redis_url, run)
    return monitor, record, monitor.stats(), [str(w.message) for w in caught if w.category is RuntimeWarning]


def test_a_map_with_every_expert_set_is_counted_whole_and_said(megatron_names, redis_url):
    """Layer 1 routes K=2 experts per token, layer 2's map marks all 8 (no pad-to-capacity): each layer counts
    what its map marks (24 and 96 picks; it used to be 24 on two experts), and the step says layer 2 marked more
    than top-k."""
    normal = top_k_map(0)
    full = torch.ones(N, E, dtype=torch.bool)
    model = model_of(Router(config(), 1, (normal.float(), normal)), Router(config(), 2, (full.float(), full)))
    monitor, record, stats, said = one_step(model, redis_url, "mcore-full-map")
    assert record.counts_LE.tolist() == [normal.sum(0).tolist(), full.sum(0).tolist()]
    assert record.counts_LE.sum(axis=1).tolist() == [N * K, N * E]
    assert stats["hook_errors"] == 1 and any("more than top-k=2 each" in line for line in said)
    assert "layer decoder.layers.1: the routing map marks 96 experts for 12 tokens, more than top-k=2" in \
        stats["last_error"]


def test_a_float_map_is_refused_and_said(megatron_names, redis_url):
    """A router returning probabilities where the bool map goes: not counted (it counted 0 silently), said per
    call in hook_errors and last_error; the other layer counts as usual."""
    normal = top_k_map(1)
    probs = torch.softmax(torch.rand(N, E, generator=torch.Generator().manual_seed(2)), dim=1)
    model = model_of(Router(config(), 1, (probs, normal)), Router(config(), 2, (probs, probs)))
    monitor, record, stats, said = one_step(model, redis_url, "mcore-float-map")
    assert record.counts_LE[0].tolist() == normal.sum(0).tolist()
    assert record.counts_LE[1].tolist() == [0] * E
    assert stats["hook_errors"] == 1 and any("not the bool" in line for line in said)
    assert "layer decoder.layers.1: ValueError: routing_map is torch.float32 [12, 8], not the bool" in \
        stats["last_error"]


def test_routers_sharing_a_layer_number_get_a_row_each(megatron_names, redis_url):
    """Two routers both numbered 1 (its config says 2 layers): one row each, named by module path, and said at
    attach time and in the metadata (it put 48 in one row and 0 in the other)."""
    first, second = top_k_map(3), top_k_map(4)
    model = model_of(Router(config(), 1, (first.float(), first)), Router(config(), 1, (second.float(), second)))
    monitor, record, stats, said = one_step(model, redis_url, "mcore-shared-number")
    assert record.counts_LE.tolist() == [first.sum(0).tolist(), second.sum(0).tolist()]
    assert any("routers.0, routers.1 share a layer_number" in line for line in said)
    assert monitor.layer_names == ["routers.0", "routers.1"]
    assert monitor.meta.extra["layer_numbering"].startswith("routers routers.0, routers.1 share a layer_number")
    assert np.array_equal(record.counts_LE.sum(axis=1), [N * K, N * K])
    assert stats["hook_errors"] == 0
