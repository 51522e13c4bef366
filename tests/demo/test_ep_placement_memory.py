"""The EP runtime's routing table (demo/ep/placement.py) is O(L x (P + E)) whatever the replica counts: a valid
65,536-slot layout that gives one expert nearly every slot (the worst case of a dense [L, E, most replicas]
table: 4 x 256 x 65,281 int64 = 510 MiB per copy, two copies while it was built) costs a few MiB, measured as the
bytes of its arrays and as the peak resident memory of a process that builds it. Destinations follow the
documented rule (replica r_(n mod c) of the expert's slots in slot order) on random layouts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from moe_monitor.demo.ep.placement import Placement

ROOT = Path(__file__).resolve().parents[2]
L, E, RANKS, P = 4, 256, 4, 65_536
MIB = 1 << 20


def hot_layout() -> np.ndarray:
    """int64 [L, P]: every expert once, every other slot a replica of expert 0 (a valid layout)."""
    layout_LP = np.zeros((L, P), dtype=np.int64)
    layout_LP[:, :E] = np.arange(E)
    return layout_LP


def test_table_of_a_65536_slot_layout_is_o_of_p():
    placement = Placement(hot_layout(), RANKS, E)
    most_replicas = int(placement.replica_count_LE.max())
    dense_bytes = L * E * most_replicas * 8  # what a [L, E, most replicas] int64 table takes
    table = placement.table_bytes()
    print(f"routing table: {table / MIB:.2f} MiB (dense [L, E, C]: {dense_bytes / MIB:.0f} MiB per copy, "
          f"{dense_bytes / table:.0f}x)")
    assert most_replicas == P - E + 1
    assert table <= 8 * L * (P + 2 * E)
    ids_NK = torch.zeros((16, 2), dtype=torch.int64)  # 32 (token, expert 0) pairs over expert 0's replicas
    assert placement.destinations(0, ids_NK).tolist() == [0] * 32  # its first replicas are all on rank 0


def test_peak_memory_of_building_it_in_a_process():
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1])\n"
        "from tests.demo.test_ep_placement_memory import hot_layout, RANKS, E\n"
        "from tests.support.memprobe import peak_rss_bytes\n"
        "from moe_monitor.demo.ep.placement import Placement\n"
        "layout = hot_layout(); before = peak_rss_bytes() // 1024\n"
        "placement = Placement(layout, RANKS, E)\n"
        "after = peak_rss_bytes() // 1024\n"
        "print(json.dumps({'before_kib': before, 'after_kib': after}))\n")
    out = subprocess.run([sys.executable, "-c", script, str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    rss = json.loads(out.strip().splitlines()[-1])
    grown_mib = (rss["after_kib"] - rss["before_kib"]) / 1024
    print(f"peak RSS {rss['before_kib'] / 1024:.0f} -> {rss['after_kib'] / 1024:.0f} MiB (+{grown_mib:.1f} MiB)")
    assert grown_mib < 64


def test_destinations_follow_the_slot_order_rule():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ranks, experts = 4, 16
        slots = experts + 4 * int(rng.integers(0, 6))
        layout_LP = np.stack([rng.permutation(np.concatenate([np.arange(experts),
                                                              rng.integers(0, experts, slots - experts)]))
                              for _ in range(3)])
        placement = Placement(layout_LP, ranks, experts)
        per_rank = slots // ranks
        for layer in range(3):
            ids_NK = torch.from_numpy(rng.integers(0, experts, (40, 3)))
            got = placement.destinations(layer, ids_NK).tolist()
            want = []
            for n, row in enumerate(ids_NK.tolist()):
                for expert in row:
                    replicas = np.flatnonzero(layout_LP[layer] == expert)
                    want.append(int(replicas[n % len(replicas)]) // per_rank)
            assert got == want
