"""The vLLM plugin on a GPU host (run from the repo root, in an environment with vLLM's CUDA build and this
package installed: python -m scripts.gpu_check_vllm). Checks what the CPU build cannot show:

1. CUDA graphs on (vLLM's default): batches of 1-5 decoding sequences are padded to the captured sizes, and
   every published step still counts exactly its tokens x k per layer (padding never counted);
2. the counts over the run equal attach()'s counts when transformers reads the same tokens on the GPU;
3. the capture's overhead: generated tokens per second with and without the plugin, each engine in its own
   process, interleaved, median of 3 runs each, printed as a ratio.
Then what vLLM's CPU build cannot run (tests/engines/test_vllm_parallel.py, test_vllm_routed.py; docs/vllm-parallel.md):
4. (2+ GPUs) tensor_parallel_size=2: one publisher, every step tokens x k per layer (never x 2), counts ==
   transformers'. The CPU build runs this too (make test-engines).
5. (2+ GPUs) data_parallel_size=2 with enable_expert_parallel, one process per DP rank (vLLM's offline SPMD mode:
   VLLM_DP_RANK / VLLM_DP_SIZE / VLLM_DP_MASTER_*), CUDA graphs on: both ranks' steps arrive (ranks {0, 1} of 2),
   each step tokens x k, the sum over ranks == transformers' counts of both ranks' prompts. On the CPU build the
   first forward dies in the MoE all-gather: NotImplementedError from base_device_communicator.all_gatherv
   (device_communicators/all2all.py dispatch <- cpu_communicator.py dispatch <- naive_dp_ep.py prepare).
6. (4+ GPUs) tensor 2 x data 2 with expert parallel (sequence-parallel MoE under the default
   allgather_reducescatter backend): every TP rank publishes its shard (ranks 0..3 of 4), the sum == transformers'.
7. --enable-return-routed-experts (Model Runner V2) with the plugin on: vLLM's routed_experts of each request,
   put into vLLM's own CompletionResponse as its server does and read by collectors.routed.RoutedSampler, count
   the same tokens as transformers; the plugin, sharing the routers' capture slot, still counts exactly. The CPU
   build refuses the flag: "AuxOutput Connector requires Model Runner V2; set VLLM_USE_V2_MODEL_RUNNER=1.", and
   with that set "Model Runner V2 requires Triton.".
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


def child_generate(checkpoint: str, engine_args: str, prompts: str) -> None:
    """One engine with more vllm.LLM arguments (JSON) generating `prompts` (JSON [[ids]]) greedily; prints
    JSON {"outputs": [[ids]], "routed": [body or None]}: with enable_return_routed_experts each request's
    response as vLLM's server builds it (CompletionResponse, numpy2base64)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = json.loads(engine_args)
    llm = LLM(model=checkpoint, skip_tokenizer_init=True, dtype="float32", max_model_len=256, seed=0,
              gpu_memory_utilization=0.3, **extra)
    params = SamplingParams(max_tokens=8, temperature=0.0, detokenize=False, ignore_eos=True)
    result = llm.generate([TokensPrompt(prompt_token_ids=p) for p in json.loads(prompts)], params, use_tqdm=False)
    routed: list[dict | None] = []
    for request in result:
        out = request.outputs[0]
        if getattr(out, "routed_experts", None) is None:
            routed.append(None)
            continue
        from vllm.entrypoints.openai.completion.protocol import CompletionResponse, CompletionResponseChoice
        from vllm.entrypoints.serve.engine.protocol import UsageInfo
        from vllm.utils.serial_utils import numpy2base64
        choice = CompletionResponseChoice(index=0, text="", token_ids=list(out.token_ids),
                                          routed_experts=numpy2base64(out.routed_experts))
        usage = UsageInfo(prompt_tokens=len(request.prompt_token_ids), completion_tokens=len(out.token_ids),
                          total_tokens=len(request.prompt_token_ids) + len(out.token_ids))
        routed.append(CompletionResponse(model="check", choices=[choice], usage=usage).model_dump())
    print("@@" + json.dumps({"outputs": [list(r.outputs[0].token_ids) for r in result], "routed": routed}),
          flush=True)


def start_generate(checkpoint: str, env: dict[str, str], engine_args: dict, prompts: list) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MOE_MONITOR_")}
    full.update(env)
    return subprocess.Popen([sys.executable, "-m", "scripts.gpu_check_vllm", "--child-generate", checkpoint,
                             json.dumps(engine_args), json.dumps(prompts)], env=full, stdout=subprocess.PIPE,
                            text=True)


def finish_generate(proc: subprocess.Popen, timeout_s: float = 900) -> dict:
    out, _ = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the engine exited with {proc.returncode}")
    return json.loads(next(line[2:] for line in out.splitlines() if line.startswith("@@")))


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
        monitor.close()
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
        if not same:
            return 1
        return 0 if parallel_checks(checkpoint, redis, model, device) else 1
    finally:
        redis.stop()


def counts_of_tokens(model, device: str, prompts: list, outputs: list):
    """transformers' counts [L, E] when the model reads each prompt and the tokens generated from it but the last."""
    import torch

    from moe_monitor.collectors import attach
    monitor = attach(model, nvml=False, sample_tokens=0)
    with torch.no_grad():
        for prompt, generated in zip(prompts, outputs):
            model(torch.tensor([prompt + generated[:-1]], device=device))
            monitor.end_step()
    counts = monitor.counts()
    monitor.close()
    return counts


def check_run(name: str, steps: list, truth, ranks: set[int], world: int) -> bool:
    """Print and return whether a run's steps are tokens x k each and sum to truth over the expected ranks."""
    import numpy as np
    bad = [s.step for s in steps if (s.counts_LE.sum(axis=1) != s.tokens * TOP_K).any()]
    counted = np.sum([s.counts_LE.astype(np.int64) for s in steps], axis=0) if steps else None
    seen = {s.rank for s in steps}
    ok = (not bad and counted is not None and counted.shape == truth.shape and bool((counted == truth).all())
          and seen == ranks and {s.world_size for s in steps} == {world})
    print(("ok  " if ok else "FAIL") + f" {name}: {len(steps)} steps from ranks {sorted(seen)} (want "
          f"{sorted(ranks)} of {world}); steps not tokens x k: {bad[:5]}; counts == transformers: "
          f"{counted is not None and counted.shape == truth.shape and bool((counted == truth).all())}")
    return ok


def parallel_checks(checkpoint: str, redis, model, device: str) -> bool:
    """Checks 4-7 (module docstring); a check needing more GPUs than there are says so and is not counted."""
    import socket

    import torch

    from moe_monitor import core
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    client = redis.client()

    def steps(run: str) -> list:
        time.sleep(3)   # the publishers' last flush
        return [core.decode_step(f) for _, f in client.xrange(core.steps_key(run))]

    def plugin(run: str) -> dict[str, str]:
        return {"MOE_MONITOR_REDIS_URL": redis.url, "MOE_MONITOR_RUN": run, "MOE_MONITOR_NVML": "0"}

    def port() -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return str(probe.getsockname()[1])

    ok = True
    halves = [PROMPTS[:3], PROMPTS[3:]]
    if gpus >= 2:
        out = finish_generate(start_generate(checkpoint, plugin("check-tp2"), {"tensor_parallel_size": 2}, PROMPTS))
        ok &= check_run("4. TP=2", steps("check-tp2"), counts_of_tokens(model, device, PROMPTS, out["outputs"]),
                        {0}, 1)
        for name, tp, world, need in (("5. DP=2 + EP", 1, 2, 2), ("6. TP=2 x DP=2 + EP (SP MoE)", 2, 4, 4)):
            if gpus < need:
                print(f"skip {name}: needs {need} GPUs, {gpus} here")
                continue
            run, master = f"check-dp{world}", port()
            procs = [start_generate(checkpoint, {**plugin(run), "VLLM_DP_RANK": str(r), "VLLM_DP_RANK_LOCAL": str(r),
                                                 "VLLM_DP_SIZE": "2", "VLLM_DP_MASTER_IP": "127.0.0.1",
                                                 "VLLM_DP_MASTER_PORT": master},
                                    {"tensor_parallel_size": tp, "enable_expert_parallel": True}, halves[r])
                     for r in range(2)]
            outs = [finish_generate(proc)["outputs"] for proc in procs]
            truth = counts_of_tokens(model, device, halves[0] + halves[1], outs[0] + outs[1])
            ok &= check_run(name, steps(run), truth, set(range(world)), world)
    else:
        print(f"skip 4-6. tensor / data parallel: need 2+ GPUs, {gpus} here")
    if device != "cuda":
        print("skip 7. --enable-return-routed-experts: vLLM's CPU build refuses it (Model Runner V2 needs Triton)")
        return ok
    from moe_monitor.collectors.routed import RoutedSampler
    out = finish_generate(start_generate(checkpoint, plugin("check-routed-plugin"),
                                         {"enable_return_routed_experts": True, "enable_prefix_caching": True},
                                         PROMPTS))
    truth = counts_of_tokens(model, device, PROMPTS, out["outputs"])
    sampler = RoutedSampler(redis.url, "check-routed", int(truth.shape[1]), sample_tokens=0)
    for body in out["routed"]:
        if body is not None:
            sampler.add(body)
    flushed = sampler.flush()
    sampler.close()
    print(("ok  " if all(b is not None for b in out["routed"]) and flushed else "FAIL")
          + f" 7. routed_experts returned for {sum(b is not None for b in out['routed'])} of {len(PROMPTS)} requests")
    ok &= check_run("7. the sampler's counts", steps("check-routed"), truth, {0}, 1)
    ok &= check_run("7. the plugin beside vLLM's capturer", steps("check-routed-plugin"), truth, {0}, 1)
    return ok


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child-generate":
        child_generate(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], batches=int(sys.argv[3]))
    else:
        sys.exit(main())
