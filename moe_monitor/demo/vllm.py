"""`python -m moe_monitor.demo.vllm --redis URL` (in .venv-engines): a real vLLM engine on the CPU serving a tiny Qwen3-MoE
(random weights, written on first use) with this package's plugin publishing to Redis, fed prompts of
drifting token ranges until stopped. `make demo-vllm` starts it beside a private Redis and the dashboard."""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_monitor.demo.vllm", description=__doc__)
    parser.add_argument("--redis", required=True, help="Redis URL the plugin publishes to")
    parser.add_argument("--run", default="demo-vllm", help="run name")
    parser.add_argument("--checkpoint", type=Path, default=Path(tempfile.gettempdir()) / "moe-demo-qwen3-moe")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until Ctrl-C)")
    parser.add_argument("--eager", action="store_true", help="no torch.compile (starts in half the time)")
    args = parser.parse_args(argv)
    os.environ.update(MOE_MONITOR_REDIS_URL=args.redis, MOE_MONITOR_RUN=args.run)   # the plugin's settings
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from moe_monitor.demo.checkpoints import write_checkpoint
    if not (args.checkpoint / "config.json").exists():
        write_checkpoint("qwen3_moe", args.checkpoint)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(args.checkpoint), skip_tokenizer_init=True, dtype="float32", max_model_len=256,
              max_num_seqs=32, max_num_batched_tokens=512, gpu_memory_utilization=0.2, enforce_eager=args.eager)
    print(f"demo.vllm: serving {args.checkpoint} with the plugin publishing run {args.run!r}", flush=True)
    rng = random.Random(0)
    start = time.monotonic()
    try:
        while args.seconds <= 0 or time.monotonic() - start < args.seconds:
            centre = int(250 + 200 * ((time.monotonic() - start) / 60 % 1))   # the prompts' vocabulary drifts
            prompts = [TokensPrompt(prompt_token_ids=[max(1, min(511, int(rng.gauss(centre, 30))))
                                                      for _ in range(rng.randint(4, 48))]) for _ in range(16)]
            llm.generate(prompts, SamplingParams(max_tokens=rng.randint(8, 32), temperature=0.8,
                                                 detokenize=False), use_tqdm=False)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
