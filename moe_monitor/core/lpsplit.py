"""The lp dispatch policy solved exactly: per step and layer, the split of each replicated expert's tokens over the
GPUs it spans that gives the minimum-norm GPU-load vector (the busiest GPU minimised first, then the next). At the
optimum an expert sends tokens only to its least-loaded GPUs. Two paths: the full split (every replicated expert
on every GPU it spans: a linear map per layer, one matmul for all steps, exact where no share is negative), and
an active-set method for the other (step, layer) pairs, LP_BLOCK_STEPS block steps then one share a step
(Lawson-Hanson). The method and its measured figures: docs/definitions.md.

Shapes: T steps, L layers, B or H (step, layer) pairs, G GPUs, F replicated experts of a layer, R the most GPUs
one expert spans (gpu_LFR pads with G), K = G + F inputs of the linear map.
"""
from __future__ import annotations

import numpy as np

LP_EXACT_TOLERANCE = 1e-9  # a share or optimality condition may miss by this much x the pair's largest input
LP_BLOCK_STEPS = 8         # active-set steps that change many shares at once, before the one-share steps
LP_MAX_ACTIVE_STEPS = 4    # x F x R active-set steps at most (each removes or adds one share)
ACTIVE_BATCH = 512         # pairs the active-set method holds at once (tens of kB each at G = F = 32)
PRODUCT_MACS = 1 << 18     # multiply-adds of one matrix product at most (steps go in blocks): a threaded BLAS keeps
                           # a product this small on one core (threads lose on a busy machine)


class LpSplit:
    """The exact lp split of the replicated experts of every layer. gpu_LFR int [L, F, R]: the distinct GPUs of each
    replicated expert (G where none). Answers come as Q columns per layer, column_LQ int [L, Q] naming a share
    (f * R + r) and weight_LQ [L, Q] scaling it (a slot's part of its GPU's share; 0 for padding), or as GPU
    loads. Input: inputs_LTK, per layer and step the GPUs' fixed loads [G] (what no replicated expert can move)
    then the replicated experts' tokens [F]. Memory: about 2 x L x T x (Q + G) float64 beside the inputs."""

    def __init__(self, gpu_LFR: np.ndarray, gpus: int, column_LQ: np.ndarray, weight_LQ: np.ndarray):
        self.gpu_LFR, self.gpus = np.asarray(gpu_LFR, dtype=np.int64), int(gpus)
        self.column_LQ, self.weight_LQ = np.asarray(column_LQ, dtype=np.int64), np.asarray(weight_LQ, float)
        F, R = self.gpu_LFR.shape[1:]
        maps_LKY = np.stack([_full_split_map(g_FR, self.gpus) for g_FR in self.gpu_LFR])
        self.share_map_LKX, level_map_LKG = maps_LKY[..., :F * R], maps_LKY[..., F * R:]
        self.column_map_LKQ = (np.take_along_axis(self.share_map_LKX, self.column_LQ[:, None, :], 2)
                               * self.weight_LQ[:, None, :])
        self.load_map_LKY = np.concatenate([self.column_map_LKQ, level_map_LKG], axis=2)

    def columns(self, inputs_LTK: np.ndarray) -> np.ndarray:
        """float64 [L, T, Q]: the columns at the lp optimum."""
        out_LTY, layer, t, share_HX = self._solve(inputs_LTK, self.column_map_LKQ)
        if layer.size:
            out_LTY[layer, t] = np.take_along_axis(share_HX, self.column_LQ[layer], 1) * self.weight_LQ[layer]
        return out_LTY

    def loads(self, inputs_LTK: np.ndarray) -> np.ndarray:
        """float64 [L, T, G]: the GPU loads at the lp optimum."""
        G, Q = self.gpus, self.column_LQ.shape[1]
        out_LTY, layer, t, share_HX = self._solve(inputs_LTK, self.load_map_LKY)
        loads_LTG = out_LTY[:, :, Q:]
        if layer.size:
            cell = np.arange(layer.size)[:, None] * (G + 1) + self.gpu_LFR[layer].reshape(layer.size, -1)
            moved = np.bincount(cell.ravel(), weights=share_HX.ravel(), minlength=layer.size * (G + 1))
            loads_LTG[layer, t] = inputs_LTK[layer, t, :G] + moved.reshape(-1, G + 1)[:, :G]
        return loads_LTG

    def _solve(self, inputs_LTK, map_LKY):
        """(the full split through map_LKY [L, T, Y], share columns first and clipped at 0; the pairs it leaves
        (layers, steps); their shares [H, F * R] by the active-set method)."""
        G, Q = self.gpus, self.column_LQ.shape[1]
        out_LTY = layer_products(inputs_LTK, map_LKY)
        shares_LTQ = out_LTY[:, :, :Q]
        hard_LT = shares_LTQ.min(-1, initial=0.0) < -_tolerance(inputs_LTK)
        np.maximum(shares_LTQ, 0.0, out=shares_LTQ)
        layer, t = np.nonzero(hard_LT)
        F, R = self.gpu_LFR.shape[1:]
        target_HX = np.empty((layer.size, F * R))
        for one in np.unique(layer):
            pick = np.flatnonzero(layer == one)
            target_HX[pick] = layer_products(inputs_LTK[one, t[pick]][None], self.share_map_LKX[one][None])[0]
        inputs_HK = inputs_LTK[layer, t]
        share_HFR = active_set_split(inputs_HK[:, :G], inputs_HK[:, G:], self.gpu_LFR[layer], G,
                                     target_HX.reshape(-1, F, R))
        return out_LTY, layer, t, share_HFR.reshape(layer.size, F * R)


def layer_products(x_LTA: np.ndarray, map_LAB: np.ndarray) -> np.ndarray:
    """float64 [L, T, B]: each layer's rows [T, A] times its map [A, B], in blocks of steps of at most
    PRODUCT_MACS multiply-adds."""
    L, T, A = x_LTA.shape
    B = map_LAB.shape[2]
    block = max(1, min(T, PRODUCT_MACS // max(A * B, 1)))
    full = T // block * block
    out = np.empty((L, T, B))
    if full:
        out[:, :full] = np.matmul(x_LTA[:, :full].reshape(L, -1, block, A), map_LAB[:, None]).reshape(L, full, B)
    if full < T:
        out[:, full:] = np.matmul(x_LTA[:, full:], map_LAB)
    return out


def _tolerance(inputs_XK: np.ndarray) -> np.ndarray:
    return LP_EXACT_TOLERANCE * (1.0 + inputs_XK.max(-1, initial=0.0))


def _full_split_map(gpu_FR: np.ndarray, gpus: int) -> np.ndarray:
    """float64 [G + F, F * R + G]: the shares [F * R] and GPU loads [G] of the full split (see the module) as a
    linear map of the fixed loads [G] and counts [F] of one layer (row vector times the map)."""
    F, R = gpu_FR.shape
    G = gpus
    real_FR = gpu_FR < G
    span_FG = np.zeros((F, G))
    f_i, r_i = np.nonzero(real_FR)
    span_FG[f_i, gpu_FR[f_i, r_i]] = 1.0
    k_F = span_FG.sum(1)
    kinv_F = np.where(k_F > 0, 1.0 / np.maximum(k_F, 1.0), 0.0)
    group_G = _pair_groups((span_FG.T @ span_FG > 0)[None])[0]
    same_GG = (group_G[:, None] == group_G[None, :]).astype(np.float64)
    mean_GG = same_GG / same_GG.sum(1, keepdims=True)           # the mean over a GPU's group
    expert_group_FG = (span_FG @ same_GG > 0) * (1.0 / same_GG.sum(1))[None, :]
    laplacian_GG = np.diag(span_FG.sum(0)) - span_FG.T @ (kinv_F[:, None] * span_FG)
    solve_GG = np.linalg.inv(laplacian_GG + mean_GG)              # nonsingular: groups are connected
    change_GX = np.zeros((G, F * R))                              # potentials [G] -> change of each share
    x_i = f_i * R + r_i
    change_GX[gpu_FR[f_i, r_i], x_i] += 1.0
    change_GX[:, x_i] -= (span_FG * kinv_F[:, None])[f_i].T
    even_FX = np.zeros((F, F * R))
    even_FX[f_i, x_i] = kinv_F[f_i]
    # gap to the level [G] = fixed @ (mean - I) + counts @ (expert_group - even onto GPUs)
    gap_from_fixed = mean_GG - np.eye(G)
    gap_from_counts = expert_group_FG - kinv_F[:, None] * span_FG
    move_GX = solve_GG @ change_GX
    shares = np.concatenate([gap_from_fixed @ move_GX, even_FX + gap_from_counts @ move_GX], axis=0)
    return np.concatenate([shares, np.concatenate([mean_GG, expert_group_FG], axis=0)], axis=1)


def active_set_split(fixed_HG: np.ndarray, count_HF: np.ndarray, gpu_HFR: np.ndarray, gpus: int,
                     target_HFR: np.ndarray | None = None) -> np.ndarray:
    """Shares float64 [H, F, R] at the lp optimum of H pairs by the active-set method (see the module), from the
    even split, ACTIVE_BATCH pairs at a time; target_HFR: the full split of these pairs when known (the first
    step's target). A pair still open after LP_MAX_ACTIVE_STEPS x F x R steps keeps its last split, feasible but
    not proven optimal (never seen in the tests, the fuzzing or the bench)."""
    H = gpu_HFR.shape[0]
    share_HFR = np.zeros(gpu_HFR.shape)
    for start in range(0, H, ACTIVE_BATCH):
        part = slice(start, min(H, start + ACTIVE_BATCH))
        share_HFR[part] = _active_set(fixed_HG[part], count_HF[part], gpu_HFR[part], gpus,
                                      None if target_HFR is None else target_HFR[part])
    return share_HFR


def _active_set(fixed_HG, count_HF, gpu_HFR, G, target_HFR):
    H, F, R = gpu_HFR.shape
    real = gpu_HFR < G
    gpu = np.where(real, gpu_HFR, 0)
    share = np.where(real, (count_HF / np.maximum(real.sum(-1), 1))[..., None], 0.0)
    free = real & (count_HF > 0)[..., None]
    tol_H = _tolerance(np.concatenate([fixed_HG, count_HF], axis=1))
    if target_HFR is not None:   # the full split's negative shares leave at once (as a block step)
        free &= ~(target_HFR < -tol_H[:, None, None])
        share = np.where(free, (count_HF / np.maximum(free.sum(-1), 1))[..., None], 0.0)
    todo = np.arange(H)
    for step in range(LP_BLOCK_STEPS + LP_MAX_ACTIVE_STEPS * F * R):
        if todo.size == 0:
            break
        s_share, s_free, finished = _active_step(fixed_HG[todo], count_HF[todo], gpu[todo], real[todo],
                                                 share[todo], free[todo], tol_H[todo], G, step < LP_BLOCK_STEPS)
        share[todo], free[todo] = s_share, s_free
        todo = todo[~finished]
    return share


def _step_towards(share, free, target, tol):
    """Move each pair's shares towards target [h, F, R] (free edges) as far as they stay >= 0; the first share
    that reaches 0 leaves the free edges. (shares, free edges, blocked [h]: whether target was out of reach)."""
    h = share.shape[0]
    neg = free & (target < -tol[:, None, None])
    blocked = neg.reshape(h, -1).any(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(neg, share / (share - target), np.inf).reshape(h, -1)
    first = ratio.argmin(-1)
    b = np.flatnonzero(blocked)
    alpha = np.ones(h)
    alpha[b] = ratio[b, first[b]]
    share = np.where(free, np.maximum(share + alpha[:, None, None] * (target - share), 0.0), 0.0)
    free = free.copy()
    share.reshape(h, -1)[b, first[b]] = 0.0
    free.reshape(h, -1)[b, first[b]] = False
    return share, free, blocked


def _active_step(fixed, count, gpu, real, share, free, tol, G, block):
    """One active-set step for h pairs: (shares, free edges, finished [h]). block: change every share that breaks
    an optimality condition at once and restart from the even split over the free shares (fast, may cycle);
    otherwise one share, keeping the shares feasible (Lawson-Hanson: finite)."""
    h, F, R = gpu.shape
    rows = np.arange(h)
    k = free.sum(-1)
    kinv = np.where(k > 0, 1.0 / np.maximum(k, 1), 0.0)
    # the Laplacian over GPUs of the free split [h, G, G]: diag(free shares on g) - sum_f kinv_f 1_f 1_f^T
    hi, fi, r1, r2 = np.nonzero(free[..., :, None] & free[..., None, :])
    laplacian = -np.bincount((hi * G + gpu[hi, fi, r1]) * G + gpu[hi, fi, r2], weights=kinv[hi, fi],
                             minlength=h * G * G).reshape(h, G, G)
    group = _pair_groups(laplacian != 0)
    at_gpu = (rows[:, None, None] * G + gpu)[free]
    degree = np.bincount(at_gpu, minlength=h * G).reshape(h, G)
    laplacian.reshape(h, G * G)[:, ::G + 1] += degree + (group == np.arange(G))   # one GPU a group grounded
    cell_g = (rows[:, None] * (G + 1) + group).ravel()
    size = np.bincount(cell_g, minlength=h * (G + 1))
    total = np.bincount(cell_g, weights=fixed.ravel(), minlength=h * (G + 1))
    expert_group = np.where(free, np.take_along_axis(group, gpu.reshape(h, -1), 1).reshape(h, F, R), G).min(-1)
    total += np.bincount((rows[:, None] * (G + 1) + expert_group).ravel(), weights=count.ravel(),
                         minlength=h * (G + 1))
    level = (total / np.maximum(size, 1)).reshape(h, G + 1)
    level_G = np.take_along_axis(level, group, 1)
    load_G = fixed + np.bincount(at_gpu, weights=share[free], minlength=h * G).reshape(h, G)
    potential = np.linalg.solve(laplacian, (level_G - load_G)[..., None])[..., 0]
    at_edge = np.take_along_axis(potential, gpu.reshape(h, -1), 1).reshape(h, F, R)
    mean_f = np.where(free, at_edge, 0.0).sum(-1) * kinv
    target = np.where(free, share + at_edge - mean_f[..., None], 0.0)
    level_edge = np.take_along_axis(level_G, gpu.reshape(h, -1), 1).reshape(h, F, R)
    expert_level = np.where(free, level_edge, -np.inf).max(-1)
    idle = real & ~free & (count > 0)[..., None]
    excess = np.where(idle, expert_level[..., None] - level_edge, -np.inf)     # > 0: an idle GPU below the level
    if block:   # every share that would go negative leaves, every idle GPU below its expert's level joins
        leaves = free & (target < -tol[:, None, None])
        joins = excess > tol[:, None, None]
        done = ~(leaves | joins).reshape(h, -1).any(-1)
        new_free = (free & ~leaves) | joins
        even = np.where(new_free, (count / np.maximum(new_free.sum(-1), 1))[..., None], 0.0)
        return np.where(done[:, None, None], np.maximum(target, 0.0), even), new_free, done
    share, new_free, blocked = _step_towards(share, free, target, tol)
    # pairs at their free set's optimum: an expert's idle GPU below its level joins the split
    flat_excess = excess.reshape(h, -1)
    worst = flat_excess.argmax(-1)
    joins_one = ~blocked & (flat_excess[rows, worst] > tol)
    j = np.flatnonzero(joins_one)
    new_free.reshape(h, -1)[j, worst[j]] = True
    return share, new_free, ~blocked & ~joins_one


def _pair_groups(linked_HGG: np.ndarray) -> np.ndarray:
    """int64 [h, G]: per pair, the smallest GPU of each GPU's group, from which GPUs an expert links (bool
    [h, G, G], symmetric): transitive closure (Warshall) on bit sets, 64 GPUs a word."""
    h, G = linked_HGG.shape[:2]
    words = -(-G // 64)
    padded = np.zeros((h, G, 64 * words), dtype=bool)
    padded[:, :, :G] = linked_HGG
    reach = np.packbits(padded, axis=-1, bitorder="little").view("<u8").astype(np.uint64)   # [h, G, words]
    bit = np.uint64(1) << np.arange(64, dtype=np.uint64)
    idx = np.arange(G)
    reach[:, idx, idx // 64] |= bit[idx % 64]
    linked = np.flatnonzero(linked_HGG.any(axis=(0, 1)))    # a GPU no pair links to anything closes nothing
    for k in linked:
        holds = (reach[:, :, k // 64] >> np.uint64(k % 64)) & np.uint64(1)
        reach |= holds[..., None] * reach[:, k:k + 1, :]
    first_word = (reach != 0).argmax(-1)
    word = np.take_along_axis(reach, first_word[..., None], -1)[..., 0]
    lowest = word & (~word + np.uint64(1))
    return first_word * 64 + np.log2(lowest.astype(np.float64)).astype(np.int64)
