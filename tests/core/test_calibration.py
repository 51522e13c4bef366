"""core.calibration: the fit recovers a profile from times the cost model itself generates (plus noise), and the
held-out errors count what they say, on cases worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor.core import calibration
from moe_monitor.core.costmodel import ModelDims, TimeModel
from moe_monitor.core.hardware import GpuProfile, parse_profile

DIMS = ModelDims(2048, 1408, 3, 4.0, 4.0)
TRUE = GpuProfile("cpu", {"4": 80e9}, 18e9, 1e10, 1e10, gpus_per_node=2, overhead_s=300e-6, tile_tokens=1,
                  flops_share=1.0, hbm_share=1.0)


def synthetic(steps: int, seed: int, noise: float = 0.03) -> tuple[np.ndarray, np.ndarray]:
    """Slot tokens [steps, 4, 16] at decode and prefill sizes, and the true profile's compute seconds [steps, 4, 2]
    times lognormal noise."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((steps, 4, 16))
    for x in range(steps):
        pop = rng.dirichlet(np.full(16, 0.3), size=4)
        tokens[x] = [rng.multinomial(int(rng.choice([8, 16, 128, 512])), pop[layer]) for layer in range(4)]
    times = TimeModel(DIMS, TRUE, 2).gpu_times(tokens)
    measured = (times.weights_s + times.flops_s + times.overhead_s) * rng.lognormal(0.0, noise, times.tokens.shape)
    return tokens, measured


def test_fit_recovers_the_generating_profile():
    tokens, measured = synthetic(160, seed=0)
    fitted = calibration.fit_profile(DIMS, tokens, measured, 2, name="t", source="test")
    p = fitted.profile
    assert p.hbm == pytest.approx(TRUE.hbm, rel=0.03)
    assert p.peak_flops(4.0) == pytest.approx(TRUE.peak_flops(4.0), rel=0.03)
    assert p.overhead_s == pytest.approx(TRUE.overhead_s, rel=0.3)
    assert (p.flops_share, p.hbm_share, p.tile_tokens, p.source) == (1.0, 1.0, 1, "test")
    assert parse_profile(p.to_json()) == p
    assert fitted.errors.median_rel < 0.04 and fitted.link is None
    held_tokens, held_measured = synthetic(60, seed=1)
    held = calibration.errors(TimeModel(DIMS, p, 2), held_tokens, held_measured)
    assert held.median_rel < 0.04 and held.p90_rel < 0.08 and held.cells == 60 * 4 * 2 and held.layer_cells == 240
    assert held.straggler_time > 0.85


def test_errors_by_hand():
    """One layer, 2 GPUs x 2 slots, memory-bound: each active slot costs about expert_bytes / hbm = t0. Step 0:
    GPU 0 runs 1 expert on 9 tokens, GPU 1 runs 2 on 1 token each; measured [t0, 2 t0]: GPU 1 is the busiest, the
    time model names it, the token count names GPU 0. Step 1: GPU 1 idle and not measured: one cell, no full layer."""
    profile = GpuProfile("p", {"4": 1e30}, 1e12, 1e10, 1e10, overhead_s=0.0, tile_tokens=1, flops_share=1.0,
                         hbm_share=1.0)
    model = TimeModel(DIMS, profile, 2)
    t0 = DIMS.expert_bytes / 1e12
    tokens = np.array([[[9.0, 0.0, 1.0, 1.0]], [[3.0, 0.0, 0.0, 0.0]]])
    measured = np.array([[[t0, 2 * t0]], [[t0, np.nan]]])
    e = calibration.errors(model, tokens, measured)
    assert e.cells == 3 and e.layer_cells == 1
    assert e.straggler_time == 1.0 and e.straggler_tokens == 0.0
    assert e.median_rel < 1e-2 and e.p90_rel < 1e-2  # activation reads: well under 1% here


def test_link_fit_and_refusals():
    tokens, measured = synthetic(40, seed=2)
    rows = tokens.reshape(40, 4, 2, 8).sum(-1)
    comm = 1e-4 + rows * 2 * 2048 * 4 * 0.5 / 2e9  # 2 GB/s link, 0.1 ms latency
    fitted = calibration.fit_profile(DIMS, tokens, measured, 2, comm_s_XLG=comm)
    assert fitted.link is not None and fitted.link.link_bytes_per_s == pytest.approx(2e9, rel=1e-3)
    assert fitted.profile.nvlink_bytes_per_s == pytest.approx(2e9, rel=1e-3)
    with pytest.raises(ValueError, match="no measured"):
        calibration.fit_profile(DIMS, tokens, np.full_like(measured, np.nan), 2)
    with pytest.raises(ValueError, match="split evenly"):
        calibration.fit_profile(DIMS, tokens, measured, 3)


def test_the_form_that_fits_is_kept():
    """Times generated with reads and FLOPs added (a CPU's BLAS) fit the sum form; the max form's do not."""
    tokens, _ = synthetic(60, seed=4)
    adding = GpuProfile("cpu", {"4": 50e9}, 10e9, 1e10, 1e10, overhead_s=1e-3, tile_tokens=1, flops_share=1.0,
                        hbm_share=1.0, overlap=False)
    times = TimeModel(DIMS, adding, 2).gpu_times(tokens)
    added = times.weights_s + times.flops_s + times.overhead_s
    fitted = calibration.fit_profile(DIMS, tokens, added, 2)
    assert not fitted.profile.overlap and fitted.errors.median_rel < 1e-3
    assert (fitted.profile.hbm, fitted.profile.peak_flops(4.0)) == pytest.approx((10e9, 50e9), rel=1e-3)
    forced = calibration.fit_profile(DIMS, tokens, added, 2, form="max")
    assert forced.profile.overlap and forced.errors.median_rel > 10 * fitted.errors.median_rel
    assert calibration.fit_profile(DIMS, *synthetic(60, seed=5), 2).profile.overlap  # the max form's own data
    with pytest.raises(ValueError, match="form"):
        calibration.fit_gemm(DIMS, tokens, added, 2, form="min")
