"""A TensorRT-LLM EXPERT_STATISTIC_PATH folder made the way TensorRT-LLM's ExpertStatistic makes it
(NVIDIA/TensorRT-LLM tensorrt_llm/_torch/expert_statistic.py, the writer, and
examples/wide_ep/ep_load_balancer/utils.py, its reader; read for these facts, no code taken):

- each MoE layer's forward calls maybe_add_info(num_slots, token_selected_slots): the int32 [tokens, k] ids
  (expert ids when the load balancer is off, slot ids when it is on) are counted with
  torch.bincount(ids.flatten(), minlength=num_slots) and added into records["{iter}_{layer}"] (int64 [num_slots];
  an older version cast the counts to int32);
- while EXPERT_STATISTIC_ITER_RANGE "start-stop" holds the iteration (start <= iter < stop);
- rank 0 writes meta_info.json {"num_experts": num_slots, "num_experts_per_token": k} (a later variant, with
  EXPERT_STATISTIC_DUMP_DISPATCH and EXPERT_STATISTIC_EP_SIZE, adds "ep_size" and "experts_per_rank");
- every rank writes safetensors.torch.save_file(records, f"{path}/rank{rank}.safetensors") (its own tokens:
  TensorRT-LLM's reader sums the rank files key by key), and in dispatch mode rank{rank}_numtokens.json
  {"{iter}_{layer}": tokens}; one variant also writes rank{rank}_raw.safetensors (the raw ids per key), which
  TensorRT-LLM's reader leaves out.

Shape legend: R ranks, T iterations, L layers, N tokens, K top-k, E slots.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.torch
import torch


class ExpertStatisticWriter:
    """One rank's recorder: set_iter / set_layer / add(ids) as the model calls them, save() at the stop."""

    def __init__(self, rank: int, start: int, stop: int, dump_dispatch: bool = False, ep_size: int | None = None,
                 counts_dtype: torch.dtype = torch.int64, raw: bool = False):
        self.rank, self.start, self.stop = rank, start, stop
        self.dump_dispatch, self.ep_size, self.counts_dtype, self.raw = dump_dispatch, ep_size, counts_dtype, raw
        self.iter: int | None = None
        self.layer: int | None = None
        self.meta_info: dict | None = None
        self.records: dict[str, torch.Tensor] = {}
        self.raw_records: dict[str, torch.Tensor] = {}
        self.num_tokens: dict[str, int] = {}

    def add(self, num_slots: int, ids_NK: torch.Tensor) -> None:
        if self.iter is None or not self.start <= self.iter < self.stop:
            return
        if self.meta_info is None:
            self.meta_info = {"num_experts": num_slots, "num_experts_per_token": ids_NK.size(-1)}
        counts = torch.bincount(ids_NK.flatten(), minlength=num_slots).to(self.counts_dtype)
        key = f"{self.iter}_{self.layer}"
        self.records[key] = counts if key not in self.records else self.records[key] + counts
        if self.raw:
            self.raw_records[key] = ids_NK.contiguous()
        if self.dump_dispatch:
            self.num_tokens[key] = self.num_tokens.get(key, 0) + int(ids_NK.size(0))

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            meta_info = dict(self.meta_info or {})
            if self.dump_dispatch and self.ep_size is not None:
                meta_info["ep_size"] = self.ep_size
                meta_info["experts_per_rank"] = meta_info["num_experts"] // self.ep_size
            (path / "meta_info.json").write_text(json.dumps(meta_info))
        safetensors.torch.save_file(self.records, str(path / f"rank{self.rank}.safetensors"))
        if self.raw:
            safetensors.torch.save_file(self.raw_records, str(path / f"rank{self.rank}_raw.safetensors"))
        if self.dump_dispatch:
            (path / f"rank{self.rank}_numtokens.json").write_text(json.dumps(self.num_tokens))


def write_statistic(path: Path, ids_RTLNK: list, layers: list[int], num_slots: int, start: int,
                    **writer_args) -> np.ndarray:
    """Run one writer per rank over ids_RTLNK[r][t][l] (int32 [N, K] ids of rank r, iteration start + t, layer
    layers[l]) and save the folder. Returns the truth: int64 [T, L, E] counts summed over the ranks."""
    num_iters = len(ids_RTLNK[0])
    truth_TLE = np.zeros((num_iters, len(layers), num_slots), dtype=np.int64)
    for rank, ids_TLNK in enumerate(ids_RTLNK):
        writer = ExpertStatisticWriter(rank, start, start + num_iters, **writer_args)
        for t, ids_LNK in enumerate(ids_TLNK):
            writer.iter = start + t
            for li, layer in enumerate(layers):
                writer.layer = layer
                ids = torch.as_tensor(ids_LNK[li], dtype=torch.int32)
                writer.add(num_slots, ids)
                truth_TLE[t, li] += np.bincount(ids.numpy().ravel(), minlength=num_slots)
        writer.iter = start + num_iters  # the stop iteration: the writer saves
        writer.save(path)
    return truth_TLE


def random_ids(rng: np.random.Generator, ranks: int, iters: int, layers: int, num_slots: int, top_k: int,
               max_tokens: int = 40) -> list:
    """ids_RTLNK: skewed random top-k ids (distinct per token), a token count per (rank, iteration)."""
    weights = rng.dirichlet(np.full(num_slots, 0.3))
    out = []
    for _ in range(ranks):
        per_rank = []
        for _ in range(iters):
            tokens = int(rng.integers(1, max_tokens))  # the same tokens pass every layer of an iteration
            per_rank.append([np.stack([rng.choice(num_slots, size=top_k, replace=False, p=weights)
                                       for _ in range(tokens)]).astype(np.int32) for _ in range(layers)])
        out.append(per_rank)
    return out
