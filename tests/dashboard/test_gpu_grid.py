"""The GPU panel's all-GPU matrix (live.gpu_history.gpu_grid): readings of a real GpuHistory binned per row and
time bin, rows paired by rank or listed by host and index, missing readings as gaps, 256 GPUs."""
import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.figures import gpu as gpu_figures
from moe_monitor.dashboard.live.gpu_history import GRID_FIELDS, GpuHistory, gpu_grid, grid_rows

CLOCK = GRID_FIELDS.index("sm_clock_mhz")
POWER = GRID_FIELDS.index("power_usage_w")


def reading(index: int, clock, power=400.0) -> dict:
    return {"index": index, "name": "H100", "sm_clock_mhz": clock, "power_usage_w": power, "temperature_c": 55,
            "gpu_utilization_percent": 80, "memory_used_bytes": 40 << 30}


def sample(rank: int, host: str, time_s: float, *gpus: dict) -> core.GpuSample:
    return core.GpuSample(rank=rank, host=host, time_s=time_s, status="ok", gpus=list(gpus))


def test_bins_hold_the_mean_of_their_readings():
    history = GpuHistory()
    for k in range(12):  # one reading a second, 0..11 s: the clock steps from 1000 to 2000 MHz at 6 s
        history.add(sample(0, "node-a", 100.0 + k, reading(0, 1000 if k < 6 else 2000, power=float(k))))
    rows = grid_rows(*history.pairing(1, 1)[:1], history.devices(), gpus=1)
    grid = gpu_grid(history.readings(), rows, max_bins=4)
    # 11 s at 1 s per reading: 7 bins of 1.5 intervals would fit, max_bins keeps 4 of 2.75 s each
    assert grid.edges_s.tolist() == pytest.approx([100.0, 102.75, 105.5, 108.25, 111.0])
    assert grid.mean_MRB[CLOCK, 0].tolist() == [1000, 1000, 2000, 2000]
    assert grid.mean_MRB[POWER, 0].tolist() == pytest.approx([1.0, 4.0, 7.0, 10.0])  # (0+1+2)/3, (3+4+5)/3, ...
    assert grid.latest_MR[POWER, 0] == 11.0 and grid.latest_s_R[0] == 111.0 and grid.newest_s == 111.0


def test_bins_are_at_least_one_and_a_half_sampling_intervals_wide():
    history = GpuHistory()
    for k in range(31):  # 0.5 s apart with jitter over 15 s: intervals 0.55, 0.55, 0.40 s, median 0.55 s
        history.add(sample(0, "node-a", 50.0 + 0.5 * k + 0.05 * (k % 3), reading(0, 1980)))
    grid = gpu_grid(history.readings(), grid_rows({}, history.devices(), gpus=0), max_bins=120)
    assert grid.mean_MRB.shape == (len(GRID_FIELDS), 1, 18)  # bins of 15 s / 18 = 0.83 s >= 1.5 x 0.55 s
    assert np.isfinite(grid.mean_MRB[CLOCK]).all()


def test_rows_are_ep_gpus_paired_by_rank_not_by_sort_order():
    history = GpuHistory()
    history.add(sample(0, "node-b", 10.0, reading(3, 1100)))  # sorted by host it would come second
    history.add(sample(1, "node-a", 10.0, reading(0, 1900)))
    pairs, note = history.pairing(gpus=2, world_size=2)
    rows = grid_rows(pairs, history.devices(), gpus=2)
    assert note == "" and rows == [(0, ("node-b", 3)), (1, ("node-a", 0))]
    grid = gpu_grid(history.readings(), rows, max_bins=10)
    assert grid.names_R == ["GPU 0", "GPU 1"] and grid.gpu_R.tolist() == [0, 1]
    assert grid.latest_MR[CLOCK].tolist() == [1100, 1900]


def test_an_ep_gpu_without_a_device_is_an_empty_row_and_unpaired_devices_follow():
    history = GpuHistory()
    history.add(sample(0, "node-a", 10.0, reading(0, 1500)))
    history.add(sample(2, "node-c", 10.0, reading(0, 1600), reading(1, 1700)))  # two devices: rank 2 not paired
    pairs, note = history.pairing(gpus=3, world_size=3)
    assert "rank(s) 2 report several NVML devices" in note
    rows = grid_rows(pairs, history.devices(), gpus=3)
    assert rows == [(0, ("node-a", 0)), (1, None), (2, None), (-1, ("node-c", 0)), (-1, ("node-c", 1))]
    grid = gpu_grid(history.readings(), rows, max_bins=10)
    assert grid.names_R == ["GPU 0", "GPU 1", "GPU 2", "node-c #0", "node-c #1"]
    assert np.isnan(grid.mean_MRB[:, 1:3]).all() and np.isnan(grid.latest_MR[:, 1:3]).all()
    assert grid.latest_MR[CLOCK].tolist()[3:] == [1600, 1700]


def test_without_a_pairing_rows_are_devices_by_host_and_index():
    history = GpuHistory()
    history.add(sample(0, "node-b", 10.0, reading(1, 1000), reading(0, 1001)))
    history.add(sample(0, "node-a", 10.0, reading(7, 1002)))
    pairs, note = history.pairing(gpus=16, world_size=1)
    assert pairs == {} and note.startswith("not paired: 1 rank(s) for 16 EP GPUs")
    grid = gpu_grid(history.readings(), grid_rows(pairs, history.devices(), gpus=16), max_bins=10)
    assert grid.names_R == ["node-a #7", "node-b #0", "node-b #1"] and grid.gpu_R.tolist() == [-1, -1, -1]
    assert grid.latest_MR[CLOCK].tolist() == [1002, 1001, 1000]


def test_missing_readings_are_gaps_not_zeros():
    history = GpuHistory()
    for k in range(20):
        silent = 8 <= k < 14  # device 1 sends nothing for 6 s
        history.add(sample(0, "node-a", 200.0 + k, reading(0, 1980, power=None if k >= 15 else 500.0),
                           *(() if silent else (reading(1, 1700),))))
    grid = gpu_grid(history.readings(), grid_rows({}, history.devices(), gpus=0), max_bins=19)
    assert grid.mean_MRB.shape[2] == 12  # 19 s / (1.5 x 1 s)
    clock_1 = grid.mean_MRB[CLOCK, 1]
    silent_bins = (grid.edges_s[:-1] > 207.0) & (grid.edges_s[1:] < 214.0)  # bins of 1.58 s: 3 fit in between
    assert silent_bins.sum() == 3 and np.isnan(clock_1[silent_bins]).all()
    assert (clock_1[~silent_bins] == 1700).all()
    power_0 = grid.mean_MRB[POWER, 0]  # NVML could not read the power from 15 s on: the last bins are gaps
    assert np.isnan(power_0[-2:]).all() and (power_0[:8] == 500).all() and np.isnan(grid.latest_MR[POWER, 0])
    assert not (grid.mean_MRB == 0).any()
    clock_heat = gpu_figures.nvml_heatmaps(grid, marked_row=None)[0]  # a gap draws no rect
    assert len(clock_heat.data["cells"]) == np.isfinite(grid.mean_MRB[CLOCK]).sum() < 2 * 12


def test_a_device_silent_for_longer_than_the_span_keeps_its_row_and_latest_reading():
    history = GpuHistory()
    history.add(sample(0, "old", 0.0, reading(0, 900)))
    for k in range(10):
        history.add(sample(1, "new", 5000.0 + k, reading(0, 1980)))
    grid = gpu_grid(history.readings(), grid_rows({}, history.devices(), gpus=0), max_bins=120, max_span_s=60)
    assert grid.edges_s[0] == 5000.0 and grid.names_R == ["new #0", "old #0"]
    assert np.isnan(grid.mean_MRB[:, 1]).all() and grid.latest_MR[CLOCK, 1] == 900 and grid.latest_s_R[1] == 0.0


def test_no_readings_give_an_empty_grid():
    grid = gpu_grid({}, grid_rows({}, [], gpus=4), max_bins=120)
    assert grid.names_R == [] and grid.mean_MRB.shape == (len(GRID_FIELDS), 0, 0) and grid.edges_s.size == 0
    rows = [(g, None) for g in range(4)]
    grid = gpu_grid({}, rows, max_bins=120)
    assert grid.names_R == [f"GPU {g}" for g in range(4)] and grid.mean_MRB.shape[2] == 0
    with pytest.raises(ValueError, match="max_bins"):
        gpu_grid({}, rows, max_bins=0)


def test_256_gpus_a_full_ring_each_stay_under_the_cell_budget():
    history = GpuHistory(max_samples=900)
    gpus = 256
    for k in range(1000):  # past the ring's 900: the oldest readings are gone
        for rank in range(gpus):
            clock = 1410 if rank == 200 else 1980
            history.add(sample(rank, f"node-{rank // 8}", 0.5 * k + 0.001 * rank, reading(rank % 8, clock)))
    pairs, note = history.pairing(gpus, gpus)
    assert len(pairs) == gpus and note == ""
    rows = grid_rows(pairs, history.devices(), gpus)
    bins = gpu_figures.grid_bins(len(rows))
    grid = gpu_grid(history.readings(), rows, bins)
    assert bins == 58 and grid.mean_MRB.shape == (len(GRID_FIELDS), gpus, bins)
    assert grid.edges_s[0] == pytest.approx(0.5 * 100) and grid.newest_s == pytest.approx(0.5 * 999 + 0.255)
    assert np.isfinite(grid.mean_MRB).all()
    assert (grid.mean_MRB[CLOCK, 200] == 1410).all() and (np.delete(grid.mean_MRB[CLOCK], 200, 0) == 1980).all()
    heatmaps = gpu_figures.nvml_heatmaps(grid, marked_row=200)
    assert len(heatmaps) == len(gpu_figures.HEAT_PANELS)
    assert all(len(h.data["cells"]) == gpus * bins <= gpu_figures.NVML_HEAT_CELLS for h in heatmaps)
    assert heatmaps[0].data["marked"]["row"].tolist() == [200] and heatmaps[0].spec["params"][0]["value"][200] == "GPU 200"
