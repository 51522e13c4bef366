"""SGLang's own expert-distribution recorder (sglang 0.5.23, in .venv-frameworks), driven on the CPU: each
rank process writes the stat, per_pass and per_token dumps with SGLang's code, and a truth file of what it fed.

    python -m tests.frameworks.sglang_support OUT_DIR --rank R --world 2 --port PORT

One process per expert-parallel rank, over gloo, as a DP-attention + DeepEP (normal) server runs: each rank
routes its own tokens. What is SGLang's here: the runtime config (RuntimeContext.override_server_args, SGLang's
own test hook: device cpu, moe_a2a_backend deepep, deepep_mode normal, ep_dispatch_algorithm static),
ExpertLocationMetadata (_compute_logical_to_all_physical_map and _init_raw, what init_by_mapping calls once it
has the model's layer and expert numbers; update() for a rebalance, as expert_location_updater does), the
routing (select_experts in layers/moe/topk.py, torch_native: top-k of the router logits, the static
logical -> physical dispatch, and its call of the recorder's on_select_experts), ForwardBatch / ForwardMode, and
the whole recorder (ExpertDistributionRecorder.init_new, start_record, with_forward_pass, with_current_layer,
dump_record: its gatherers, accumulators, all_reduce and torch.save). What is ours: the router logits
(random), and the loop over passes and layers that the model runner and the model code would run.

Three things stand between that code and a CPU-only machine, each met with the least that lets it run:
- sglang.srt.utils.common.get_device() raises "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform
  plugin is available." (the per_pass / stat gatherers call it): SGLANG_USE_CPU_ENGINE=1, SGLang's own switch
  for its CPU engine, is set by the caller.
- `import sglang.srt.eplb.expert_distribution` reaches sglang.srt.multimodal.internvl_utils, which imports
  torchvision.transforms at module level; PyPI's torchvision (0.28.0 and 0.29.x) is a CUDA 13 build that fails
  on the CPU torch ("RuntimeError: operator torchvision::nms does not exist"), and there is no CPU build to
  install. `_AbsentTorchvision` answers those imports with empty modules whose attributes raise if called;
  no torchvision code runs in the recorder. transformers is asked first, so it still sees no torchvision.
- The first stat dump calls torch.get_device_module().empty_cache(), absent on the CPU
  ("AttributeError: module 'torch.cpu' has no attribute 'empty_cache'"). SGLang clears its first-dump flag
  before that call and has not reset its buffer, so dump_record() is called again and writes the file; the
  error is recorded in the truth file.

Shapes: L MoE layers, E logical experts, P physical slots (G ranks x S slots), N tokens of a pass, K top-k.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

import torch

L, E, K = 3, 8, 3          # MoE layers, logical experts, top-k
G, S = 2, 6                # ranks (GPUs) and physical slots per rank: P = 12, 4 redundant slots
P = G * S
STAT_BUFFER = 4            # --expert-distribution-recorder-buffer-size: a ring of 4 rows
STAT_PASSES = 6            # more passes than rows: the ring wraps
CHUNKED_PREFILL = 8        # per_token keeps chunked_prefill_size * 8 = 64 tokens a pass
# physical_to_logical_map [L, P] before and after a rebalance: every expert in every layer, 4 of them twice
LAYOUT_A = [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3],
            [7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4],
            [0, 2, 4, 6, 1, 3, 5, 7, 0, 1, 0, 1]]
LAYOUT_B = [[3, 2, 1, 0, 7, 6, 5, 4, 3, 3, 3, 2],
            [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7],
            [7, 5, 3, 1, 6, 4, 2, 0, 7, 7, 6, 6]]
EXTEND, DECODE, IDLE = 1, 2, 4  # ForwardMode values (checked against SGLang's enum in run())


def tokens_of(rank: int, index: int) -> tuple[int, int]:
    """(tokens, forward mode) of pass `index` on `rank`: a prefill, then decodes, and on rank 1 an idle pass (DP
    attention gives an idle rank an empty batch; its MoE still runs)."""
    if index == 0:
        return 9 + 4 * rank, EXTEND
    if rank == 1 and index == 2:
        return 0, IDLE
    return 2 + rank + index % 3, DECODE


class _AbsentTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import torchvision...` with empty packages (module docstring): any attribute is a placeholder
    that raises when called."""

    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _EmptyModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


class _Placeholder:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is not installed (no CPU build exists for this torch)")


class _EmptyModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


def import_sglang() -> None:
    """Make `import sglang.srt...` work on the CPU torch (module docstring)."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        raise SystemExit("set SGLANG_USE_CPU_ENGINE=1 (SGLang's CPU engine switch) before starting this process")
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached as False before the placeholders exist
    sys.meta_path.insert(0, _AbsentTorchvision())


def _install_config(mode: str, report_mode: str):
    """Publish SGLang's runtime config for one recorder mode (its override_server_args test hook); returns the
    override (restore() it before the next mode)."""
    from sglang.srt.runtime_context import get_context

    override = get_context().override_server_args(
        device="cpu", tp_size=G, ep_size=G, enable_dp_attention=True, dp_size=G,
        moe_a2a_backend="deepep", deepep_mode="normal", ep_dispatch_algorithm="static",
        expert_distribution_recorder_mode=mode, expert_distribution_recorder_buffer_size=STAT_BUFFER,
        expert_balancedness_report_mode=report_mode, chunked_prefill_size=CHUNKED_PREFILL)
    override.install()
    return override


def _metadata(layout_LP: list[list[int]], rank: int):
    """SGLang's ExpertLocationMetadata of a physical_to_logical_map for this rank (what init_by_mapping builds)."""
    from sglang.srt.eplb import expert_location

    layout_LP = torch.tensor(layout_LP, dtype=torch.int64)
    every_physical = expert_location._compute_logical_to_all_physical_map(
        physical_to_logical_map=layout_LP, num_logical_experts=E, ep_size=G, moe_ep_rank=rank)
    return expert_location.ExpertLocationMetadata._init_raw(
        ep_size=G, physical_to_logical_map=layout_LP, logical_to_all_physical_map=every_physical,
        moe_ep_rank=rank)


def _forward_batch(num_tokens: int, forward_mode: int, first_position: int):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    positions_N = torch.arange(first_position, first_position + num_tokens)
    return ForwardBatch(
        forward_mode=ForwardMode(forward_mode), batch_size=1 if num_tokens else 0,
        input_ids=torch.randint(0, 1000, (num_tokens,)), req_pool_indices=torch.zeros(1, dtype=torch.int64),
        seq_lens=torch.tensor([first_position + num_tokens]), out_cache_loc=torch.arange(num_tokens),
        seq_lens_sum=first_position + num_tokens, positions=positions_N,
        extend_seq_lens_cpu=[num_tokens] if forward_mode == EXTEND else None)


def run_passes(recorder, rank: int, first_pass: int, passes: int, generator: torch.Generator) -> list[dict]:
    """Forward passes as the model runner and an MoE model make them: with_forward_pass, and per layer
    with_current_layer around what select_experts does once it has the top-k: SGLang's logical -> physical
    dispatch (topk_ids_logical_to_physical, static) and the recorder's on_select_experts(physical ids).
    Returns, per pass, what was routed: the logical ids (top-k of random logits) and the physical ids SGLang's
    dispatch chose, each int64 [L, N, K], and SGLang's balancedness of the pass (report mode on, rank 0)."""
    from sglang.srt.eplb.expert_location_dispatch import ExpertLocationDispatchInfo, topk_ids_logical_to_physical

    fed = []
    for index in range(passes):
        num_tokens, forward_mode = tokens_of(rank, index)
        batch = _forward_batch(num_tokens, forward_mode, first_position=16 * index)
        logical_LNK = torch.zeros((L, num_tokens, K), dtype=torch.int64)
        physical_LNK = torch.zeros((L, num_tokens, K), dtype=torch.int64)
        with recorder.with_forward_pass(first_pass + index, batch) as outputs:
            for layer in range(L):
                with recorder.with_current_layer(layer):
                    logits_NE = torch.randn((num_tokens, E), generator=generator)
                    topk_ids_NK = torch.topk(logits_NE, K, dim=1).indices.to(torch.int32)
                    physical_NK = topk_ids_logical_to_physical(topk_ids_NK, ExpertLocationDispatchInfo.init_new(layer))
                    recorder.on_select_experts(topk_ids=physical_NK)
                    logical_LNK[layer] = topk_ids_NK.long()
                    physical_LNK[layer] = physical_NK.long()
        metrics = outputs.get("metrics")
        fed.append({"forward_pass_id": first_pass + index, "forward_mode": forward_mode,
                    "logical_ids": logical_LNK, "physical_ids": physical_LNK,
                    "sglang_balancedness": None if metrics is None else float(metrics.eplb_balancedness)})
    return fed


def dump(recorder, folder: str) -> str:
    """What POST /dump_expert_distribution_record does on each rank (scheduler: recorder.dump_record()), into
    `folder`. Returns the error of a first attempt that failed on the CPU ("" when none)."""
    os.environ["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"] = folder
    try:
        recorder.dump_record()
    except AttributeError as exc:  # torch.cpu has no empty_cache (module docstring): SGLang's flag is cleared
        recorder.dump_record()
        return f"{type(exc).__name__}: {exc}"
    return ""


def run(out_dir: str, rank: int) -> None:
    """Every mode of this rank: the dumps into out_dir/<mode>/ (per_pass: two dumps around a rebalance), what
    was fed into out_dir/truth_rank<r>.pt."""
    from sglang.srt.eplb import expert_distribution as ed
    from sglang.srt.eplb import expert_location
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    assert (ForwardMode.EXTEND.value, ForwardMode.DECODE.value, ForwardMode.IDLE.value) == (EXTEND, DECODE, IDLE)
    generator = torch.Generator().manual_seed(1000 + rank)
    truth: dict[str, Any] = {"rank": rank, "world": G, "layout_a": torch.tensor(LAYOUT_A),
                             "layout_b": torch.tensor(LAYOUT_B), "dump_errors": {}}
    plans = {"stat": ("off", [(STAT_PASSES, None)]),
             "per_pass": ("server_log", [(4, None), (3, LAYOUT_B)]),  # a rebalance between the two dumps
             "per_token": ("off", [(4, None)])}
    for mode, (report_mode, dumps) in plans.items():
        override = _install_config(mode, report_mode)
        try:
            metadata = _metadata(LAYOUT_A, rank)
            expert_location.set_global_expert_location_metadata(metadata, allow_overwrite=True)
            recorder = ed.ExpertDistributionRecorder.init_new(metadata, rank)
            ed.set_global_expert_distribution_recorder(recorder)
            first_pass, passes_of_mode = 100, []
            for number, (passes, new_layout) in enumerate(dumps):
                if new_layout is not None:  # EPLB's rebalance: the metadata updated in place, every layer
                    metadata.update(_metadata(new_layout, rank), update_layer_ids=list(range(L)))
                if not recorder.recording:  # a report mode starts it at init; else POST /start_expert_distribution_record
                    recorder.start_record()
                fed = run_passes(recorder, rank, first_pass, passes, generator)
                error = dump(recorder, os.path.join(out_dir, mode))
                if error:
                    truth["dump_errors"][f"{mode} {number}"] = error
                recorder.stop_record()
                passes_of_mode.append(fed)
                first_pass += passes
            truth[mode] = passes_of_mode
        finally:
            ed.set_global_expert_distribution_recorder(None)
            override.restore()
    if rank == 0:
        truth["flags"] = parser_facts()
    torch.save(truth, os.path.join(out_dir, f"truth_rank{rank}.pt"))


def parser_facts() -> dict:
    """What SGLang's own launch_server parser (ServerArgs.add_cli_args) says of the report flag and the old one:
    the choices and default of --expert-balancedness-report-mode, and the error for
    --enable-expert-distribution-metrics."""
    import contextlib
    import io

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    report = next(a for a in parser._actions if "--expert-balancedness-report-mode" in a.option_strings)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            parser.parse_args(["--model-path", "m", "--enable-expert-distribution-metrics"])
            status = 0
        except SystemExit as exc:
            status = int(exc.code or 0)
    return {"report_choices": list(report.choices), "report_default": report.default,
            "old_flag_status": status, "old_flag_error": stderr.getvalue().strip().splitlines()[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=G)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.world != G:
        raise SystemExit(f"the layout is for {G} ranks")
    import_sglang()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                                         world_size=G, timeout=datetime.timedelta(seconds=120))
    try:
        run(args.out_dir, args.rank)
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
