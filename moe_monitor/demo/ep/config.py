"""EPConfig: everything one expert-parallel run does, picklable so that every spawned rank gets the same."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EPConfig:
    """One EP run on `ranks` processes.

    layout: the initial physical_to_logical_map as nested lists [L][P] (None: contiguous, P = E); P must be a
    multiple of ranks (slot p on rank p // (P / ranks)).
    steps: steps to run (0: until `seconds`); seconds: wall-clock limit (0: none; rank 0 decides, all stop at the
    same step). batch x seq_len: each rank's own tokens per step (data-parallel attention). step_period_s:
    the traffic's virtual clock advances this much per step (drift is a function of the step, identical on every
    rank and reproducible). sync_every: steps between control broadcasts (stop, a new layout).
    redis_url / run: where the collectors publish (None: counts in memory only) and whose layouts stream rank 0
    watches for "apply" records. timing: time the MoE layers (collectors time_layer); timing_toggle_every: > 0
    alternates blocks of that many steps with timing on and off (the bench's overhead measurement).
    auto_plan_at_step / auto_plan_redundant: > 0: at that step the counts so far (all ranks summed) go through
    planner.plan(gpus=ranks, redundant=...) and the result is applied live like an "apply" record.
    apply_secret_file: the file holding the secret layout requests are signed with (None: $MOE_APPLY_SECRET_FILE,
    else $MOE_APPLY_SECRET; none of them: every request is refused). Only rank 0 reads it; it never travels in
    the config. max_slots_per_rank / max_replicas_per_expert: the largest request the ranks take (slots on one
    rank, replicas of one expert in one layer; 0: as many as there are ranks); larger ones are refused "too
    large" (the initial layout is the operator's own and is not bounded).
    stop_after_apply_steps: > 0: stop once a layout applied live has been in force this many steps (tests).
    save_outputs: keep every step's tokens and logits in the rank's result file (tests).
    grouped_experts: run each rank's experts as two grouped GEMMs (time follows the tokens, as in a real engine;
    equal to the single-process forward within float rounding) instead of one GEMM per (source, expert), which
    reproduces transformers' eager loop bit for bit but costs per group (the demo and bench use grouped).
    hidden_size / moe_intermediate_size / num_experts / top_k: the model's dimensions (demo.model.build_model;
    the defaults are the demo's tiny DeepSeek-V3), declared in the run's metadata for the cost model.
    expert_log_pop: a fixed log-popularity per expert for the routers' bias (times strength; every layer, no
    drift); None: the demo's Zipf-skewed drifting bias. shapes: (batch, seq_len) of each step, cycled (step s
    runs shapes[s % len]: decode- and prefill-sized steps in one run); empty: batch x seq_len every step.
    serial_compute: the ranks take turns in each layer's expert compute (a barrier between turns), so each
    rank's compute is timed with the CPU's memory bandwidth to itself, as each GPU has its own HBM (the
    cost-model bench); off: they compute at once.
    """

    ranks: int = 2
    layout: list[list[int]] | None = None
    steps: int = 0
    seconds: float = 0.0
    batch: int = 4
    seq_len: int = 16
    moe_layers: int = 4
    seed: int = 0
    strength: float = 0.05
    drift_period_s: float = 60.0
    step_period_s: float = 0.25
    sync_every: int = 4
    redis_url: str | None = None
    run: str = "ep-demo"
    apply_secret_file: str | None = None
    max_slots_per_rank: int = 512
    max_replicas_per_expert: int = 0
    timing: bool = True
    grouped_experts: bool = False
    timing_toggle_every: int = 0
    auto_plan_at_step: int = 0
    auto_plan_redundant: int = 0
    stop_after_apply_steps: int = 0
    min_step_interval_s: float = 0.0
    save_outputs: bool = False
    threads: int = 0
    timeout_s: float = 120.0
    nvml: bool = True
    hidden_size: int = 64
    moe_intermediate_size: int = 32
    num_experts: int = 256
    top_k: int = 8
    expert_log_pop: tuple[float, ...] | None = None
    shapes: tuple[tuple[int, int], ...] = ()
    serial_compute: bool = False

    def check(self) -> EPConfig:
        """self, or ValueError naming the bad field."""
        if not 2 <= self.ranks <= 8:
            raise ValueError(f"--ranks must be 2..8, got {self.ranks}")
        if self.steps < 0 or self.seconds < 0 or (self.steps == 0 and self.seconds == 0):
            raise ValueError("give a positive number of steps or seconds")
        if self.batch < 1 or self.seq_len < 1 or self.moe_layers < 1 or self.sync_every < 1:
            raise ValueError("batch, seq_len, moe_layers and sync_every must be >= 1")
        if self.max_slots_per_rank < 1 or self.max_replicas_per_expert < 0:
            raise ValueError("max_slots_per_rank must be >= 1 and max_replicas_per_expert >= 0")
        if self.timing_toggle_every < 0 or self.auto_plan_at_step < 0 or self.auto_plan_redundant < 0:
            raise ValueError("timing_toggle_every, auto_plan_at_step and auto_plan_redundant must be >= 0")
        if min(self.hidden_size, self.moe_intermediate_size, self.top_k) < 1 or self.top_k > self.num_experts:
            raise ValueError("hidden_size, moe_intermediate_size and top_k must be >= 1, top_k <= num_experts")
        if any(min(shape) < 1 for shape in self.shapes):
            raise ValueError("every (batch, seq_len) of shapes must be >= 1")
        if self.expert_log_pop is not None and len(self.expert_log_pop) != self.num_experts:
            raise ValueError(f"expert_log_pop needs {self.num_experts} values, got {len(self.expert_log_pop)}")
        return self

    @property
    def replicas_bound(self) -> int:
        """The most replicas of one expert in one layer that a request may ask for."""
        return self.max_replicas_per_expert or self.ranks
