"""One rank of the EP runtime: its own tokens through the tiny DeepSeek-V3 (attention, dense layers, routers
and shared experts locally; routed experts over the EP group), the collectors attached, the control broadcast
every few steps (stop, a layout applied live), and a result file at the end.

Every rank builds the same model (same seed) and keeps only the expert weights its layout puts on it. The
traffic's router bias is a function of the step (virtual clock: step x step_period_s), identical on every
rank; the prompts are the rank's own (generator seeded with seed and rank).
"""
from __future__ import annotations

import json
import logging
import os
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from moe_monitor.collectors import ExpertLoadMonitor
from moe_monitor.demo.model import build_model
from moe_monitor.demo.traffic import DriftingTraffic

from .admission import Admitted, RequestRules
from .config import EPConfig
from .control import sync
from .experts import EPState, install, moe_blocks
from .migrate import migrate
from .placement import Placement
from .store import ExpertStore
from .watch import LayoutWatcher

log = logging.getLogger("moe_monitor.demo.ep")


def prompt_seed(seed: int, rank: int) -> int:
    """The seed of rank's prompt generator (tests rebuild the same prompts with it)."""
    return 1_000_003 * (seed + 1) + rank


def make_traffic(model, cfg: EPConfig, rank: int) -> DriftingTraffic:
    """demo/traffic.py's skewed drifting traffic: routers tilted alike on every rank, prompts of the rank's own."""
    traffic = DriftingTraffic(model, strength=cfg.strength, drift_period_s=cfg.drift_period_s, seed=cfg.seed,
                              log_pop=cfg.expert_log_pop)
    traffic.gen = torch.Generator().manual_seed(prompt_seed(cfg.seed, rank))
    return traffic


def initial_layout(cfg: EPConfig, num_layers: int, num_experts: int) -> np.ndarray:
    """int64 [L, P]: cfg.layout, or contiguous (P = E)."""
    if cfg.layout is not None:
        return np.asarray(cfg.layout, dtype=np.int64)
    return np.tile(np.arange(num_experts, dtype=np.int64), (num_layers, 1))


def run_rank(rank: int, cfg: EPConfig, port: int, result_dir: str, parent_pid: int | None = None) -> None:
    """Entry point of a spawned rank: writes rank{r}.json (summary) and, with save_outputs, rank{r}.pt; on a
    failure rank{r}.error (the traceback) and a non-zero exit. parent_pid: the launcher, which this rank dies
    with (SIGKILL included)."""
    if parent_pid is not None:
        from moe_monitor.demo.children import die_with

        die_with(parent_pid)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.filterwarnings("ignore", category=UserWarning)
    out = Path(result_dir)
    try:
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 2) // cfg.ranks))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.ranks,
                                timeout=timedelta(seconds=cfg.timeout_s))
        try:
            summary, outputs = serve(rank, cfg)
        finally:
            dist.destroy_process_group()
        if outputs is not None:
            torch.save(outputs, out / f"rank{rank}.pt")
        (out / f"rank{rank}.json").write_text(json.dumps(summary))
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def serve(rank: int, cfg: EPConfig) -> tuple[dict, dict | None]:
    """The step loop of one rank (process group initialised). Returns (summary, outputs or None)."""
    ranks = cfg.ranks
    model = build_model(cfg.moe_layers, cfg.seed, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts,
                        cfg.top_k)
    config = model.config
    num_experts, top_k = int(config.n_routed_experts), int(config.num_experts_per_tok)
    traffic = make_traffic(model, cfg, rank)
    blocks = moe_blocks(model)
    num_layers = len(blocks)
    layout = initial_layout(cfg, num_layers, num_experts)
    placement = Placement(layout, ranks, num_experts)
    store = ExpertStore.from_experts([block.experts for block in blocks], placement, rank)
    monitor = ExpertLoadMonitor(
        num_layers, num_experts, top_k, redis_url=cfg.redis_url, run=cfg.run, model_name=config.name_or_path,
        layer_names=[f"model.layers.{i + 1}.mlp" for i in range(num_layers)], hidden_size=int(config.hidden_size),
        moe_intermediate_size=int(config.moe_intermediate_size), dtype_bytes=4, expert_matrices=3,
        act_dtype_bytes=4, gpus=ranks, physical_to_logical_map=layout.tolist(), nvml=cfg.nvml,
        dispatch="round_robin")  # the runtime sends a token to replica (token index mod replicas)
    state = EPState(placement, store, monitor, ranks, timing=cfg.timing, grouped=cfg.grouped_experts,
                    serial_compute=cfg.serial_compute)
    install(model, state)
    watcher = start_watcher(cfg, monitor, num_layers, num_experts) if rank == 0 and cfg.redis_url else None
    step_s: list[float] = []
    timed: list[bool] = []
    applied: list[dict] = []
    plan_info: dict = {}
    tokens_T, logits_T = [], []
    started = time.monotonic()
    step = 0
    try:
        with torch.inference_mode():
            while True:
                if cfg.steps and step >= cfg.steps:
                    break
                if cfg.stop_after_apply_steps and applied and step - applied[-1]["from_step"] >= cfg.stop_after_apply_steps:
                    break
                planned = None
                plan_now = bool(cfg.auto_plan_at_step) and step == cfg.auto_plan_at_step  # same on every rank
                if plan_now:
                    planned = auto_plan(monitor, cfg, plan_info)
                if step % cfg.sync_every == 0 or plan_now:  # every rank takes part, or none
                    admitted: Admitted | None = watcher.take() if watcher is not None and planned is None else None
                    proposal = planned if planned is not None else admitted.layout_LP if admitted else None
                    over_time = bool(cfg.seconds) and time.monotonic() - started >= cfg.seconds
                    decision = sync(rank == 0 and over_time, proposal if rank == 0 else None, num_layers)
                    if decision.stop:
                        if watcher is not None and admitted is not None:
                            watcher.report_stopping(admitted, monitor.step)
                        break
                    if decision.layout_LP is not None:
                        new = Placement(decision.layout_LP, ranks, num_experts)
                        state.store, moved = migrate(state.store, state.placement, new, rank)
                        state.placement = new
                        if rank == 0:
                            monitor.publish_layout(decision.layout_LP, from_step=monitor.step, gpus=ranks,
                                                   source="apply")
                        if watcher is not None and admitted is not None:
                            watcher.report_applied(admitted, monitor.step)
                        applied.append({"from_step": monitor.step, "moves": moved.moves, "received": moved.received,
                                        "sent": moved.sent, "bytes_moved": moved.bytes_moved,
                                        "seconds": moved.seconds})
                traffic.apply(step * cfg.step_period_s)
                batch, seq_len = cfg.shapes[step % len(cfg.shapes)] if cfg.shapes else (cfg.batch, cfg.seq_len)
                tokens = traffic.prompts(batch, seq_len)
                state.timing = cfg.timing and (not cfg.timing_toggle_every
                                               or (step // cfg.timing_toggle_every) % 2 == 0)
                monitor.begin_step(tokens=tokens.numel())
                begun = time.perf_counter()
                logits = model(input_ids=tokens, use_cache=False).logits
                step_s.append(time.perf_counter() - begun)
                timed.append(state.timing)
                monitor.end_step(phase="decode" if seq_len == 1 else "prefill")
                if cfg.save_outputs:
                    tokens_T.append(tokens)
                    logits_T.append(logits.clone())
                step += 1
                if cfg.min_step_interval_s:
                    time.sleep(max(0.0, cfg.min_step_interval_s - step_s[-1]))
    finally:
        if watcher is not None:
            watcher.close()
        monitor.close()
    summary = {"rank": rank, "steps": step, "instance": monitor.instance, "step_s": step_s, "timed": timed,
               "applied": applied, "counts_LE": monitor.counts().tolist(), "stats": _jsonable(monitor.stats()),
               "layout_LP": state.placement.layout_LP.tolist(), **plan_info}
    outputs = None
    if cfg.save_outputs:
        outputs = {"tokens": _stacked(tokens_T), "logits": _stacked(logits_T)}
    return summary, outputs


def start_watcher(cfg: EPConfig, monitor: ExpertLoadMonitor, num_layers: int, num_experts: int) -> LayoutWatcher:
    """Rank 0's watch of the run's layout requests, with the apply secret (cfg.apply_secret_file, else the
    environment's; none: every request is refused) and the run's bounds on what a request may ask for."""
    from moe_monitor.core.apply_secret import load_secret

    secret = load_secret(cfg.apply_secret_file)
    if secret is None:
        log.warning("ep: no apply secret (MOE_APPLY_SECRET_FILE / MOE_APPLY_SECRET): layout requests are refused")
    rules = RequestRules(run=cfg.run, num_layers=num_layers, num_experts=num_experts, ranks=cfg.ranks,
                         max_slots_per_rank=cfg.max_slots_per_rank, max_replicas_per_expert=cfg.replicas_bound)
    return LayoutWatcher(cfg.redis_url or "", rules, monitor.instance, secret, current_step=lambda: monitor.step)


def auto_plan(monitor: ExpertLoadMonitor, cfg: EPConfig, info: dict) -> np.ndarray | None:
    """Every rank: the counts so far summed over ranks; rank 0 plans a layout on them (planner.plan, gpus =
    ranks, auto_plan_redundant spare slots). Returns rank 0's layout (None elsewhere) and fills info."""
    counts_LE = torch.from_numpy(monitor.counts())
    dist.all_reduce(counts_LE)
    if dist.get_rank() != 0:
        return None
    from moe_monitor import planner

    result = planner.plan(counts_LE.numpy(), gpus=cfg.ranks, redundant=cfg.auto_plan_redundant)
    info.update(plan_counts_LE=counts_LE.tolist(), plan_layout_LP=np.asarray(result.layout_LP).tolist())
    return np.asarray(result.layout_LP, dtype=np.int64)


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """One tensor [steps, ...] of the steps' tensors; the list itself when their shapes differ (cfg.shapes)."""
    if not tensors:
        return torch.empty(0)
    return torch.stack(tensors) if len({t.shape for t in tensors}) == 1 else tensors


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))
