"""On-device expert counting: one flat int64 buffer per monitor, one host copy per step.

Shape legend (README, Conventions): L MoE layers, E logical experts, K top-k, N tokens (a step's tokens, or
its sampled rows: at most sample_tokens of them per layer).

The step buffer (int64, allocated once on the model's device) holds, back to back:
    counts_LE [L*E]      tokens routed to each expert this step (index_add_, no host sync)
    sample_LNK [L*N*K]   top-k ids of the step's n <= N sampled tokens in every layer (first n rows valid)
    sample_valid_N [N]   1 where the sampled token is a real (non-padding) token
    tokens [1]           real tokens in the step (counted on the device only under a padding mask)
At the step boundary the whole buffer is copied once into a host slot (pinned memory on CUDA, with an
event the publisher thread waits on), folded into the running total and zeroed on the device. Device ops:
per layer an index_add_ and, when sampling, one copy of the sampled rows (plus a clamp on CUDA); per step
the copy, the add and the zeroing (plus a fill of the sampled rows with -1 before a step whose rows are
published, and a few more under a padding mask). Nothing here ever waits for the device.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class HostSlot:
    """A host copy of one step buffer; `ready` is a CUDA event (None on the CPU)."""

    buf: torch.Tensor
    ready: torch.cuda.Event | None

    def wait(self) -> np.ndarray:
        """The host copy (a numpy view), once the device has finished writing it."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.buf.numpy()


def _mark_static(tensor: torch.Tensor) -> None:
    """Tell torch.compile the tensor keeps its address: a counter mutated inside a compiled graph must not
    make mode="reduce-overhead" skip CUDA graphs."""
    mark = getattr(torch._dynamo, "mark_static_address", None)
    if mark is not None and tensor.device.type == "cuda":
        mark(tensor)


@dataclass(frozen=True)
class StepFacts:
    """What the host knows of a step without reading the device: tokens (-1: never begun), whether a padding
    mask applied (then the real token count is on the device), and how many tokens were sampled."""

    tokens: int
    masked: bool
    sample_n: int


class DeviceCounter:
    """Counters for L layers x E experts on `device`, with N sampled token rows of width K per layer."""

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
        self._n_counts, self._n_sample = L * E, L * N * K
        self.size = self._n_counts + self._n_sample + N + 1
        self.buf = torch.zeros(self.size, dtype=torch.int64, device=self.device)
        self.counts_LE = self.buf[: self._n_counts].view(L, E)
        self.sample_LNK = self.buf[self._n_counts: self._n_counts + self._n_sample].view(L, N, K)
        self.sample_valid_N = self.buf[self._n_counts + self._n_sample: self.size - 1]
        self.tokens = self.buf[self.size - 1:]
        self.total_LE = torch.zeros(L, E, dtype=torch.int64, device=self.device)
        self._count_rows = list(self.counts_LE.unbind(0))      # per-layer views, made once
        self._sample_rows = list(self.sample_LNK.unbind(0))
        self.src_buf = torch.ones(1024, dtype=torch.int64, device=self.device)  # per-(token, slot) weights
        self._src_ones_upto = self.src_buf.numel()  # src_buf[:this] holds ones
        self.step_tokens, self.step_masked, self.step_sample_n = -1, False, 0
        self._clamp_ids = self.device.type == "cuda"
        self.sample_LNK.fill_(-1)
        self._recorders = [self.recorder(layer) for layer in range(L)]
        for tensor in (self.buf, self.src_buf, self.total_LE):
            _mark_static(tensor)

    # ------------------------------------------------------------------ hot path (inside the forward)
    def begin_step(self, num_tokens: int, token_mask_N: torch.Tensor | None) -> None:
        """Called once per step (on the host, outside any compiled or captured graph) before the layers run.
        Writes the per-(token, slot) weights every layer of the step shares into the fixed buffer src_buf
        (the padding mask repeated k times, or ones; rewritten only when that changes), decides whether the
        step's sampled rows are published (one step in sample_every) and, under a padding mask, counts the
        real tokens on the device. The hooks read only fixed buffers, so a CUDA graph captured on any step
        replays correctly on every other."""
        if num_tokens <= 0:
            return
        self.step_tokens = num_tokens
        self.step_masked = token_mask_N is not None
        n = num_tokens * self.top_k
        if self.src_buf.numel() < n:
            self.src_buf = torch.ones(max(n, 2 * self.src_buf.numel()), dtype=torch.int64, device=self.device)
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

    def _sampled(self, rows_N: torch.Tensor) -> torch.Tensor:
        """The step's sampled rows of an [N, ...] tensor: every stride-th token from the middle of the first
        stride, stride = N // sample_tokens (at most sample_tokens rows; all N when N < sample_tokens).
        Systematic sampling that spreads over every sequence of the batch; a strided view computed from the
        tensor's own shape (no op)."""
        stride = max(1, rows_N.shape[0] // self.sample_tokens)
        return rows_N[stride // 2:: stride][: self.sample_tokens]

    def recorder(self, layer: int) -> Callable[[torch.Tensor], None]:
        """The hot path as a closure bound to one layer: record_ids(ids_NK) counts int64 [N, K] expert ids
        in [0, E) under the step's padding mask. Two device ops (index_add_ into the counts, one copy of the
        sampled rows, a strided view; the host publishes the rows of one step in sample_every) and it reads
        only fixed buffers and constants: nothing that changes from step to step, so torch.compile does not
        recompile and a captured CUDA graph stays right. On CUDA the ids are also clamped into [0, E) (a
        third op): an unexpected id must never become a device-side assert that takes the serving process
        down. Empty batches (idle ranks) and ids on another device (device_map="auto") are fine."""
        row_E, sample_NK = self._count_rows[layer], self._sample_rows[layer]
        K, E, device, clamp, sample = self.top_k, self.num_experts, self.device, self._clamp_ids, self.sample_tokens
        counter = self

        def record_ids(ids_NK: torch.Tensor) -> None:
            if ids_NK.shape[0] == 0:
                return
            if ids_NK.device != device:
                ids_NK = ids_NK.to(device, non_blocking=True)
            if clamp:
                ids_NK = ids_NK.clamp(0, E - 1)
            flat = ids_NK.reshape(-1)
            src = counter.src_buf
            if src.shape[0] < flat.shape[0]:  # more tokens than the step announced (or none announced)
                src = torch.ones_like(flat)
            row_E.index_add_(0, flat, src[: flat.shape[0]])
            if sample and ids_NK.shape[1] == K:
                rows = counter._sampled(ids_NK)
                sample_NK[: rows.shape[0]].copy_(rows)
        return record_ids

    def record(self, layer: int, ids_NK: torch.Tensor, valid_NK: torch.Tensor | None = None) -> None:
        """Add one layer's routing: ids_NK int64 [N, K] expert ids in [0, E); valid_NK [N, K] (bool or 0/1),
        when given, marks the (token, slot) pairs that count (their sampled rows read -1 otherwise; ids
        outside [0, E) are clamped, so they must be marked invalid)."""
        if valid_NK is None:
            self._recorders[layer](ids_NK)
            return
        if ids_NK.shape[0] == 0:
            return
        if ids_NK.device != self.device:
            ids_NK, valid_NK = ids_NK.to(self.device), valid_NK.to(self.device)
        ids_NK = ids_NK.clamp(0, self.num_experts - 1)
        self._count_rows[layer].index_add_(0, ids_NK.reshape(-1), valid_NK.reshape(-1).to(torch.int64))
        if self.sample_tokens and ids_NK.shape[1] == self.top_k:
            rows = self._sampled(ids_NK).masked_fill(self._sampled(valid_NK) == 0, -1)
            self._sample_rows[layer][: rows.shape[0]].copy_(rows)

    # ------------------------------------------------------------------ step boundary
    def snapshot(self, slot: HostSlot | None) -> StepFacts:
        """Copy the step buffer into `slot` (asynchronously on CUDA), fold it into the running total and
        reset it; returns what the host knows of the step. slot None: the step is not published but still
        counted in the total."""
        if slot is not None:
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):  # the copy and its event on the counter's own device
                    slot.buf.copy_(self.buf, non_blocking=True)
                    slot.ready = torch.cuda.Event(blocking=True)  # the publisher sleeps, not spins, on it
                    slot.ready.record()
            else:
                slot.buf.copy_(self.buf)
        self.total_LE.add_(self.counts_LE)
        self.buf.zero_()
        facts = StepFacts(self.step_tokens, self.step_masked, self.step_sample_n)
        if self.sample_tokens and self._steps_begun % self.sample_every == 0:
            self.sample_LNK.fill_(-1)  # the next step is published: rows a layer does not write read -1
        self.step_tokens, self.step_masked, self.step_sample_n = -1, False, 0
        return facts

    def new_slot(self) -> HostSlot:
        """A host copy of the step buffer to snapshot into (pinned memory on CUDA)."""
        pin = self.device.type == "cuda"
        return HostSlot(torch.empty(self.size, dtype=torch.int64, pin_memory=pin), None)

    def unpack(self, flat: np.ndarray, facts: StepFacts) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Host copy of a step buffer -> (counts_LE int64 [L, E], sample_LNK int64 [L, n, K] of the real
        sampled tokens (-1 rows for a layer that did not run), or None when nothing was sampled, tokens:
        the real tokens, or -1 when the step was never begun)."""
        L, E, N, K = self.num_layers, self.num_experts, self.sample_tokens, self.top_k
        counts = flat[: self._n_counts].reshape(L, E).copy()
        tokens = int(flat[-1]) if facts.masked else facts.tokens
        sample = None
        n = facts.sample_n
        if n:
            rows = flat[self._n_counts: self._n_counts + self._n_sample].reshape(L, N, K)[:, :n, :].copy()
            rows[counts.sum(axis=1) == 0] = -1
            if facts.masked:
                rows = rows[:, flat[self._n_counts + self._n_sample: self._n_counts + self._n_sample + n] != 0]
            sample = rows if rows.shape[1] else None
        return counts, sample, tokens
