"""The vLLM plugin on a GPU host (run from the repo root, in an environment with vLLM's CUDA build and this
package installed: python -m scripts.gpu_check_vllm). Checks what the CPU build cannot show:

1. CUDA graphs on (vLLM's default): batches of 1-5 decoding sequences are padded to the captured sizes, and
   every published step still counts exactly its tokens x k per layer (padding never counted);
2. the counts over the run equal attach()'s counts when transformers reads the same tokens on the GPU;
3. the capture's overhead: generated tokens per second with and without the plugin, each engine in its own
   process, interleaved, median of 3 runs each, printed as a ratio.
Prints one line per check and exits non-zero on the first failure. Without CUDA (vLLM's CPU build) it runs
the same checks on the CPU, where there are no CUDA graphs: useful for the overhead figure only.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [100, 200, 300], [42], [5, 6, 7, 8, 9, 10, 11]]
TOP_K = 2


def child(checkpoint: str, batches: int) -> None:
    """One engine (the plugin on when MOE_MONITOR_REDIS_URL is set): the check batches, then `batches`
    throughput batches; prints JSON of the check outputs and the throughput's tokens/s."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    cpu = {} if torch.cuda.is_available() else {"gpu_memory_utilization": 0.2}   # with VLLM_CPU_KVCACHE_SPACE
    llm = LLM(model=checkpoint, skip_tokenizer_init=True, dtype="float32", max_model_len=256, seed=0,
              **({"gpu_memory_utilization": 0.3} | cpu))
    params = SamplingParams(max_tokens=16, temperature=0.0, detokenize=False, ignore_eos=True)
    outputs = []
    for size in range(1, len(PROMPTS) + 1):        # 1..5 sequences: decode batches padded to graph sizes
        result = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS[:size]], params, use_tqdm=False)
        outputs.append([list(o.outputs[0].token_ids) for o in result])
    prompts = [TokensPrompt(prompt_token_ids=[(i * 7 + j) % 500 + 1 for j in range(32)]) for i in range(64)]
    start = time.perf_counter()
    generated = 0
    for _ in range(batches):
        result = llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0.0, detokenize=False,
                                                      ignore_eos=True), use_tqdm=False)
        generated += sum(len(o.outputs[0].token_ids) for o in result)
    print("@@" + json.dumps({"outputs": outputs, "tokens_per_s": generated / (time.perf_counter() - start)}),
          flush=True)


def run_child(checkpoint: str, env: dict[str, str], batches: int = 3) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MOE_MONITOR_")}
    full.update(env)
    full.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    out = subprocess.run([sys.executable, "-m", "scripts.gpu_check_vllm", "--child", checkpoint, str(batches)],
                         env=full,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(next(line[2:] for line in out.splitlines() if line.startswith("@@")))


def main() -> int:
    import numpy as np
    import torch

    from moe_monitor import core
    from moe_monitor.collectors import attach
    from moe_monitor.demo.checkpoints import write_checkpoint
    from moe_monitor.demo.localredis import RedisServer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("note no CUDA device: vLLM's CPU build, no CUDA graphs (check 1 shows no padding to count)")
    work = Path(tempfile.mkdtemp(prefix="moe-vllm-check-"))
    checkpoint = str(write_checkpoint("qwen3_moe", work / "qwen3_moe"))
    redis = RedisServer(work)
    try:
        first = run_child(checkpoint, {"MOE_MONITOR_REDIS_URL": redis.url, "MOE_MONITOR_RUN": "gpu-check"}, 0)
        time.sleep(2)   # the publisher's last flush
        steps = [core.decode_step(f) for _, f in redis.client().xrange(core.steps_key("gpu-check"))]
        bad = [s.step for s in steps if (s.counts_LE.sum(axis=1) != s.tokens * TOP_K).any()]
        print(("FAIL" if bad else "ok  ") + f" 1. {len(steps)} steps ({'CUDA graphs' if device == 'cuda' else 'CPU, compiled'}), "
              f"steps with padding counted: {bad[:5]}")
        if bad:
            return 1
        model = __import__("transformers").AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        monitor = attach(model.to(device).eval(), nvml=False, sample_tokens=0)
        with torch.no_grad():
            for size, outs in enumerate(first["outputs"], start=1):
                for prompt, generated in zip(PROMPTS[:size], outs):
                    model(torch.tensor([prompt + generated[:-1]], device=device))
        counted = np.sum([s.counts_LE.astype(np.int64) for s in steps], axis=0)
        hf = monitor.counts()
        same = counted.shape == hf.shape and bool((counted == hf).all())
        print(("ok  " if same else "FAIL") + f" 2. plugin counts == transformers counts on {device} "
              f"({int(hf.sum())} expert slots; max difference {int(np.abs(counted - hf).max())})")
        rates: dict[str, list[float]] = {"on": [], "off": []}
        on = {"MOE_MONITOR_REDIS_URL": redis.url, "MOE_MONITOR_RUN": "gpu-check-rate"}
        for _ in range(3):   # interleaved
            for name, env in (("off", {}), ("on", on)):
                rates[name].append(run_child(checkpoint, env)["tokens_per_s"])
        ratio = statistics.median(rates["on"]) / statistics.median(rates["off"])
        print(f"ok   3. tokens/s with the plugin / without: {ratio:.3f} (medians of {rates})")
        return 0 if same else 1
    finally:
        redis.stop()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], batches=int(sys.argv[3]))
    else:
        sys.exit(main())
