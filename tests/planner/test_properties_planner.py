"""Property tests (hypothesis) for the planner's inputs: whatever a file or a caller hands it, the planner answers
with a result that obeys its invariants or with one ValueError, never another exception.

- load_counts on arbitrary JSON documents (and nested lists of numbers of any shape) written to a file;
- load_layout on arbitrary JSON;
- plan() on small arbitrary arrays, G, R, policies and node/group splits.
"""
from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moe_monitor.core.counts import MAX_COUNT_SUM
from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.planner.api import POLICIES, plan
from moe_monitor.planner.io import load_counts, load_layout
from moe_monitor.planner.loads import duplicates_on_gpu
from tests.support.properties import property_settings

SETTINGS = property_settings()

# JSON scalars as files hold them: NaN and Infinity too (Python writes them, json.loads reads them back)
scalars = (st.none() | st.booleans() | st.integers(min_value=-(10 ** 400), max_value=10 ** 400)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
json_docs = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                         | st.dictionaries(st.sampled_from(["logical_count", "x", "counts"]), inner, max_size=3),
                         max_leaves=40)
# numbers in the awkward corners: zero, subnormal, tiny, huge, near the float maximum, negative, non-finite
numbers = st.one_of(st.integers(0, 1000), st.sampled_from([0.0, 5e-324, 1e-310, 1e-31, 1e-29, 1e29, 1e31, 1e308, -1.0]),
                    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10 ** 20))


def nested_numbers(depth: int):
    """Rectangular-or-not nested lists of numbers, `depth` levels deep (1..4)."""
    leaf = st.lists(numbers, min_size=0, max_size=6)
    for _ in range(depth - 1):
        leaf = st.lists(leaf, min_size=0, max_size=3)
    return leaf


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("props")


def check_counts(arr: np.ndarray) -> None:
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float64 and arr.ndim in (2, 3) and arr.size > 0
    assert np.isfinite(arr).all() and (arr >= 0).all() and arr.sum() <= MAX_COUNT_SUM


def write_and_load(path, doc):
    path.write_text(json.dumps(doc))
    try:
        arr = load_counts(path)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    check_counts(arr)


@SETTINGS
@given(doc=json_docs)
def test_load_counts_on_any_json_document(scratch, doc):
    write_and_load(scratch / "doc.json", doc)


@SETTINGS
@given(depth=st.integers(1, 4), data=st.data(), wrap=st.booleans())
def test_load_counts_on_nested_number_lists(scratch, depth, data, wrap):
    doc = data.draw(nested_numbers(depth))
    write_and_load(scratch / "nested.json", {"logical_count": doc} if wrap else doc)


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_load_counts_on_any_bytes(scratch, raw):
    path = scratch / "raw.json"
    path.write_bytes(raw)
    with contextlib.suppress(ValueError):
        check_counts(load_counts(path))


layout_rows = st.lists(st.lists(st.one_of(st.integers(-3, 40), st.integers(-(10 ** 30), 10 ** 30), scalars),
                                max_size=8), max_size=4)


@SETTINGS
@given(doc=st.one_of(json_docs, st.builds(lambda rows: {"physical_to_logical_map": rows}, layout_rows)))
def test_load_layout_on_any_json(scratch, doc):
    path = scratch / "layout.json"
    path.write_text(json.dumps(doc))
    try:
        lay = load_layout(path)
    except ValueError:
        return
    assert lay.dtype == np.int64 and lay.ndim == 2 and lay.shape[1] > 0 and (lay >= 0).all()


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def plan_inputs(draw):
    """Mostly plannable inputs (G x S slots, E between S and G x S, so every GPU can hold S distinct experts),
    some of them bent out of shape: wrong R or G, negative, non-finite, huge or tiny counts, bad decay/recent."""
    G, S = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    E = draw(st.integers(S, G * S))
    R = G * S - E
    if draw(st.integers(0, 9)) == 0:                            # about one case in ten: G or R off
        G, R = G + draw(st.integers(-2, 1)), R + draw(st.integers(-2, 2))
    windows = draw(st.sampled_from([None, None, 1, 2, 3]))
    L = draw(st.integers(1, 3))
    shape = (L, E) if windows is None else (windows, L, E)
    size = int(np.prod(shape))
    kind = draw(st.sampled_from(["ints", "ints", "skewed", "skewed", "wild"]))
    if kind == "ints":                                          # zeros make idle (dense) layers and dead experts
        counts = np.array(draw(st.lists(st.sampled_from([0, 0, 1, 7, 1000]) | st.integers(0, 10 ** 6),
                                        min_size=size, max_size=size)), dtype=np.int64).reshape(shape)
    elif kind == "skewed":
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
        counts = rng.pareto(1.2, size=shape) * draw(st.sampled_from([1e-290, 1e-25, 1e-3, 1.0, 1e6, 1e25, 1e290]))
    else:
        counts = np.array(draw(st.lists(numbers, min_size=size, max_size=size)), dtype=np.float64).reshape(shape)
    policy = draw(st.sampled_from(POLICIES))
    hier = None
    if draw(st.booleans()) and G >= 1 and R >= 0:
        nodes = draw(st.sampled_from([d for d in divisors(G) if R % d == 0]))
        groups = [q for q in divisors(E) if q % nodes == 0]
        hier = (nodes, draw(st.sampled_from(groups))) if groups else (nodes, nodes + 1)
    decay = draw(st.sampled_from([1.0] * 6 + [0.5, 0.8, 1e-9, 0.0, 2.0, math.nan]))
    recent = draw(st.sampled_from([16] * 6 + [1, 2, 0, -1]))
    return counts, G, R, policy, hier, decay, recent


@SETTINGS
@given(args=plan_inputs())
def test_plan_on_small_arbitrary_inputs(args):
    counts, G, R, policy, hier, decay, recent = args
    nodes, groups = hier if hier else (None, None)
    try:
        res = plan(counts, G, R, nodes=nodes, groups=groups, policy=policy, decay=decay, recent=recent)
    except ValueError as exc:
        assert str(exc)
        return
    E = counts.shape[-1]
    L = counts.shape[-2]
    lay = res.layout_LP
    assert lay.shape == (L, E + R) and lay.dtype.kind == "i"
    assert lay.min() >= 0 and lay.max() < E
    assert (replica_counts(lay, E) >= 1).all(), "an expert has no slot"
    assert (res.replicas_LE == replica_counts(lay, E)).all()
    if res.policy != "eplb":
        assert not duplicates_on_gpu(lay, G).any(), "two replicas of one expert on one GPU"
    assert np.isfinite(res.imbalance_L).all() and (res.imbalance_L >= 1 - 1e-9).all()
    assert np.isfinite(res.bound_L).all() and (res.imbalance_L >= res.bound_L - 1e-6).all()
    json.dumps(res.to_json(), allow_nan=False)  # the CLI writes strict JSON
