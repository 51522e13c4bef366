"""Ask a running engine to switch layouts: XADD a signed core LayoutRequest (a LayoutRecord with source "apply",
an expiry and an HMAC-SHA256 signature made with the apply secret: core/layout_requests.py) to the run's layout
requests stream (core.layout_requests_key). A runtime able to move experts (the CPU EP runtime, demo/ep) checks
it (run, signature, expiry, size), applies it or refuses it, says which on the run's status stream
(core.layout_request_status_key; read back by sources/request_status.py) and publishes the change it makes to
the layouts stream, from the step it takes force; readers of the run's layout history never read requests. Used
by the What-if page's "Apply to the running engine" and by `moe-monitor apply`. No Streamlit, no torch: wire,
numpy and a redis client.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core.layout_requests import DEFAULT_TTL_S, LayoutRequest, encode_layout_request, sign_request

REQUESTS_MAXLEN = 1000  # the requests stream is trimmed (approximately) to this many entries


@dataclass(frozen=True)
class SentRequest:
    """A request as sent: its stream entry id (the id the runtime's status names) and the request itself."""

    request_id: str
    request: LayoutRequest

    @property
    def record(self) -> core.LayoutRecord:
        return self.request.record


def next_step(client, run: str) -> int:
    """The run's newest published step id + 1 (0 when none is published)."""
    last = client.xrevrange(core.steps_key(run), count=1)
    return core.decode_step(last[0][1]).step + 1 if last else 0


def request_layout(client, run: str, layout_LP, instance: str, secret: bytes,
                   ttl_s: float = DEFAULT_TTL_S) -> SentRequest:
    """XADD layout_LP (int [L, P]) as an "apply" request at the run's next step, checked against the run's
    metadata (layers, experts, P a multiple of its GPUs), signed with secret and expiring ttl_s from now.
    ValueError when the run has no metadata, the layout does not fit it, or the secret or ttl_s is unusable; the
    client's Redis errors are raised as they are."""
    raw = client.get(core.meta_key(core.check_run_name(run)))
    if raw is None:
        raise ValueError(f"run {run!r} has no metadata in Redis (is it running, under this name?)")
    meta = core.decode_meta(raw)
    record = core.LayoutRecord(run=run, step=next_step(client, run), time_s=time.time(),
                               layout_LP=np.asarray(layout_LP, dtype=np.int32),
                               gpus=meta.layout.gpus, nodes=meta.layout.nodes, source="apply", instance=instance)
    record.validate(meta.num_experts, num_layers=len(meta.layer_names), unused=True)  # -1: the engine judges it
    request = sign_request(record, secret, ttl_s)
    entry_id = client.xadd(core.layout_requests_key(run), encode_layout_request(request), maxlen=REQUESTS_MAXLEN,
                           approximate=True)
    return SentRequest(entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id), request)
