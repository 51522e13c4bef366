"""Which layout requests the EP runtime applies: every entry of the run's requests stream is judged here, on rank
0's watch thread, before any rank sees it. No torch, no I/O: fields in, a verdict out.

In order: it decodes ("refused: malformed"); names this run, is signed with the shared secret and has not
expired (core.layout_requests.judge_request: "another run" / "bad signature" / "expired"); it was issued after
this engine started and its nonce is new ("replayed": NonceBook); slots per rank and replicas per expert within
EPConfig.max_slots_per_rank / max_replicas_per_expert ("too large"); a layout of this model over these ranks
("does not fit"; vLLM's -1, a slot holding no expert, fits).

Shape legend (README, Conventions): L MoE layers, E logical experts, P physical slots.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core.layout_requests import Judgement, LayoutRequest, decode_layout_request, judge_request
from moe_monitor.core.request_status import REFUSED_FIT, REFUSED_MALFORMED, REFUSED_REPLAYED, REFUSED_SIZE

MAX_REMEMBERED_NONCES = 4096  # nonces kept until their request expires; beyond this, the oldest go first


@dataclass(frozen=True)
class RequestRules:
    """What a request must match: the run, its model (L layers, E experts) over `ranks` ranks, and the bounds on
    what a rank can hold: max_slots_per_rank slots, max_replicas_per_expert replicas of one expert in a layer."""

    run: str
    num_layers: int
    num_experts: int
    ranks: int
    max_slots_per_rank: int
    max_replicas_per_expert: int


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check: its stream entry id, the request, its map as int64 [L, P]."""

    request_id: str
    request: LayoutRequest
    layout_LP: np.ndarray


class NonceBook:
    """What this engine counts as seen: every request issued before since_s (unix s, when it started watching:
    made for an earlier engine, or a copy of one), and the nonces of signed requests already judged, each kept
    until its request expires; at most `capacity`, the soonest to expire forgotten first. unsaved: the nonces
    seen() noted that the watch has not yet persisted (restore() notes one read back from there)."""

    def __init__(self, capacity: int = MAX_REMEMBERED_NONCES, since_s: float = -math.inf):
        self._expires_s: dict[str, float] = {}
        self._capacity = capacity
        self.since_s = since_s
        self.unsaved: list[tuple[str, float]] = []

    def seen(self, nonce: str, expires_s: float, now_s: float) -> bool:
        """Whether nonce was noted before (and has not expired); notes it (and adds it to unsaved) otherwise."""
        if nonce in self._expires_s:
            return True
        self.restore(nonce, expires_s, now_s)
        self.unsaved.append((nonce, expires_s))
        del self.unsaved[:-self._capacity]
        return False

    def restore(self, nonce: str, expires_s: float, now_s: float) -> None:
        """Note nonce as seen until expires_s, making room as seen() does."""
        if nonce in self._expires_s:
            return
        if len(self._expires_s) >= self._capacity:
            self._expires_s = {n: t for n, t in self._expires_s.items() if t > now_s}
            while len(self._expires_s) >= self._capacity:
                del self._expires_s[min(self._expires_s, key=self._expires_s.__getitem__)]
        self._expires_s[nonce] = expires_s


def size_judgement(num_slots: int, rules: RequestRules, layout_LP: np.ndarray | None = None) -> Judgement:
    """"refused: too large" when P slots put more than max_slots_per_rank on a rank, or (with the map, int
    [L, P]) a layer gives one expert more than max_replicas_per_expert slots; else ok."""
    per_rank = -(-num_slots // rules.ranks)
    if per_rank > rules.max_slots_per_rank:
        return Judgement(REFUSED_SIZE, f"{num_slots} slots put {per_rank} on a rank; this engine holds at most "
                                       f"{rules.max_slots_per_rank} per rank")
    if layout_LP is not None and layout_LP.size:
        replicas = max(int(np.bincount(row[row >= 0]).max(initial=0)) for row in layout_LP)  # -1: an unused slot
        if replicas > rules.max_replicas_per_expert:
            return Judgement(REFUSED_SIZE, f"an expert has {replicas} replicas in a layer; this engine allows at "
                                           f"most {rules.max_replicas_per_expert}")
    return Judgement("")


def fit_judgement(request: LayoutRequest, rules: RequestRules) -> Judgement:
    """"refused: does not fit" unless the map is a layout of this model over these ranks."""
    record = request.record
    if record.gpus != rules.ranks:
        return Judgement(REFUSED_FIT, f"the layout is for {record.gpus} GPUs, this engine has {rules.ranks} ranks")
    try:
        core.check_layout_map(record.layout_LP, rules.ranks, 1, rules.num_layers, rules.num_experts, unused=True)
    except ValueError as exc:
        return Judgement(REFUSED_FIT, str(exc))
    return Judgement("")


def judge_entry(fields: dict, rules: RequestRules, secret: bytes | None, now_s: float,
                nonces: NonceBook) -> tuple[LayoutRequest | None, Judgement]:
    """(the decoded request or None, the verdict) of one requests-stream entry (module docstring). Decoding is
    bounded by the wire's own limits (core/keys.py: L x P <= MAX_CELLS), so it costs at most a few MB."""
    try:
        request = decode_layout_request(fields)
    except ValueError as exc:
        return None, Judgement(REFUSED_MALFORMED, str(exc))
    judged = judge_request(request, rules.run, secret, now_s)
    if not judged.ok:
        return request, judged
    if request.issued_s < nonces.since_s:
        return request, Judgement(REFUSED_REPLAYED, f"it was issued {nonces.since_s - request.issued_s:.1f} s "
                                                    "before this engine started: a request made for an earlier "
                                                    "engine is not applied by a later one (send it again)")
    if nonces.seen(request.nonce, request.expires_s, now_s):
        return request, Judgement(REFUSED_REPLAYED, f"request {request.nonce} was read before")
    layout_LP = request.record.layout_LP
    for judged in (size_judgement(layout_LP.shape[1], rules, layout_LP), fit_judgement(request, rules)):
        if not judged.ok:
            return request, judged
    return request, Judgement("")
