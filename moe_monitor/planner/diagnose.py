"""Should EPLB be on, and is LP dispatch worth it? Analytics of per-step counts for `moe-monitor diagnose`.

From per-step counts [T, L, E] and the layout in force [L, P]: rank persistence (how much of the per-step excess
survives summing over windows of ``every`` steps: what a layout can fix), hot-set persistence, expert skew inside
GPUs, and candidates scored held-out (the layout in force, EPLB and our re-plans and repairs every window,
planner.diagnose_budget, the advisor's decisions, LP twins, the force-balanced ideal), each priced as the
advisor prices it (planner.simulate.CostModel). Verdict: re-planning pays when the best REPLANS loses less time,
migration included, than the layout in force; LP dispatch when it cuts lost time by at least LP_WORTH_SHARE.
Beside the token figures, the layout in force's predicted MoE-layer time (planner.timecost) when it can be priced.
Shapes: T steps, L layers, E experts, P slots, G GPUs, W windows. Pure numpy. docs/diagnose.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moe_monitor.core.counts import as_counts
from moe_monitor.core.dispatch import DispatchModel, check_policy
from moe_monitor.core.loadmodel import validated_layout
from moe_monitor.core.steptails import pair_imbalance, tails_of

from .diagnose_budget import (
    DEFAULT_MAX_MOVES,
    advisor_layouts,
    full_replan,
    repair_layouts,
    replan_layouts,
)
from .loads import check_shape, whole_number
from .repair import experts_copied
from .simulate import CostModel
from .timecost import time_payload

DEFAULT_EVERY = 100          # steps per window: the re-plan interval and the unit of the persistence figures
HOT_SHARE = 1 / 16           # the hot set of a layer: the top E / 16 experts (16 of DeepSeek-V3's 256)
LP_WORTH_SHARE = 0.10        # LP dispatch is worth it when it cuts the lost time by at least 10 %
LP_BORDERLINE = 0.02         # a cut within 2 points of LP_WORTH_SHARE is called borderline in the verdict
CANDIDATES = ("in_force", "in_force_lp", "eplb_replan", "ours_replan", "ours_replan_lp", "ours_repair",
              "ours_repair_lp", "advisor", "advisor_lp", "ideal")
REPLANS = ("eplb_replan", "ours_replan", "ours_repair", "advisor")     # the verdict's re-plan candidates


def _none(value) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def gpu_loads_chunked(model: DispatchModel, counts_TLE: np.ndarray) -> np.ndarray:
    """GPU loads float64 [T, L, G] of counts [T, L, E] under a DispatchModel, model.steps_per_chunk steps at a
    time (bounded temporaries)."""
    T, L = counts_TLE.shape[:2]
    out = np.empty((T, L, model.gpus))
    chunk = model.steps_per_chunk
    for a in range(0, T, chunk):
        out[a:a + chunk] = model.gpu_loads(counts_TLE[a:a + chunk])
    return out


def window_sums(values_TX: np.ndarray, every: int) -> np.ndarray:
    """Sums over the W = T // every full windows of ``every`` steps: [T, ...] -> [W, ...] (a partial tail
    window is left out)."""
    W = values_TX.shape[0] // every
    return values_TX[:W * every].reshape((W, every) + values_TX.shape[1:]).sum(1)


def rank_persistence(loads_TLG: np.ndarray, every: int) -> dict:
    """Persistent vs transient rank imbalance of GPU loads [T, L, G] (T >= every):

    - persistent_share: mean over (window, layer) of the window-sum excess (max / mean - 1 of the loads summed
      over each window of ``every`` steps) over the mean per-step excess of the same steps and layers; 1 = the
      same GPUs stay hot (a layout can fix it), 0 = the excess averages out (no layout can);
    - same_busiest_share: share of (step, layer) pairs whose busiest GPU was the busiest at the step before;
    - modal_busiest_share: per layer, share of its steps in which its most often busiest GPU is the busiest,
      averaged over layers; chance is 1 / G for both. Both over the pairs (and pairs of steps) that have a
      busiest GPU: loads not all equal (a tie for the top goes to the lowest GPU id).
    None where no pair has tokens."""
    T, L, G = loads_TLG.shape
    used = (T // every) * every
    step_excess = pair_imbalance(loads_TLG[:used]) - 1.0                      # [T', L]
    window_excess = pair_imbalance(window_sums(loads_TLG, every)) - 1.0       # [W, L]
    mean_step = np.nanmean(step_excess) if np.isfinite(step_excess).any() else np.nan
    mean_window = np.nanmean(window_excess) if np.isfinite(window_excess).any() else np.nan
    share = mean_window / mean_step if np.isfinite(mean_step) and mean_step > 0 else np.nan
    active_TL = loads_TLG.max(-1) > loads_TLG.mean(-1) * (1 + 1e-12)         # a busiest GPU to name
    busiest_TL = loads_TLG.argmax(-1)
    both = active_TL[1:] & active_TL[:-1]
    same = (busiest_TL[1:] == busiest_TL[:-1])[both].mean() if both.any() else np.nan
    modal = []
    for layer in range(L):
        picks = busiest_TL[active_TL[:, layer], layer]
        if picks.size:
            modal.append(np.bincount(picks, minlength=G).max() / picks.size)
    return {"persistent_share": _none(share), "mean_step_excess": _none(mean_step),
            "mean_window_excess": _none(mean_window), "same_busiest_share": _none(same),
            "modal_busiest_share": _none(np.mean(modal)) if modal else None, "chance_share": 1.0 / G}


def hot_persistence(counts_TLE: np.ndarray, every: int, hot_experts: int | None = None) -> dict:
    """How long hot experts stay hot, from counts [T, L, E] on windows of ``every`` steps (W = T // every):
    the hot set of a (window, layer) with tokens is its ``hot_experts`` most-routed experts (default
    max(1, E x HOT_SHARE)).

    - hot_overlap: mean over consecutive windows (both with tokens) and layers of |H_w & H_w-1| / hot_experts;
    - hot_run_steps: mean length in steps of an expert's runs of consecutive windows in its layer's hot set
      (runs cut by the trace's ends count as they are: a lower bound for long runs);
    None when fewer than two windows hold tokens."""
    T, L, E = counts_TLE.shape
    k = max(1, int(round(E * HOT_SHARE))) if hot_experts is None else whole_number(hot_experts, "hot experts", 1)
    k = min(k, E)
    win_WLE = window_sums(counts_TLE, every)
    W = win_WLE.shape[0]
    active_WL = win_WLE.sum(-1) > 0
    top_WLk = np.argsort(-win_WLE, axis=-1, kind="stable")[..., :k]
    hot_WLE = np.zeros((W, L, E), dtype=bool)
    np.put_along_axis(hot_WLE, top_WLk, True, axis=-1)
    hot_WLE &= active_WL[..., None]
    both = active_WL[1:] & active_WL[:-1]
    overlap = (hot_WLE[1:] & hot_WLE[:-1]).sum(-1)[both] / k if W > 1 else np.zeros(0)
    runs = []
    for layer in range(L):
        member_WE = hot_WLE[:, layer].astype(np.int8)
        edges = np.diff(np.pad(member_WE, ((1, 1), (0, 0))), axis=0)          # +1 starts, -1 ends
        starts = np.argwhere(edges.T == 1)
        ends = np.argwhere(edges.T == -1)
        runs.extend((ends[:, 1] - starts[:, 1]).tolist())
    return {"hot_experts": k, "windows": int(W), "window_steps": int(every),
            "hot_overlap": _none(overlap.mean()) if overlap.size else None,
            "hot_run_steps": float(np.mean(runs) * every) if runs and overlap.size else None}


@dataclass(frozen=True)
class Candidate:
    """One way to run the scored steps: its per-step imbalance values (pairs with tokens), straggler and
    migration seconds, expert copies and layout changes."""
    name: str
    dispatch: str
    steps: int
    imbalance_p99: float | None
    straggler_s: float
    migration_s: float
    moves: int = 0
    changes: int = 0

    @property
    def lost_s(self) -> float:
        return self.straggler_s + self.migration_s

    def per_1000(self, seconds: float) -> float:
        return seconds / self.steps * 1000.0 if self.steps else 0.0

    def to_json(self) -> dict:
        return {"name": self.name, "dispatch": self.dispatch, "steps": self.steps,
                "per_step_imbalance_p99": self.imbalance_p99, "moves": self.moves, "changes": self.changes,
                "straggler_s_per_1000_steps": self.per_1000(self.straggler_s),
                "migration_s_per_1000_steps": self.per_1000(self.migration_s),
                "lost_s_per_1000_steps": self.per_1000(self.lost_s)}


class _Scored:
    """Accumulates per-step imbalance values and straggler tokens over the scored windows of one candidate."""

    def __init__(self) -> None:
        self.imbalance: list[np.ndarray] = []
        self.straggler_tokens = 0.0
        self.steps = 0

    def add(self, loads_TLG: np.ndarray) -> None:
        imb = pair_imbalance(loads_TLG)
        self.imbalance.append(imb[np.isfinite(imb)])
        self.straggler_tokens += float(np.maximum(loads_TLG.max(-1) - loads_TLG.mean(-1), 0.0).sum())
        self.steps += loads_TLG.shape[0]

    def candidate(self, name: str, dispatch: str, cost: CostModel, moves: int = 0, changes: int = 0) -> Candidate:
        values = np.concatenate(self.imbalance) if self.imbalance else np.zeros(0)
        return Candidate(name=name, dispatch=dispatch, steps=self.steps,
                         imbalance_p99=_none(np.percentile(values, 99)) if values.size else None,
                         straggler_s=self.straggler_tokens * cost.seconds_per_token_slot,
                         migration_s=cost.migration_seconds(moves), moves=moves, changes=changes)


def window_bounds(steps: int, every: int) -> list[tuple[int, int]]:
    """The scored windows [a, b): every ``every`` steps from step ``every`` on (the last may be shorter)."""
    return [(a, min(a + every, steps)) for a in range(every, steps, every)]


def _score_layouts(c: np.ndarray, current_LP: np.ndarray, gpus: int, bounds: list[tuple[int, int]],
                   layouts: list[np.ndarray], name: str, lp: bool, cost: CostModel) -> list[Candidate]:
    """One re-plan's candidates from the layout [L, P] in force on each scored window of ``bounds``: under even
    dispatch (and under LP dispatch as ``name``_lp when ``lp``), paying experts_copied from the layout before
    at each change."""
    E = c.shape[2]
    even, with_lp = _Scored(), _Scored()
    prev, moves, changes = current_LP, 0, 0
    for (a, b), lay in zip(bounds, layouts):
        copied = experts_copied(prev, lay, gpus)
        moves, changes, prev = moves + copied, changes + (copied > 0), lay
        even.add(gpu_loads_chunked(DispatchModel(lay, E, gpus, "even"), c[a:b]))
        if lp:
            with_lp.add(gpu_loads_chunked(DispatchModel(lay, E, gpus, "lp"), c[a:b]))
    out = [even.candidate(name, "even", cost, moves, changes)]
    if lp:
        out.append(with_lp.candidate(name + "_lp", "lp", cost, moves, changes))
    return out


def score_candidates(counts_TLE, current_LP, gpus: int, redundant: int, every: int = DEFAULT_EVERY,
                     dispatch: str = "even", cost: CostModel | None = None,
                     max_moves: int = DEFAULT_MAX_MOVES) -> list[Candidate]:
    """The CANDIDATES scored held-out on steps every..T-1 of counts [T, L, E] (T > every), in that order: the
    layout in force current_LP [L, P] under ``dispatch``, then under LP dispatch; the re-plans of
    planner.diagnose_budget, each window's layout fitted on the window before: EPLB's and ours (planner.api.plan
    "eplb" and the default policy, ``redundant`` slots per layer), our repair within ``max_moves`` copies per
    change and the advisor's decisions (same budget), under even dispatch (and LP for ours), paying
    experts_copied from the layout before; the ideal."""
    c = as_counts(counts_TLE, "counts", ndim=(3,))
    T, L, E = c.shape
    every = whole_number(every, "every", 1)
    check_policy(dispatch)
    check_shape(E, gpus, redundant)
    max_moves = whole_number(max_moves, "--max-moves", 0)
    cost = CostModel() if cost is None else cost
    cur = validated_layout(current_LP, E, gpus)
    if cur.shape[0] != L:
        raise ValueError(f"the layout in force has {cur.shape[0]} layers, the counts have {L}")
    if every >= T:
        raise ValueError(f"diagnose needs more than --every = {every} steps (one window to fit, one to score), "
                         f"got {T}")
    bounds = window_bounds(T, every)
    held = c[every:]
    in_force, in_force_lp, ideal = _Scored(), _Scored(), _Scored()
    in_force.add(gpu_loads_chunked(DispatchModel(cur, E, gpus, dispatch), held))
    if dispatch == "lp":                                               # the same figures: solved once
        in_force_lp = in_force
    else:
        in_force_lp.add(gpu_loads_chunked(DispatchModel(cur, E, gpus, "lp"), held))
    ideal.add(gpu_loads_chunked(DispatchModel(cur, E, gpus, "ideal"), held))
    out = [in_force.candidate("in_force", dispatch, cost), in_force_lp.candidate("in_force_lp", "lp", cost)]
    replans = (("eplb_replan", False, replan_layouts(c, cur, bounds, every, full_replan(gpus, redundant, "eplb"))),
               ("ours_replan", True, replan_layouts(c, cur, bounds, every, full_replan(gpus, redundant, "auto"))),
               ("ours_repair", True, repair_layouts(c, cur, bounds, every, gpus, max_moves)),
               ("advisor", True, advisor_layouts(c, cur, bounds, every, gpus, redundant, max_moves, cost)))
    for name, lp, layouts in replans:
        out.extend(_score_layouts(c, cur, gpus, bounds, layouts, name, lp, cost))
    out.append(ideal.candidate("ideal", "ideal", cost))
    return out


def verdict(candidates: list[Candidate]) -> dict:
    """Whether re-planning pays (the best of the REPLANS present that changes the layout at least once loses
    less time per 1,000 steps, migration included, than in_force) and whether LP dispatch is worth it on the
    layouts one would run: when re-planning pays, the best such re-plan that has an LP twin (``name``_lp, same
    layouts), else the layout in force; LP is worth it when it cuts their lost time (straggler + migration) by
    at least LP_WORTH_SHARE (borderline: within LP_BORDERLINE of it). With the figures behind each and one
    sentence."""
    by = {cand.name: cand for cand in candidates}
    base = by["in_force"]
    replans = [by[name] for name in REPLANS if name in by]
    moving = [cand for cand in replans if cand.changes > 0]       # a re-plan that never changes is no re-plan
    best = min(moving or replans, key=lambda cand: cand.lost_s)
    gain = best.per_1000(base.straggler_s) - best.per_1000(best.straggler_s)
    migration = best.per_1000(best.migration_s)
    pays = bool(moving) and bool(best.per_1000(best.lost_s) < base.per_1000(base.lost_s))
    twinned = [cand for cand in moving if cand.name + "_lp" in by]
    lp_on = min(twinned, key=lambda cand: cand.lost_s).name if pays and twinned else "in_force"
    plain, lp = by[lp_on], by[lp_on + "_lp"]
    lp_cut = (plain.lost_s - lp.lost_s) / plain.lost_s if plain.lost_s > 0 else 0.0
    lp_worth = bool(lp_cut >= LP_WORTH_SHARE)
    borderline = bool(abs(lp_cut - LP_WORTH_SHARE) < LP_BORDERLINE)
    what = f"{lp_on}'s" if pays else "the layout in force's"
    still = [cand.name for cand in replans if cand.changes == 0]
    text = (f"re-planning {'pays' if pays else 'does not pay'}: {best.name} saves {gain:.3f} s of straggler time "
            f"per 1,000 steps against {migration:.3f} s of migration ({best.moves} copies in {best.changes} "
            f"changes); LP dispatch {'is' if lp_worth else 'is not'} worth it: it cuts {what} lost time by "
            f"{100 * lp_cut:.1f}% (worth it from {100 * LP_WORTH_SHARE:.0f}%"
            f"{', borderline' if borderline else ''})" + (f"; {', '.join(still)} never changed the layout"
                                                           if still else ""))
    return {"replan_pays": pays, "best_replan": best.name, "replan_gain_s_per_1000_steps": gain,
            "replan_migration_s_per_1000_steps": migration, "lp_worth_it": lp_worth, "lp_on": lp_on,
            "lp_lost_time_cut": lp_cut, "lp_borderline": borderline, "text": text}


@dataclass(frozen=True)
class Diagnosis:
    """What `moe-monitor diagnose` prints: steps, window steps, GPUs, the figures of each part."""
    steps: int
    every: int
    gpus: int
    redundant: int
    dispatch: str
    ranks: dict
    hot: dict
    skew: dict
    candidates: list[Candidate]
    verdict: dict
    notes: list[str] = field(default_factory=list)
    max_moves: int = DEFAULT_MAX_MOVES
    time: dict | None = None

    def to_json(self) -> dict:
        """Strict-JSON-ready dict (None where a figure has no value)."""
        return {"steps": self.steps, "every": self.every, "gpus": self.gpus, "redundant": self.redundant,
                "dispatch": self.dispatch, "max_moves": self.max_moves, "rank_persistence": self.ranks,
                "hot_persistence": self.hot,
                "expert_skew": self.skew, "candidates": [cand.to_json() for cand in self.candidates],
                "verdict": self.verdict, "notes": list(self.notes),
                **({} if self.time is None else {"time": self.time})}


def diagnose(counts_TLE, current_LP, gpus: int, redundant: int, every: int = DEFAULT_EVERY,
             dispatch: str = "even", cost: CostModel | None = None, hot_experts: int | None = None,
             notes: list[str] | None = None, max_moves: int = DEFAULT_MAX_MOVES, time_model=None,
             time_hint: str = "") -> Diagnosis:
    """The whole diagnosis (module docstring) of counts [T, L, E] (T > every) under the layout in force
    current_LP [L, P] on ``gpus`` GPUs; re-plans get ``redundant`` slots per layer. time_model: a core.costmodel
    TimeModel, or the reasons there is none (core.costmodel.time_model; None: no `time`). ValueError on bad
    input."""
    c = as_counts(counts_TLE, "counts", ndim=(3,))
    every = whole_number(every, "every", 1)
    candidates = score_candidates(c, current_LP, gpus, redundant, every, dispatch, cost, max_moves)
    model = DispatchModel(current_LP, c.shape[2], gpus, dispatch)
    tails = tails_of(model, c)
    ranks = rank_persistence(gpu_loads_chunked(model, c), every)
    return Diagnosis(steps=int(c.shape[0]), every=every, gpus=int(gpus), redundant=int(redundant),
                     dispatch=dispatch, max_moves=int(max_moves), ranks=ranks,
                     hot=hot_persistence(c, every, hot_experts),
                     skew=tails.skew_summary(), candidates=candidates, verdict=verdict(candidates),
                     notes=list(notes or []), time=None if time_model is None else time_payload(
                         c, model.layout_LP, gpus, dispatch, time_model, time_hint))
