"""On-device expert counting: one flat int32 buffer per monitor, one host copy per step (DeviceCounter).

The step buffer (STEP_DTYPE, allocated once on the model's device) holds, back to back:
    counts_LE1 [L*(E+1)]  tokens routed to each expert this step; column E: ids outside [0, E) (invalid ids)
    sample_LNK [L*N*K]    top-k ids of the step's n <= N sampled tokens in every layer (first n rows valid)
    sample_valid_N [N]    1 where the sampled token is a real (non-padding) token
    tokens [1]            real tokens in the step (counted on the device only under a padding mask)
Per layer a clamp into [-1, E] and a put_ (accumulate); per step one copy into a host slot, folded into the
int64 running total. Nothing here waits for the device. Shapes: L layers, E experts, K top-k, N sampled tokens.
Why int32, the CPU step boundary and CUDA streams: docs/collectors.md.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

UNPACK_CHUNK_BYTES = 64 << 10  # step buffers unpacked together at most (DeviceCounter.unpack)
STEP_DTYPE = torch.int32       # the step buffer's type (module docstring); the running total is int64


# ------------------------------------------------------------------ the host's side of a step buffer
@dataclass(eq=False)
class HostSlot:
    """A host copy of one step buffer; `ready` is a CUDA event (None on the CPU); `view`: buf as numpy (the
    same memory); `unfolded`: on the CPU, a step copied here and not yet added into the running total
    (DeviceCounter.fold)."""

    buf: torch.Tensor
    ready: torch.cuda.Event | None

    def __post_init__(self) -> None:
        self.view: np.ndarray = self.buf.numpy()
        self.bytes = byte_view(self.view)  # the same memory, for snapshot()'s copy on the CPU
        self.unfolded = False

    def wait(self) -> np.ndarray:
        """The host copy (a numpy view), once the device has finished writing it."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.view


def byte_view(array: np.ndarray) -> memoryview:
    """A C-contiguous array's memory as bytes: a slice assignment into it is one memcpy."""
    return array.data.cast("B") if array.size else memoryview(bytearray())


class StreamOrder:
    """Orders the counter's per-step ops across CUDA streams: join() makes the stream current now wait for
    the stream the previous join() saw (a device-side wait, no host sync). `current` returns the current
    stream; any object with wait_stream() and == will do (the CPU tests pass stand-ins)."""

    def __init__(self, current: Callable[[], Any]):
        self._current = current
        self.last: Any = None

    def join(self) -> None:
        stream = self._current()
        last = self.last
        if last is not None and last != stream:
            stream.wait_stream(last)
        self.last = stream


class StepFacts(NamedTuple):
    """What the host knows of a step without reading the device: tokens (-1: never begun), whether a padding
    mask applied (then the real token count is on the device), and how many tokens were sampled. A tuple: made
    at every step's end on the model's thread, where a frozen dataclass costs a few microseconds more."""

    tokens: int
    masked: bool
    sample_n: int


# ------------------------------------------------------------------ the counter

def _mark_static(tensor: torch.Tensor) -> None:
    """Tell torch.compile the tensor keeps its address: a counter mutated inside a compiled graph must not
    make mode="reduce-overhead" skip CUDA graphs."""
    mark = getattr(torch._dynamo, "mark_static_address", None)
    if mark is not None and tensor.device.type == "cuda":
        mark(tensor)


def _gathered(rows: list[np.ndarray]) -> np.ndarray:
    """rows (1-D, one length) as one [S, X] array to read: a view of the one row when there is one (what is read
    from it is copied anyway), else a stacked copy."""
    return rows[0][None] if len(rows) == 1 else np.stack(rows)


@dataclass(frozen=True)
class Unpacked:
    """A step read back on the host: counts_LE int32 [L, E]; invalid: ids outside [0, E) over all layers;
    sample_LNK int32 [L, n, K] of the real sampled tokens (-1 for a layer that did not run and for invalid
    ids), or None; tokens: the real tokens, or -1 when the step was never begun."""

    counts_LE: np.ndarray
    invalid: int
    sample_LNK: np.ndarray | None
    tokens: int


class DeviceCounter:
    """Counters for L layers x E experts (+ one invalid-id column) on `device`, with N sampled token rows of
    width K per layer."""

    def __init__(self, num_layers: int, num_experts: int, top_k: int, device: torch.device | str,
                 sample_tokens: int = 16, sample_every: int = 4):
        if num_layers < 1 or num_experts < 1 or top_k < 1 or sample_tokens < 0 or sample_every < 1:
            raise ValueError(f"bad counter shape: layers={num_layers} experts={num_experts} top_k={top_k} "
                             f"sample_tokens={sample_tokens} sample_every={sample_every} (each >= 1, "
                             f"sample_tokens >= 0)")
        self.num_layers, self.num_experts, self.top_k = num_layers, num_experts, top_k
        self.sample_tokens, self.sample_every = sample_tokens, sample_every
        self._steps_begun = 0
        self.device = torch.device(device)
        L, E, N, K = num_layers, num_experts, sample_tokens, top_k
        E1 = E + 1
        self._n_counts, self._n_sample = L * E1, L * N * K
        self.size = self._n_counts + self._n_sample + N + 1
        self.dtype = STEP_DTYPE
        self.buf = torch.zeros(self.size, dtype=self.dtype, device=self.device)
        self.counts_LE1 = self.buf[: self._n_counts].view(L, E1)
        self.counts_LE = self.counts_LE1[:, :E]
        self.sample_LNK = self.buf[self._n_counts: self._n_counts + self._n_sample].view(L, N, K)
        self.sample_valid_N = self.buf[self._n_counts + self._n_sample: self.size - 1]
        self.tokens = self.buf[self.size - 1:]
        self.total_LE1 = torch.zeros(L, E1, dtype=torch.int64, device=self.device)
        self.total_LE = self.total_LE1[:, :E]
        self._count_rows = list(self.counts_LE1.unbind(0))      # per-layer views [E + 1], made once
        self._sample_rows = list(self.sample_LNK.unbind(0))
        self.src_buf = self.ones(1024)  # per-(token, slot) weights
        self._src_ones_upto = self.src_buf.numel()  # src_buf[:this] holds ones
        self.step_tokens, self.step_masked, self.step_sample_n = -1, False, 0
        self.streams: StreamOrder | None = None
        if self.device.type == "cuda":
            cuda_device = self.device
            self.streams = StreamOrder(lambda: torch.cuda.current_stream(cuda_device))
        self.sample_LNK.fill_(-1)
        self._pending: list[tuple[int, torch.Tensor]] = []  # the eager CPU path's ids of the open step
        self._pending_batched = True
        self._pending_cap = 4 * L
        self._layer_index_L11 = torch.arange(L, device=self.device).view(L, 1, 1)
        # on the CPU the step boundary's buffer ops go through numpy views of the same memory: a few hundred ns
        # each, where a torch op costs 2 us hot and 10-20 us when it is the first of a step in a vLLM worker; the
        # copy and the resets of every step through byte views (memoryview slice assignment, a memcpy in the
        # interpreter's own code: about 1 us with cold caches, where a numpy call costs 3-5 us)
        self._host_views = ((self.buf.numpy(), self.counts_LE1.numpy(), self.total_LE1.numpy(),
                             self.sample_LNK.numpy()) if self.device.type == "cpu" else None)
        self._host_bytes = ((byte_view(self._host_views[0]), byte_view(np.zeros_like(self._host_views[0])),
                             byte_view(self._host_views[3]), byte_view(np.full_like(self._host_views[3], -1)))
                            if self._host_views is not None else None)
        self._slots: list[HostSlot] = []  # every slot new_slot() made (running_total() adds the unfolded ones)
        self._fold_lock = threading.Lock()
        self._direct = [self._direct_recorder(layer) for layer in range(L)]
        self._recorders = [self.recorder(layer) for layer in range(L)]
        for tensor in (self.buf, self.src_buf, self.total_LE1):
            _mark_static(tensor)

    # ------------------------------------------------------------------ hot path (inside the forward)
    def begin_step(self, num_tokens: int, token_mask_N: torch.Tensor | None) -> None:
        """Called once per step (on the host, outside any compiled or captured graph) before the layers run.
        Writes the per-(token, slot) weights every layer of the step shares into the fixed buffer src_buf
        (the padding mask repeated k times, or ones; rewritten only when that changes), decides whether the
        step's sampled rows are published (one step in sample_every) and, under a padding mask, counts the
        real tokens on the device. The hooks read only fixed buffers, so a CUDA graph captured on any step
        replays correctly on every other. On CUDA the current stream first waits for the stream of the
        previous step's snapshot (module docstring)."""
        if num_tokens <= 0:
            return
        if self._pending:
            self.flush()  # a step that was never closed: its ids are counted under its own weights
        if self.streams is not None:
            self.streams.join()
        self.step_tokens = num_tokens
        self.step_masked = token_mask_N is not None
        n = num_tokens * self.top_k
        if self._src_ones_upto < n and self.src_buf.numel() < n:
            self.src_buf = self.ones(max(n, 2 * self.src_buf.numel()))
            _mark_static(self.src_buf)
            self._src_ones_upto = self.src_buf.numel()
        if token_mask_N is not None:
            self.tokens.add_(token_mask_N.sum())
            self.src_buf[:n].view(num_tokens, self.top_k).copy_(token_mask_N.unsqueeze(1))
            self._src_ones_upto = 0
        elif self._src_ones_upto < n:
            self.src_buf[:n].fill_(1)
            self._src_ones_upto = n
        sampled = bool(self.sample_tokens) and self._steps_begun % self.sample_every == 0
        self._steps_begun += 1
        self.step_sample_n = min(self.sample_tokens, num_tokens) if sampled else 0
        if token_mask_N is not None and self.step_sample_n:
            self.sample_valid_N[: self.step_sample_n].copy_(self._sampled(token_mask_N))

    def ones(self, n: int) -> torch.Tensor:
        """[n] ones of the step buffer's type on the counter's device: the weights a put_ into it adds."""
        return torch.ones(n, dtype=self.dtype, device=self.device)

    def _sampled(self, rows_N: torch.Tensor) -> torch.Tensor:
        """The step's sampled rows of an [N, ...] tensor: every stride-th token from the middle of the first
        stride, stride = N // sample_tokens (at most sample_tokens rows; all N when N < sample_tokens).
        Systematic sampling that spreads over every sequence of the batch; one strided view computed from
        the tensor's own shape (no op)."""
        num, take = rows_N.shape[0], self.sample_tokens
        stride = max(1, num // take)
        start = stride // 2
        return rows_N[start: min(num, start + stride * take): stride]

    def recorder(self, layer: int) -> Callable[[torch.Tensor], None]:
        """The hot path as a closure bound to one layer: record_ids(ids_NK) counts int64 [N, K] expert ids
        under the step's padding mask. In eager mode on the CPU it only keeps a reference to the ids: the
        step's layers are counted together when the step closes (flush(): one stack, one clamp and one
        index_put_ for all layers instead of three ops per layer; 91 -> 21 us per step for 8 layers of
        16 x 8 ids here). Anywhere else (CUDA, or inside torch.compile's tracing) it counts at once
        (direct(), below), so a compiled or captured graph holds the counting ops themselves."""
        direct = self._direct[layer]
        counter, device, cpu = self, self.device, self.device.type == "cpu"

        def record_ids(ids_NK: torch.Tensor) -> None:
            if ids_NK.shape[0] == 0:
                return
            if cpu and ids_NK.device == device and not torch.compiler.is_compiling():
                counter._defer(layer, ids_NK)
                return
            direct(ids_NK)
        return record_ids

    def _direct_recorder(self, layer: int) -> Callable[[torch.Tensor], None]:
        """record_ids counting at once. Two device ops (a clamp of the ids into [-1, E] and a put_ with
        accumulate into the layer's row of E + 1 counters: -1 wraps to column E, so an id outside [0, E) is
        counted as invalid, never as an expert, on every device and without a host sync), plus one copy of
        the sampled rows (a strided view of the clamped ids; the host publishes the rows of one step in
        sample_every). It reads only fixed buffers and constants: nothing that changes from step to step,
        so torch.compile does not recompile and a captured CUDA graph stays right. An unexpected id never
        becomes a device-side assert. Empty batches (idle ranks) and ids on another device
        (device_map="auto") are fine."""
        row_E1, sample_NK = self._count_rows[layer], self._sample_rows[layer]
        K, E, N, device, sample = self.top_k, self.num_experts, self.sample_tokens, self.device, self.sample_tokens
        counter = self

        def record_ids(ids_NK: torch.Tensor) -> None:
            if ids_NK.shape[0] == 0:
                return
            if ids_NK.device != device:
                ids_NK = ids_NK.to(device, non_blocking=True)
            ids = ids_NK.clamp(-1, E)
            n = ids.numel()
            src = counter.src_buf
            if src.shape[0] < n:  # more tokens than the step announced (or none announced)
                src = counter.ones(n)
            row_E1.put_(ids, src[:n], accumulate=True)
            if sample and ids.shape[1] == K:
                rows = counter._sampled(ids)
                (sample_NK if rows.shape[0] == N else sample_NK[: rows.shape[0]]).copy_(rows)
        return record_ids

    def _defer(self, layer: int, ids_NK: torch.Tensor) -> None:
        """Keep one layer's ids [N, K] (a reference, no op) until flush()."""
        pending = self._pending
        if pending:
            self._pending_batched = (self._pending_batched and layer == len(pending)
                                     and ids_NK.shape == pending[0][1].shape)
        else:
            self._pending_batched = layer == 0
        pending.append((layer, ids_NK))
        if len(pending) >= self._pending_cap:  # a caller that never closes a step: count what is kept
            self.flush()

    def flush(self) -> None:
        """Count the ids the eager CPU path kept (recorder()). Layers 0..M-1 recorded once each, in order, with
        one shape [N, K] (every forward of a standard model): stacked [M, N, K], clamped into [-1, E] and
        added into counts_LE1 with one index_put_ (accumulate; -1 wraps to column E, the invalid ids), the
        step's per-(token, slot) weights src_buf broadcast over the layers; the sampled rows, on a step whose
        rows are published, in one copy. Anything else: each layer as direct() counts it."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if not self._pending_batched:
            for layer, ids_NK in pending:
                self._direct[layer](ids_NK)
            return
        ids_MNK = torch.stack([ids_NK for _, ids_NK in pending]).clamp_(-1, self.num_experts)
        M, num, width = ids_MNK.shape
        n = num * width
        src = self.src_buf if self.src_buf.shape[0] >= n else self.ones(n)
        self.counts_LE1.index_put_((self._layer_index_L11[:M], ids_MNK), src[:n].view(num, width),
                                   accumulate=True)
        if self.step_sample_n and width == self.top_k:
            rows_MnK = self._sampled(ids_MNK.transpose(0, 1)).transpose(0, 1)
            self.sample_LNK[:M, : rows_MnK.shape[1]].copy_(rows_MnK)

    def record(self, layer: int, ids_NK: torch.Tensor, valid_NK: torch.Tensor | None = None) -> None:
        """Add one layer's routing: ids_NK int64 [N, K] expert ids; valid_NK [N, K] (bool or 0/1), when given,
        marks the (token, slot) pairs that count (their sampled rows read -1 otherwise). Ids outside [0, E)
        of pairs that count are counted as invalid (column E), never as an expert."""
        if valid_NK is None:
            self._recorders[layer](ids_NK)
            return
        if ids_NK.shape[0] == 0:
            return
        if ids_NK.device != self.device:
            ids_NK, valid_NK = ids_NK.to(self.device), valid_NK.to(self.device)
        ids_NK = ids_NK.clamp(-1, self.num_experts)
        self._count_rows[layer].put_(ids_NK, valid_NK.to(self.dtype).reshape(-1), accumulate=True)
        if self.sample_tokens and ids_NK.shape[1] == self.top_k:
            rows = self._sampled(ids_NK).masked_fill(self._sampled(valid_NK) == 0, -1)
            self._sample_rows[layer][: rows.shape[0]].copy_(rows)

    # ------------------------------------------------------------------ step boundary
    def snapshot(self, slot: HostSlot | None) -> StepFacts:
        """Copy the step buffer into `slot` (asynchronously on CUDA, on the current stream once it has waited
        for the step's stream), fold it into the running total and reset it; returns what the host knows of
        the step. slot None: the step is not published but still counted in the total. On the CPU a step copied
        into a slot is folded later, by whoever is done with the slot (fold(): the publisher thread), so that the
        model's thread does two memcpys a step (the copy and the reset) and no numpy call."""
        if self._pending:
            self.flush()
        if self.streams is not None:
            self.streams.join()
        published_next = self.sample_tokens and self._steps_begun % self.sample_every == 0
        if self._host_bytes is not None and self._host_views is not None:  # the CPU: byte views (__init__)
            buf, zeros, sample, minus_ones = self._host_bytes
            if slot is not None:
                if slot.unfolded:  # a slot used again before anyone folded it: its step is not lost
                    self.fold(slot)
                slot.bytes[:] = buf
                slot.unfolded = True
            else:  # no slot: into the total now
                _, counts, total, _ = self._host_views
                with self._fold_lock:
                    np.add(total, counts, out=total)
            buf[:] = zeros
            if published_next:
                sample[:] = minus_ones
        else:
            if slot is not None and self.device.type == "cuda":
                with torch.cuda.device(self.device):  # the copy and its event on the counter's own device
                    slot.buf.copy_(self.buf, non_blocking=True)
                    slot.ready = torch.cuda.Event(blocking=True)  # the publisher sleeps, not spins, on it
                    slot.ready.record()
            elif slot is not None:
                slot.buf.copy_(self.buf)
            self.total_LE1.add_(self.counts_LE1)
            self.buf.zero_()
            if published_next:
                self.sample_LNK.fill_(-1)  # the next step is published: rows a layer does not write read -1
        facts = StepFacts(self.step_tokens, self.step_masked, self.step_sample_n)
        self.step_tokens, self.step_masked, self.step_sample_n = -1, False, 0
        return facts

    def fold(self, slot: HostSlot) -> None:
        """Add the step snapshot() copied into `slot` on the CPU into the running total, once (any thread; call it
        before the slot is used again). Nothing to do on a device, where snapshot() adds it there at once."""
        if slot.unfolded and self._host_views is not None:
            total = self._host_views[2]
            with self._fold_lock:
                if slot.unfolded:
                    np.add(total, slot.view[: self._n_counts].reshape(total.shape), out=total)
                    slot.unfolded = False

    def running_total(self) -> torch.Tensor:
        """int64 [L, E + 1] on the device: every closed step and the open one (column E: invalid ids). On CUDA
        the current stream first waits for the counting stream; on the CPU the steps that wait in host slots
        (not yet folded) are added here."""
        self.flush()
        if self.streams is not None:
            self.streams.join()
        if self._host_bytes is None:
            return self.total_LE1 + self.counts_LE1
        with self._fold_lock:
            total = self.total_LE1 + self.counts_LE1
            for slot in self._slots:
                if slot.unfolded:
                    total += torch.from_numpy(slot.view[: self._n_counts]).view(total.shape)
        return total

    def new_slot(self) -> HostSlot:
        """A host copy of the step buffer to snapshot into (pinned memory on CUDA)."""
        pin = self.device.type == "cuda"
        slot = HostSlot(torch.empty(self.size, dtype=self.dtype, pin_memory=pin), None)
        self._slots.append(slot)
        return slot

    def unpack(self, flats: Sequence[np.ndarray], facts: Sequence[StepFacts]) -> list[Unpacked]:
        """Host copies of S step buffers (each STEP_DTYPE [size]) -> one Unpacked each (counts, invalid ids, sampled
        rows, tokens). The S steps are read with a few numpy ops in all, not a dozen each: on a decode step of a
        small model the ops' fixed cost, not the bytes, is what a step costs the publisher. Steps are stacked up
        to UNPACK_CHUNK_BYTES of buffers at a time (a DeepSeek-V3-sized step, 179 kB, goes alone: stacking
        large buffers would only add copies)."""
        chunk = max(1, UNPACK_CHUNK_BYTES // (8 * self.size))  # a large model's steps go one by one
        if len(flats) > chunk:
            return [step for first in range(0, len(flats), chunk)
                    for step in self.unpack(flats[first: first + chunk], facts[first: first + chunk])]
        if not flats:
            return []
        L, E, N, K = self.num_layers, self.num_experts, self.sample_tokens, self.top_k
        n_counts, n_sample = self._n_counts, self._n_sample
        counts_SLE1 = _gathered([flat[:n_counts] for flat in flats]).reshape(len(flats), L, E + 1)
        counts_SLE = counts_SLE1[:, :, :E].astype(np.int32)
        invalid_S = counts_SLE1[:, :, E].sum(axis=1).tolist()
        sampled = [s for s, fact in enumerate(facts) if fact.sample_n]
        rows_by_step: dict[int, np.ndarray] = {}
        if sampled:
            rows_sLNK = np.stack([flats[s][n_counts: n_counts + n_sample] for s in sampled]).reshape(-1, L, N, K)
            rows_sLNK[rows_sLNK == E] = -1  # an invalid id is no expert
            ran_SL = counts_SLE1.sum(axis=2) != 0
            rows_sLNK[~ran_SL[sampled]] = -1  # a layer that did not run
            rows_by_step = dict(zip(sampled, rows_sLNK))
        steps = []
        for s, (flat, fact) in enumerate(zip(flats, facts)):
            tokens = int(flat[-1]) if fact.masked else fact.tokens
            sample = None
            if fact.sample_n:
                n = fact.sample_n
                rows = rows_by_step[s][:, :n, :]
                if fact.masked:
                    rows = rows[:, flat[n_counts + n_sample: n_counts + n_sample + n] != 0]
                sample = rows if rows.shape[1] else None
            steps.append(Unpacked(counts_SLE[s], invalid_S[s], sample, tokens))
        return steps
