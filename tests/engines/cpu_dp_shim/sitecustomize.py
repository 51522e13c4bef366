"""Test-only: the two collectives vLLM 0.32's CPU communicator lacks for data parallelism (all_gatherv and
reduce_scatterv raise NotImplementedError there), written with plain torch.distributed calls on its group, so
that tests/engines/test_vllm_parallel.py can run data_parallel_size=2 on the CPU build and check the plugin's
counts of every DP rank. Loaded through PYTHONPATH (sitecustomize runs in every process vLLM starts) only by
that test; nothing else of the plugin or of vLLM changes. Not for serving.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TARGET = "vllm.distributed.device_communicators.cpu_communicator"


def all_gatherv(self, input_, dim=0, sizes=None):
    import torch
    import torch.distributed as dist

    tensors = input_ if isinstance(input_, list) else [input_]
    out = []
    for tensor in tensors:
        moved = tensor.movedim(dim, 0).contiguous()
        rows = sizes or [moved.shape[0]] * self.world_size
        padded = torch.zeros((max(rows),) + tuple(moved.shape[1:]), dtype=moved.dtype)
        padded[: moved.shape[0]] = moved
        parts = [torch.empty_like(padded) for _ in rows]
        dist.all_gather(parts, padded, group=self.device_group)
        out.append(torch.cat([part[:n] for part, n in zip(parts, rows)]).movedim(0, dim))
    return out if isinstance(input_, list) else out[0]


def reduce_scatterv(self, input_, dim=-1, sizes=None):
    import torch.distributed as dist

    moved = input_.movedim(dim, 0).contiguous().clone()
    rows = sizes or [moved.shape[0] // self.world_size] * self.world_size
    dist.all_reduce(moved, group=self.device_group)
    start = sum(rows[: self.rank_in_group])
    return moved[start:start + rows[self.rank_in_group]].movedim(0, dim).contiguous()


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                module.CpuCommunicator.all_gatherv = all_gatherv
                module.CpuCommunicator.reduce_scatterv = reduce_scatterv
        spec.loader = _Loader()
        return spec


sys.meta_path.insert(0, _Patch())
