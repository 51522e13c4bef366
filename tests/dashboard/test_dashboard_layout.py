"""Layout resolution: run metadata, contiguous default, overrides, SGLang layout JSON."""
import json

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.layout import resolve_layout
from tests.support.synthfill import make_meta


def test_default_without_meta_is_contiguous():
    lay = resolve_layout(None, num_layers=2, num_experts=16)
    assert (lay.gpus, lay.nodes, lay.slots_per_gpu) == (16, 1, 1) and lay.origin == "contiguous default"


def test_meta_layout_and_overrides():
    meta = make_meta("m", 2, 8, gpus=4, nodes=2)
    lay = resolve_layout(meta, 2, 8)
    assert (lay.gpus, lay.nodes, lay.gpus_per_node, lay.origin) == (4, 2, 2, "run metadata")
    assert lay.node_of(3) == 1
    lay = resolve_layout(meta, 2, 8, gpus=2, gpus_per_node=1)
    assert (lay.gpus, lay.nodes, lay.slots_per_gpu) == (2, 2, 4) and "override" in lay.origin
    with pytest.raises(ValueError, match="do not split evenly"):
        resolve_layout(meta, 2, 8, gpus=3)
    with pytest.raises(ValueError, match="nodes of 3"):
        resolve_layout(meta, 2, 8, gpus_per_node=3)


def test_uploaded_sglang_json_with_replicas():
    rows = core.parse_layout_json(json.dumps({"physical_to_logical_map": [[0, 1, 2, 3, 0, 1]] * 2}))
    lay = resolve_layout(make_meta("m", 2, 4, gpus=2), 2, 4, gpus=3, uploaded=rows)
    assert lay.origin == "uploaded JSON" and lay.slots_per_gpu == 2
    np.testing.assert_array_equal(lay.layout_LP[0], [0, 1, 2, 3, 0, 1])
    with pytest.raises(ValueError, match="layout has 2 layers"):
        resolve_layout(None, 3, 4, gpus=2, uploaded=rows)


@pytest.mark.parametrize("text", ["{", '{"layout": []}', '{"physical_to_logical_map": [[0, "a"]]}'])
def test_bad_layout_json(text):
    with pytest.raises(ValueError):
        core.parse_layout_json(text)
