"""The vLLM plugin's rules, read from plain values and vLLM's host-side objects (pure: no vLLM or torch import).

Used by the package's register() and by binding.RunnerBinding: the settings from the environment
(settings_from_env), which ranks publish under which numbering (publishing_rule), what a step holds
(step_facts), which rows of a router's topk_ids [N, K] are this rank's tokens (local_span), the bytes of an
expert weight under the model's quantization (weight_bytes), and the plugin's
factor of vLLM's compile-cache key (graph_key, bind_cache_key). docs/vllm-parallel.md gives the parallel
layouts these rules follow; docs/collectors.md the settings and why the compile-cache factor exists.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------ settings
ENV_URL = "MOE_MONITOR_REDIS_URL"
ENV_RUN = "MOE_MONITOR_RUN"
_INT_OPTIONS = {"MOE_MONITOR_SAMPLE_TOKENS": ("sample_tokens", 0, 4096, 1),
                "MOE_MONITOR_QUEUE_STEPS": ("queue_steps", 1, 1 << 20, 1),
                "MOE_MONITOR_MEMORY_BUDGET_MB": ("memory_budget_bytes", 1, 1 << 20, 1 << 20)}


@dataclass(frozen=True)
class PluginSettings:
    """redis_url None: the plugin stays off. run None: named after the served model. options: MonitorOptions
    fields by name."""

    redis_url: str | None
    run: str | None
    options: dict[str, Any] = field(default_factory=dict)


def settings_from_env(env: Mapping[str, str]) -> PluginSettings:
    """The plugin's settings from environment variables; ValueError naming the variable that is wrong.

        MOE_MONITOR_REDIS_URL        where to publish (redis://, rediss://); unset: the plugin only logs a line
        MOE_MONITOR_RUN              the run's name (default: the served model's name, made a valid run name)
        MOE_MONITOR_SAMPLE_TOKENS    sampled routing rows per layer and step (default 16; 0: off)
        MOE_MONITOR_QUEUE_STEPS      steps kept while Redis is unreachable (default 1024)
        MOE_MONITOR_MEMORY_BUDGET_MB the step stream's memory budget in Redis (default 256)
        MOE_MONITOR_NVML             1/0: sample the GPUs with NVML (default 1)
        MOE_MONITOR_TRACE            also append every step to this trace file
    """
    url = env.get(ENV_URL, "").strip() or None
    run = env.get(ENV_RUN, "").strip() or None
    options: dict[str, Any] = {}
    for name, (option, least, most, scale) in _INT_OPTIONS.items():
        text = env.get(name, "").strip()
        if not text:
            continue
        if not re.fullmatch(r"[0-9]{1,9}", text) or not least <= int(text) <= most:
            raise ValueError(f"{name}={text[:40]!r} must be a whole number {least}..{most}")
        options[option] = int(text) * scale
    nvml = env.get("MOE_MONITOR_NVML", "").strip()
    if nvml:
        if nvml not in ("0", "1"):
            raise ValueError(f"MOE_MONITOR_NVML={nvml[:40]!r} must be 0 or 1")
        options["nvml"] = nvml == "1"
    trace = env.get("MOE_MONITOR_TRACE", "").strip()
    if trace:
        options["trace_path"] = trace
    return PluginSettings(url, run, options)


FP8_QUANTIZATIONS = ("fp8", "fbgemm_fp8", "modelopt", "compressed-tensors-fp8", "ptpc_fp8")  # 1-byte weights


def weight_bytes(quantization: str | None, dtype_bytes: int) -> int:
    """Bytes per expert weight for the cost model: 1 under an fp8 quantization (vLLM's model_config.quantization;
    the model dtype then names the activations'), else the model dtype's."""
    return 1 if (quantization or "").lower() in FP8_QUANTIZATIONS else int(dtype_bytes)


def run_name_for(model_name: str) -> str:
    """A valid run name from a served model's name: its last path part, other characters as '-'."""
    tail = model_name.rstrip("/").split("/")[-1] or "vllm"
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", tail)[:128]


# ------------------------------------------------------------------ who publishes
@dataclass(frozen=True)
class Publishing:
    """publishes: whether this rank publishes; rank, world_size: its publisher numbering; scope: core.SCOPES;
    gpus: the expert-parallel GPUs the layout spans; reason: one line for the log."""

    publishes: bool
    rank: int
    world_size: int
    scope: str
    gpus: int
    reason: str


def publishing_rule(tp_rank: int, tp_size: int, dp_rank: int, dp_size: int, pp_size: int,
                    expert_parallel: bool, sequence_parallel_moe: bool = False) -> Publishing:
    """The rule for one vLLM worker, so that the reader's sum over ranks counts each token once (its tensor-,
    data- and pipeline-parallel ranks and sizes; whether vLLM shards each group's tokens over its
    tensor-parallel ranks for the MoE layers):
        tensor parallelism T: the T ranks of a group route the same tokens; TP rank 0 publishes (scope
            "dp-group"). Data parallelism D: each group publishes its own tokens, as rank dp_rank of D.
        expert parallelism: the layout spans T x D GPUs, else 1 (every rank holds a slice of every expert).
        pipeline parallelism > 1: not supported yet, nothing is published.
        sequence-parallel MoE (T > 1, D > 1, expert parallelism, all-gather / DeepEP backends): every rank
            publishes its shard of its group's tokens, as rank dp_rank * T + tp_rank of T x D (scope "rank").
    """
    gpus = tp_size * dp_size if expert_parallel else 1
    scope = "dp-group" if tp_size > 1 else "rank"
    if pp_size > 1:
        return Publishing(False, dp_rank, dp_size, scope, gpus,
                          f"pipeline parallel size {pp_size}: not supported yet, nothing is published")
    if sequence_parallel_moe and tp_size > 1:
        rank = dp_rank * tp_size + tp_rank
        return Publishing(True, rank, dp_size * tp_size, "rank", gpus,
                          f"publishes its shard of data-parallel group {dp_rank}'s tokens (sequence-parallel MoE: "
                          f"tensor-parallel rank {tp_rank} of {tp_size}), as rank {rank} of {dp_size * tp_size}")
    if tp_rank != 0:
        return Publishing(False, dp_rank, dp_size, scope, gpus,
                          f"tensor-parallel rank {tp_rank}: rank 0 of the group publishes its tokens")
    who = (f"data-parallel group {dp_rank} of {dp_size}" if dp_size > 1 else "the only data-parallel group")
    shared = f", on behalf of its {tp_size} tensor-parallel ranks" if tp_size > 1 else ""
    return Publishing(True, dp_rank, dp_size, scope, gpus, f"publishes the tokens of {who}{shared}")


# ------------------------------------------------------------------ a step
def batch_phase(num_scheduled_tokens: Mapping[str, int], spec_decode_tokens: Mapping[str, Sequence[int]],
                new_request_ids: Collection[str]) -> str:
    """"decode" when every request of the step decodes (one token, plus its speculative tokens, and it is
    not new), "prefill" when none does, "mixed" otherwise, "unknown" for an empty step. A prefill chunk of
    exactly one token reads as decode (vLLM does not say which it is)."""
    if not num_scheduled_tokens:
        return "unknown"
    decoding = [req not in new_request_ids and tokens == 1 + len(spec_decode_tokens.get(req, ()))
                for req, tokens in num_scheduled_tokens.items()]
    if all(decoding):
        return "decode"
    return "mixed" if any(decoding) else "prefill"


def step_facts(scheduler_output) -> tuple[int, str]:
    """(real tokens, phase) of a vLLM SchedulerOutput; (0, "unknown") when it lacks the fields."""
    tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
    per_request = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    new_reqs = getattr(scheduler_output, "scheduled_new_reqs", None) or ()
    if not new_reqs and not spec and per_request and tokens == len(per_request) and max(per_request.values()) == 1:
        return tokens, "decode"  # one token each (their sum is their count, none above 1): no Python loop per step
    new = {str(getattr(req, "req_id", "")) for req in new_reqs}
    return tokens, batch_phase(per_request, spec, new)


def local_span(num_rows: int, dp_rank: int, num_tokens_across_dp: Sequence[int] | None, tp_rank: int = 0,
               tp_size: int = 1) -> tuple[int, int, int] | None:
    """(first row, rows, first local token) of this rank's tokens among num_rows routed rows: the rows
    [first, first + rows) are local tokens [token, token + rows). num_tokens_across_dp: tokens [D] of every DP
    rank this step (vLLM's dp_metadata), None without data parallelism. None when num_rows fits no layout.
    vLLM 0.32's layouts, told apart by N as its own routed-experts capturer does (padding at the end of a span):
        N == sum(num_tokens_across_dp)      all DP ranks' tokens gathered: this rank's rows follow the ranks before
        N == num_tokens_across_dp[dp_rank]  only this rank's tokens
        N == ceil(local / tp_size)          sequence-parallel MoE: TP rank r routes local tokens [r * N, (r + 1) * N)
    """
    if num_tokens_across_dp is None:
        return 0, num_rows, 0
    sizes = [int(n) for n in num_tokens_across_dp]
    if not 0 <= dp_rank < len(sizes):
        return None
    local = sizes[dp_rank]
    if num_rows == sum(sizes) and len(sizes) > 1:
        return sum(sizes[:dp_rank]), local, 0
    if num_rows == local:
        return 0, local, 0
    if tp_size > 1 and num_rows == -(-local // tp_size):
        return 0, num_rows, tp_rank * num_rows
    return None


# ------------------------------------------------------------------ compile cache
CACHE_FACTOR = "moe_monitor_graph"
_HERE = Path(__file__).resolve().parent
# the code the capture functions run inside the traced forward: the binding's capture function, local_span (here),
# the router's chained capture (patch.py) and the counter's ops
TRACED_SOURCES = (_HERE / "binding.py", _HERE / "rules.py", _HERE / "patch.py", _HERE.parent / "counter.py")


def graph_key(shape: Mapping[str, object]) -> str:
    """16 hex digits naming the capture ops the plugin traces into the graph: its counting code (the
    TRACED_SOURCES' bytes) and `shape`, the sizes those ops are built from (layers, experts, top-k, sampled
    rows, gate length, ...; JSON values)."""
    digest = hashlib.sha256()
    for path in TRACED_SOURCES:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps(dict(shape), sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def bind_cache_key(vllm_config, key: str) -> str:
    """Put `key` into vLLM's compile-cache key (vllm_config.additional_config, a dict by default, changed in
    place: the model keeps the same config object), so that an engine with the plugin never loads a graph
    compiled without it. An additional_config of another kind cannot take it: the compile cache is turned off
    in this process instead (VLLM_DISABLE_COMPILE_CACHE, read by vLLM when it compiles, after the model is
    loaded). Returns what was done, for the log."""
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict):
        extra[CACHE_FACTOR] = key
        return f"compile-cache factor {key}"
    if extra is None:
        vllm_config.additional_config = {CACHE_FACTOR: key}
        return f"compile-cache factor {key}"
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    return f"compile cache off (additional_config is a {type(extra).__name__}, not a dict)"
