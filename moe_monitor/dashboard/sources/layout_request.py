"""Ask a running engine to switch layouts: XADD a core.LayoutRecord with source "apply" to the run's layout
requests stream (core.layout_requests_key). A runtime able to move experts (the CPU EP runtime, demo/ep) picks it
up and publishes the change it makes to the layouts stream, from the step it takes force; readers of the run's
layout history never read requests. Used by the What-if page's "Apply to the running engine" and by
`moe-monitor apply`. No Streamlit, no torch: wire, numpy and a redis client.
"""
from __future__ import annotations

import time

import numpy as np

from moe_monitor import core

REQUESTS_MAXLEN = 1000  # the requests stream is trimmed (approximately) to this many entries


def next_step(client, run: str) -> int:
    """The run's newest published step id + 1 (0 when none is published)."""
    last = client.xrevrange(core.steps_key(run), count=1)
    return core.decode_step(last[0][1]).step + 1 if last else 0


def request_layout(client, run: str, layout_LP, instance: str) -> core.LayoutRecord:
    """XADD layout_LP (int [L, P]) as an "apply" request at the run's next step, checked against the run's
    metadata (layers, experts, P a multiple of its GPUs); returns the record. ValueError when the run has no
    metadata or the layout does not fit it; the client's Redis errors are raised as they are."""
    raw = client.get(core.meta_key(core.check_run_name(run)))
    if raw is None:
        raise ValueError(f"run {run!r} has no metadata in Redis (is it running, under this name?)")
    meta = core.decode_meta(raw)
    record = core.LayoutRecord(run=run, step=next_step(client, run), time_s=time.time(),
                               physical_to_logical_LP=np.asarray(layout_LP, dtype=np.int32),
                               gpus=meta.layout.gpus, nodes=meta.layout.nodes, source="apply", instance=instance)
    record.validate(meta.num_experts, num_layers=len(meta.layer_names))
    client.xadd(core.layout_requests_key(run), core.encode_layout_record(record), maxlen=REQUESTS_MAXLEN,
                approximate=True)
    return record
