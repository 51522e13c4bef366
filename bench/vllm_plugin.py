"""The vLLM plugin's cost on a real vLLM (its CPU build, in .venv-engines): tokens/s with the plugin over the same
engine without it, on the tiny Qwen3-MoE of the engine tests (goal: >= 0.97).

    python -m bench.vllm_plugin [--baseline REV] [--rounds 30] [--mode compiled|eager] [--profile]

All engines are up at once, each a vLLM process of its own driven by tests/engines (Engine, vllm_run):
    A   no plugin (no MOE_MONITOR_REDIS_URL)          A2  a second plugin-less engine: the A/A control
    B   the plugin of this tree, publishing to a private redis-server
    C   (--baseline REV, default $MOE_BENCH_BASELINE) the plugin as of REV (bench/baseline.py's export first on
        the engine's PYTHONPATH; the engine process reports the moe_monitor it imports, checked here)
Rounds: each engine in turn, in a random order, generates greedily (LEAD_BATCHES + TIMED_BATCHES + TAIL_BATCHES
generations of 8 prompts x 96 new tokens, the middle ones timed, about 0.7 s) while every other engine is idle:
after the plugin engines' published steps have landed (so one engine's publisher never runs in another's turn),
QUIET_S after the previous turn (every engine's vLLM workers spin on their queue for BUSY_LOOP_S after their last
read, not vLLM's 1 s: SITE) and after a two-token request has woken its own workers. The figure: the median over
rounds of each engine's tokens/s over A's in the same round. On this 2-core VM an A/A control's quartiles span
10-15 points, with turns 1.5 s apart as with turns 0.15 s apart (30 rounds: 0.919..1.022): its speed drifts within
a second, so the bench ranks effects of several points, not of one or two.
--profile: each plugin engine also times the plugin's per-step work (the execute_model wrapper's begin and end, the
capture function of every layer, the publisher and writer threads' CPU time) and prints it.
Diagnosis: --variants nocapture,nostep,nopublish,nosample and --patch FILE add engines of this tree's plugin with
a part of it switched off, or with a prototype fix run in the engine process. vLLM's compile cache is off in every
engine (they share one checkpoint: each compiles its own graph, as a fresh server does).
Run with any python: it re-executes itself with .venv-engines/bin/python (and bench/malloc_env.py's settings);
without .venv-engines it says so in one line and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.malloc_env import STEADY

REPO = Path(__file__).resolve().parents[1]
ENGINES_VENV = REPO / ".venv-engines"
GOAL = 0.97
PROMPTS, NEW_TOKENS, VOCAB = 8, 96, 512
# one engine's turn: LEAD_BATCHES generations of PROMPTS prompts, then TIMED_BATCHES timed together (about 0.7 s),
# then TAIL_BATCHES: the plugin's publisher is in its steady state while the clock runs (its rounds of the lead
# batch's steps fall in the timed part, those of the timed part's last steps in the tail), as in a server
LEAD_BATCHES, TIMED_BATCHES, TAIL_BATCHES = 1, 4, 1
# vLLM's workers keep spinning on their shared-memory queue for busy_loop_s (1 s) after their last read
# (shm_broadcast's SpinCondition): BUSY_LOOP_S in every engine alike (SITE), and each turn starts QUIET_S after
# the previous one, once its engine has gone idle, and after a two-token request has woken its own workers
BUSY_LOOP_S = 0.05
QUIET_S = 0.15
SETTLED_S = 0.4  # a plugin engine's stream is settled once it has not grown for this long (> publish_interval_s)

# sitecustomize of every engine process: which moe_monitor it imports, and (MOE_BENCH_PROFILE=dir) timers around
# the plugin's per-step work, dumped as JSON every half second by the process that binds a model runner
SITE = r'''
import importlib.util, os, sys
_spec = importlib.util.find_spec("moe_monitor")
sys.stderr.write(f"moe-bench: pid {os.getpid()} imports moe_monitor from {_spec.origin if _spec else None}\n")
_VARIANT = os.environ.get("MOE_BENCH_VARIANT", "")
_DIR = os.environ.get("MOE_BENCH_PROFILE")
_PATCH = os.environ.get("MOE_BENCH_PATCH")
import importlib.abc
_BUSY_LOOP_S = os.environ.get("MOE_BENCH_BUSY_LOOP_S")


def _quiet_spin(mod):
    """vLLM's readers spin on their shared-memory queue for busy_loop_s (1 s) after their last read: shorter here,
    in every engine alike, so that an idle engine stops taking CPU from the one measured soon after its turn."""
    if not _BUSY_LOOP_S:
        return
    import inspect
    init = mod.SpinCondition.__init__
    defaults = [p.name for p in inspect.signature(init).parameters.values() if p.default is not p.empty]
    if defaults == ["busy_loop_s"]:
        init.__defaults__ = (float(_BUSY_LOOP_S),)
    else:
        sys.stderr.write(f"moe-bench: SpinCondition's defaults are {defaults}, not busy_loop_s: left as they are\n")


_patch = None
if _DIR or _VARIANT or _PATCH:
    import functools, json, threading, time
    _T = {"begin_s": 0.0, "end_s": 0.0, "end_step_s": 0.0, "capture_s": 0.0, "capture_calls": 0, "steps": 0}

    def _timed(fn, key, count=None):
        import torch

        @functools.wraps(fn)
        def inner(*a, **k):
            if torch.compiler.is_compiling():  # traced into the graph: timed as a part of it, not here
                return fn(*a, **k)
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                _T[key] += time.perf_counter() - t
                _T[key + "_cpu"] = _T.get(key + "_cpu", 0.0) + time.thread_time() - c
                if count:
                    _T[count] += 1
        return inner

    def _threads():
        tick, out = os.sysconf("SC_CLK_TCK"), {}
        for th in threading.enumerate():
            try:
                with open(f"/proc/self/task/{th.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[th.name] = out.get(th.name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
            except (OSError, TypeError, IndexError):
                pass
        return out

    def _dump():
        while True:
            time.sleep(0.5)
            with open(os.path.join(_DIR, f"{os.getpid()}.json"), "w") as f:
                json.dump({**_T, "threads": _threads()}, f)

    def _patch(mod):
        if _PATCH:                     # a prototype fix, run once the plugin's binding module is loaded
            with open(_PATCH) as f:
                exec(compile(f.read(), _PATCH, "exec"), {"__name__": "moe_bench_patch"})
        cls = mod.RunnerBinding
        if _VARIANT == "nocapture":    # the plugin without its per-layer counting ops (in the graph when compiled)
            cls._capture_fn = lambda self, *a, **k: (lambda topk_ids: None)
        if _VARIANT == "nostep":       # the plugin without its step boundary (no gate, no step, nothing published)
            cls.begin = lambda self, scheduler_output: None
            cls.end = lambda self: None
        if _VARIANT == "nopublish":    # steps closed and their slots handed back, never decoded nor written
            from moe_monitor.collectors.publisher import Publisher
            Publisher.submit = lambda self, job: self._release(job.slot)
        if not _DIR:
            return
        cls.begin = _timed(cls.begin, "begin_s")
        cls.end = _timed(cls.end, "end_s", "steps")
        make = cls._capture_fn
        cls._capture_fn = lambda self, *a, **k: _timed(make(self, *a, **k), "capture_s", "capture_calls")
        from moe_monitor.collectors.monitor import ExpertLoadMonitor
        ExpertLoadMonitor.end_step = _timed(ExpertLoadMonitor.end_step, "end_step_s")
        threading.Thread(target=_dump, daemon=True).start()

_AFTER_IMPORT = {"vllm.distributed.device_communicators.shm_broadcast": _quiet_spin}
if _patch is not None:
    _AFTER_IMPORT["moe_monitor.collectors.vllm.binding"] = _patch


class _Finder(importlib.abc.MetaPathFinder):
    busy = False
    def find_spec(self, name, path, target=None):
        if name not in _AFTER_IMPORT or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _AFTER_IMPORT[name](module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, _Finder())
'''


def engines_python() -> Path | None:
    python = ENGINES_VENV / "bin" / "python"
    return python if python.exists() else None


def reexec_if_needed(python: Path) -> None:
    """Run under .venv-engines' python with the steady malloc settings (values already set win)."""
    here = Path(sys.prefix).resolve() == ENGINES_VENV.resolve()
    if here and all(name in os.environ for name in STEADY):
        return
    argv = [str(python), "-m", "bench.vllm_plugin", *sys.argv[1:]]
    os.execve(str(python), argv, {**STEADY, **os.environ})


def moe_monitor_origin(log_path: Path) -> set[str]:
    """The moe_monitor packages the engine's processes imported (the sitecustomize lines in its log)."""
    found = set()
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("moe-bench: pid ") and " from " in line:
            found.add(line.split(" from ", 1)[1].strip())
    return found


def settle(client, key: str, timeout_s: float = 5.0) -> None:
    """Wait until the stream stops growing (the plugin's publisher has nothing left for this round)."""
    last, stable_since, deadline = -1, time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = client.xlen(key)
        if n != last:
            last, stable_since = n, time.monotonic()
        elif time.monotonic() - stable_since > SETTLED_S:
            return
        time.sleep(0.03)


def profile_summary(folder: Path) -> list[str]:
    """The plugin's per-step work in one engine (SITE's timers), one line per process that bound a runner."""
    lines = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        steps = max(1, data["steps"])
        per = {key: 1e6 * data.get(key, 0.0) / steps for key in ("begin_s", "end_s", "end_step_s", "capture_s",
                                                                  "begin_s_cpu", "end_s_cpu", "end_step_s_cpu")}
        capture = (f"capture {per['capture_s']:.0f} us ({data['capture_calls'] / steps:.1f} calls)"
                   if data["capture_calls"] else "capture: traced into the compiled graph")
        threads = ", ".join(f"{name} {cpu:.2f}" for name, cpu in sorted(data["threads"].items()))
        lines.append(f"    {data['steps']} steps; us per step (wall/thread CPU): begin {per['begin_s']:.0f}/"
                     f"{per['begin_s_cpu']:.0f}, end {per['end_s']:.0f}/{per['end_s_cpu']:.0f} (end_step "
                     f"{per['end_step_s']:.0f}/{per['end_step_s_cpu']:.0f}), {capture}")
        lines.append(f"    thread CPU s: {threads}")
    return lines or ["    no profile written"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=os.environ.get("MOE_BENCH_BASELINE") or None,
                        help="also measure the plugin as of this git revision (default $MOE_BENCH_BASELINE)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--mode", choices=("compiled", "eager"), default="compiled")
    parser.add_argument("--no-control", action="store_true", help="skip the second plugin-less engine (A2)")
    parser.add_argument("--profile", action="store_true", help="time the plugin's per-step work in B and C")
    parser.add_argument("--variants", default="", help="diagnosis: comma-separated plugin variants of this tree, "
                        "each one more engine: nocapture (no per-layer counting), nostep (no step boundary), "
                        "nopublish (steps closed, never published), nosample (MOE_MONITOR_SAMPLE_TOKENS=0)")
    parser.add_argument("--patch", type=Path, help="diagnosis: one more engine, 'patched': this tree's plugin "
                        "with this Python file run in the engine process once the plugin's binding module is loaded "
                        "(a prototype fix)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    python = engines_python()
    if python is None:
        print("bench.vllm_plugin: skipped: no vLLM here (`make .venv-engines/.installed` is needed)")
        return 0
    reexec_if_needed(python)

    from bench.baseline import export_package
    from moe_monitor.core import steps_key
    from moe_monitor.demo.checkpoints import write_checkpoint
    from moe_monitor.demo.localredis import RedisServer
    from tests.engines.engine import Engine

    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    checkpoint = write_checkpoint("qwen3_moe", work / "qwen3_moe")
    server = RedisServer(work)
    base_path = [str(site), str(REPO)]
    specs: dict[str, tuple[dict[str, str], str]] = {"A": ({}, str(REPO / "moe_monitor"))}
    if not args.no_control:
        specs["A2"] = ({}, str(REPO / "moe_monitor"))

    def plugin_env(name: str) -> dict[str, str]:
        env = {"MOE_MONITOR_REDIS_URL": server.url, "MOE_MONITOR_RUN": f"bench-{name.lower()}",
               "MOE_MONITOR_NVML": "0"}
        if args.profile:
            (work / f"profile-{name}").mkdir()
            env["MOE_BENCH_PROFILE"] = str(work / f"profile-{name}")
        return env

    specs["B"] = (plugin_env("B"), str(REPO / "moe_monitor"))
    what = {"A": "no plugin", "A2": "no plugin (A/A control)", "B": "plugin, this tree",
            "C": f"plugin as of {args.baseline}"}
    for variant in filter(None, args.variants.split(",")):
        if variant not in ("nocapture", "nostep", "nopublish", "nosample"):
            parser.error(f"unknown variant {variant!r}")
        env = {**plugin_env(variant), "MOE_BENCH_VARIANT": variant}
        if variant == "nosample":
            env["MOE_MONITOR_SAMPLE_TOKENS"] = "0"
        specs[variant] = (env, str(REPO / "moe_monitor"))
        what[variant] = f"plugin, {variant}"
    if args.patch:
        specs["patched"] = ({**plugin_env("patched"), "MOE_BENCH_PATCH": str(args.patch.resolve())},
                            str(REPO / "moe_monitor"))
        what["patched"] = f"plugin + {args.patch.name}"
    baseline_note = ""
    if args.baseline:
        folder, why = export_package(args.baseline)
        if folder is None:
            baseline_note = f"baseline {args.baseline} not measured: {why}"
        else:
            specs["C"] = ({**plugin_env("C"), "PYTHONPATH": os.pathsep.join([str(site), str(folder), str(REPO)])},
                          str(folder / "moe_monitor"))
    engines: dict[str, Engine] = {}
    client = server.client()
    try:
        for name, (env, _) in specs.items():
            # no compile cache: the engines share one checkpoint, and each compiles its own graph as a fresh
            # server does (none loads another's)
            env = {"PYTHONPATH": os.pathsep.join(base_path), "VLLM_DISABLE_COMPILE_CACHE": "1",
                   "MOE_BENCH_BUSY_LOOP_S": str(BUSY_LOOP_S), **env}
            engines[name] = Engine(checkpoint, args.mode, env, work / f"engine-{name}.log", wait=False)
        for engine in engines.values():
            engine.wait_ready(900)
        for name, (_, package) in specs.items():  # each engine imported the moe_monitor meant for it
            origins = {str(Path(o).parent) for o in moe_monitor_origin(engines[name].log_path)}
            if origins != {package}:
                raise SystemExit(f"engine {name} imported moe_monitor from {origins}, not {package}")
        rng = random.Random(args.seed)
        names = list(engines)
        tps: dict[str, list[float]] = {name: [] for name in names}
        ratios: dict[str, list[float]] = {name: [] for name in names if name != "A"}
        for round_index in range(args.warmup + args.rounds):
            batches = [[[rng.randrange(3, VOCAB) for _ in range(rng.randrange(8, 24))] for _ in range(PROMPTS)]
                       for _ in range(LEAD_BATCHES + TIMED_BATCHES + TAIL_BATCHES)]
            timed = slice(LEAD_BATCHES, LEAD_BATCHES + TIMED_BATCHES)
            order = names[:]
            rng.shuffle(order)
            this: dict[str, float] = {}
            outputs = {}
            for name in order:
                time.sleep(QUIET_S)
                engines[name].generate([[1, 2, 3]], 2)  # its workers out of their idle wait before the clock starts
                outputs[name] = [engines[name].generate(prompts, NEW_TOKENS) for prompts in batches[:timed.start]]
                start = time.perf_counter()
                outputs[name] += [engines[name].generate(prompts, NEW_TOKENS) for prompts in batches[timed]]
                elapsed = time.perf_counter() - start
                outputs[name] += [engines[name].generate(prompts, NEW_TOKENS) for prompts in batches[timed.stop:]]
                this[name] = sum(len(o) for batch in outputs[name][timed] for o in batch) / elapsed
                if name not in ("A", "A2"):
                    settle(client, steps_key(f"bench-{name.lower()}"))
            if any(out != outputs["A"] for out in outputs.values()):
                raise SystemExit(f"round {round_index}: the engines generated different tokens")
            if round_index < args.warmup:
                continue
            for name in names:
                tps[name].append(this[name])
                if name != "A":
                    ratios[name].append(this[name] / this["A"])
        published = {name: client.xlen(steps_key(f"bench-{name.lower()}")) for name in names if name not in ("A", "A2")}
    finally:
        for engine in engines.values():
            engine.close()
        server.stop()

    print(f"vLLM {args.mode} (CPU build), tiny Qwen3-MoE (2 layers x 8 experts, top-2), float32; {args.rounds} rounds "
          f"of {TIMED_BATCHES} x {PROMPTS} prompts x {NEW_TOKENS} new tokens timed per engine (between {LEAD_BATCHES} and "
          f"{TAIL_BATCHES} untimed) after {args.warmup} warm-up, engines in random order; "
          f"load average {Path('/proc/loadavg').read_text().split()[0]}")
    print(f"  {'engine':<9} {'what':<28} {'tok/s median':>12} {'ratio to A: median':>19} {'p25..p75':>13}")
    for name in names:
        ratio = ratios.get(name)
        if ratio:
            q = statistics.quantiles(ratio, n=4)
            cells = f"{statistics.median(ratio):>19.3f} {q[0]:>6.3f}..{q[2]:.3f}"
        else:
            cells = f"{'1':>19} {'':>13}"
        print(f"  {name:<9} {what[name]:<28} {statistics.median(tps[name]):>12.0f} {cells}")
    print(f"  published steps: {published}")
    if baseline_note:
        print(f"  {baseline_note}")
    if args.profile:
        for name in names:
            if (work / f"profile-{name}").is_dir():
                print(f"  profile {name}:")
                for line in profile_summary(work / f"profile-{name}"):
                    print(line)
    passed = statistics.median(ratios["B"]) >= GOAL
    print(f"vLLM plugin tokens/s ratio >= {GOAL}: {'PASS' if passed else 'FAIL'}"
          f" ({statistics.median(ratios['B']):.3f}" + (f"; the previous main {statistics.median(ratios['C']):.3f}"
                                                      if "C" in ratios else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
