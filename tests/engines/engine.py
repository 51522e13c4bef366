"""Drive tests/engines/vllm_run.py in its own process and read what the plugin published."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from moe_monitor import core

REPO = Path(__file__).resolve().parents[2]


class Engine:
    """One vLLM engine process (eager or compiled) with the plugin configured by `env` (MOE_MONITOR_*) and more
    vllm.LLM keyword arguments in `engine_args` (tensor_parallel_size, ...). wait=False returns at once: call
    wait_ready() (data-parallel ranks start together, each waiting for the others)."""

    def __init__(self, checkpoint: Path, mode: str, env: dict[str, str], log_path: Path, timeout_s: float = 300,
                 engine_args: dict | None = None, wait: bool = True):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_MONITOR_")}
        full_env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2", **env})
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 (closed by close(), written by the pump thread)
        argv = [sys.executable, "-m", "tests.engines.vllm_run", str(checkpoint), mode]
        if engine_args:
            argv.append(json.dumps(engine_args))
        self.proc = subprocess.Popen(argv, cwd=REPO, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        self._log_lock = threading.Lock()  # close() may end the log while vLLM's children still write to the pipe
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 300) -> None:
        self._expect("ready", timeout_s)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._log_lock:
                if not self._log.closed:
                    self._log.write(line)
                    self._log.flush()
            if line.startswith("@@"):
                self._lines.put(line[2:].strip())
        self._lines.put("@@exit")

    def _expect(self, what: str | None, timeout_s: float) -> str:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"vLLM gave no answer in {timeout_s} s; log: {self.log_path}") from None
        if line == "@@exit" or (what is not None and line != what):
            raise AssertionError(f"vLLM stopped or answered {line[:200]!r}; log tail:\n{self.log_tail()}")
        return line

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def generate(self, prompts: list[list[int]], max_tokens: int, timeout_s: float = 120) -> list[list[int]]:
        self.send(prompts, max_tokens)
        return self.receive(timeout_s)

    def send(self, prompts: list[list[int]], max_tokens: int) -> None:
        """Ask for a greedy generation without waiting for it (data-parallel ranks generate together)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout_s: float = 120) -> list[list[int]]:
        """The generated ids of the last send(), one list per prompt."""
        return json.loads(self._expect(None, timeout_s))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"exit": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self._pump_thread.join(10)  # the rest of the output, unless a child of vLLM still holds the pipe
        with self._log_lock:
            self._log.close()


def published_steps(client, run: str) -> list[core.StepRecord]:
    return [core.decode_step(fields) for _, fields in client.xrange(core.steps_key(run))]


def wait_for_tokens(client, run: str, tokens: int, timeout_s: float = 20.0) -> list[core.StepRecord]:
    """The run's published steps once they hold `tokens` tokens (or whatever is there after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        steps = published_steps(client, run)
        if sum(s.tokens for s in steps) >= tokens or time.monotonic() > deadline:
            return steps
        time.sleep(0.1)


def total_counts(steps: list[core.StepRecord]) -> np.ndarray:
    return np.sum([s.counts_LE.astype(np.int64) for s in steps], axis=0)
