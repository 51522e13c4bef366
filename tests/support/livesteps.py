"""A small live run for the score and diagnose tests: per-rank counts of L layers x E experts on G GPUs, published
step by step into a test's own redis-server with the real writer (traces.publish.RunPublisher, the replay
command's)."""
from __future__ import annotations

import numpy as np

from moe_monitor import core
from moe_monitor.traces.publish import RunPublisher

L, E, G, RANKS = 2, 16, 4, 2


def counts_steps(steps: int, seed: int = 1) -> np.ndarray:
    """int [steps, RANKS, L, E]: every rank's counts of each step."""
    rng = np.random.default_rng(seed)
    pop = rng.dirichlet(np.full(E, 0.4), size=L)
    return np.stack([[[rng.multinomial(64, pop[layer]) for layer in range(L)] for _ in range(RANKS)]
                     for _ in range(steps)])


def publish(url: str, run_name: str, counts_TRLE: np.ndarray, changes: dict | None = None) -> None:
    """Publish the steps with RunPublisher; changes {step: layout_LP} go out as layout records before their
    step."""
    meta = core.RunMeta(run=run_name, model_name="m", layer_names=[f"l{i}" for i in range(L)], num_experts=E,
                        top_k=2, hidden_size=64, moe_intermediate_size=32, dtype_bytes=2, world_size=RANKS,
                        layout=core.Layout(G, 1, core.contiguous_layout(L, E)))
    writer = RunPublisher(url, meta)
    try:
        for step, per_rank in enumerate(counts_TRLE):
            layouts = [core.LayoutRecord(run=run_name, step=step, time_s=1.0 + step, gpus=G,
                                         layout_LP=np.asarray(changes[step], dtype=np.int32))
                       ] if changes and step in changes else []
            writer.publish([core.StepRecord(run=run_name, rank=r, world_size=RANKS, step=step, time_s=1.0 + step,
                                            phase="decode", tokens=64, counts_LE=per_rank[r].astype(np.int32))
                            for r in range(RANKS)], layouts, now_s=1.0 + step)
    finally:
        writer.close()
