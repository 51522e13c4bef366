"""The lp dispatch policy's optimum from a general LP solver (scipy's HiGHS), for tests: one (step, layer)."""
from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix


def busiest_gpu_optimum(counts_E: np.ndarray, layout_P: np.ndarray, gpus: int) -> float:
    """min over splits of each expert's tokens over its slots of the busiest GPU's load. Variables: tokens per
    slot x [P] and the bound M; each expert's slots sum to its count; each GPU's slots sum to at most M."""
    P = layout_P.size
    per_gpu = P // gpus
    objective = np.zeros(P + 1)
    objective[-1] = 1.0
    a_eq = coo_matrix((np.ones(P), (layout_P, np.arange(P))), shape=(counts_E.size, P + 1))
    rows = np.concatenate([np.arange(P) // per_gpu, np.arange(gpus)])
    cols = np.concatenate([np.arange(P), np.full(gpus, P)])
    vals = np.concatenate([np.ones(P), -np.ones(gpus)])
    a_ub = coo_matrix((vals, (rows, cols)), shape=(gpus, P + 1))
    res = linprog(objective, A_ub=a_ub, b_ub=np.zeros(gpus), A_eq=a_eq, b_eq=np.asarray(counts_E, float),
                  bounds=[(0, None)] * (P + 1), method="highs")
    assert res.status == 0, res.message
    return float(res.fun)
