"""On-device expert counting: one flat int64 buffer per monitor, one host copy per step.

Shape legend: L MoE layers, E logical experts, K top-k, T tokens in a step, N sampled tokens per layer.

The step buffer (int64, allocated once on the model's device) holds, back to back:
    counts_LE [L*E]      tokens routed to each expert this step (scatter_add_, no host sync)
    sample_LNK [L*N*K]   top-k ids of the step's N sampled tokens in every layer (-1 = not sampled)
    sample_valid_N [N]   1 where the sampled token is a real (non-padding) token
    tokens [1]           real tokens in the step
At the step boundary the whole buffer is copied once into a host slot (pinned memory on CUDA, with an
event the writer thread waits on), then zeroed on the device. Nothing here ever waits for the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class HostSlot:
    """A host copy of one step buffer; `ready` is a CUDA event (None on the CPU)."""

    buf: torch.Tensor
    ready: "torch.cuda.Event | None"

    def wait(self) -> np.ndarray:
        if self.ready is not None:
            self.ready.synchronize()
        return self.buf.numpy()


class DeviceCounter:
    """Counters for L layers x E experts on `device`, with N sampled token rows of width K per layer."""

    def __init__(self, num_layers: int, num_experts: int, top_k: int, device: torch.device | str,
                 sample_tokens: int = 16):
        if num_layers < 1 or num_experts < 1 or top_k < 1 or sample_tokens < 0:
            raise ValueError(f"bad counter shape: layers={num_layers} experts={num_experts} top_k={top_k} "
                             f"sample_tokens={sample_tokens}")
        self.num_layers, self.num_experts, self.top_k = num_layers, num_experts, top_k
        self.sample_tokens = sample_tokens
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
        self.sample_idx_N: torch.Tensor | None = None
        self.sample_LNK.fill_(-1)

    # ------------------------------------------------------------------ hot path (inside the forward)
    def begin_step(self, num_tokens: int, token_mask_T: torch.Tensor | None) -> None:
        """Called once per step before the layers run: counts real tokens, picks the sampled tokens."""
        if token_mask_T is None:
            self.tokens.add_(num_tokens)
        else:
            self.tokens.add_(token_mask_T.sum())
        n = min(self.sample_tokens, num_tokens)
        if n == 0:
            self.sample_idx_N = None
            return
        idx = torch.randperm(num_tokens, device=self.device)[:n]
        self.sample_idx_N = idx
        if token_mask_T is None:
            self.sample_valid_N[:n].fill_(1)
        else:
            self.sample_valid_N[:n].copy_(token_mask_T.index_select(0, idx))

    def record(self, layer: int, ids_TK: torch.Tensor, valid_TK: torch.Tensor | None = None) -> None:
        """Add one layer's routing: ids_TK int64 [T, K] expert ids; valid_TK [T, K] (bool or 0/1) marks the
        (token, slot) pairs that count. Pairs outside [0, E) must be masked by the caller."""
        flat = ids_TK.reshape(-1)
        if valid_TK is None:
            src = torch.ones_like(flat)
        else:
            src = valid_TK.reshape(-1).to(torch.int64)
        self.counts_LE[layer].scatter_add_(0, flat, src)
        idx = self.sample_idx_N
        if idx is not None and ids_TK.shape[0] >= idx.shape[0] and ids_TK.shape[1] == self.top_k:
            rows = ids_TK.index_select(0, idx)
            if valid_TK is not None:
                rows = rows.masked_fill(valid_TK.index_select(0, idx) == 0, -1)
            self.sample_LNK[layer, : idx.shape[0]].copy_(rows)

    # ------------------------------------------------------------------ step boundary
    def snapshot(self, slot: HostSlot | None) -> None:
        """Copy the step buffer into `slot` (asynchronously on CUDA), fold it into the running total and
        reset it. slot None: the step is dropped from the stream but still counted in the total."""
        if slot is not None:
            on_cuda = self.device.type == "cuda"
            slot.buf.copy_(self.buf, non_blocking=on_cuda)
            if on_cuda:
                slot.ready = torch.cuda.Event()
                slot.ready.record()
        self.total_LE.add_(self.counts_LE)
        self.buf.zero_()
        self.sample_LNK.fill_(-1)
        self.sample_idx_N = None

    def new_slot(self) -> HostSlot:
        pin = self.device.type == "cuda"
        return HostSlot(torch.empty(self.size, dtype=torch.int64, pin_memory=pin), None)

    def unpack(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Host copy of a step buffer -> (counts_LE int64 [L, E], sample_LNK int64 [L, n, K] with rows of
        padding tokens set to -1, or None when nothing was sampled, tokens)."""
        L, E, N, K = self.num_layers, self.num_experts, self.sample_tokens, self.top_k
        counts = flat[: self._n_counts].reshape(L, E).copy()
        tokens = int(flat[-1])
        sample = None
        if N:
            valid = flat[self._n_counts + self._n_sample: self.size - 1].astype(bool)
            rows = flat[self._n_counts: self._n_counts + self._n_sample].reshape(L, N, K)
            keep = np.flatnonzero(valid)
            if keep.size:
                sample = rows[:, keep, :].copy()
        return counts, sample, tokens
