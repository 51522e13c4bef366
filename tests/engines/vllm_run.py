"""A vLLM engine driven over stdin/stdout, one process per configuration (env decides the plugin's settings).

    python -m tests.engines.vllm_run CHECKPOINT eager|compiled [ENGINE_ARGS_JSON]
ENGINE_ARGS_JSON: more keyword arguments for vllm.LLM (tensor_parallel_size, enable_expert_parallel, ...); a
data-parallel rank of the offline SPMD mode takes its place from VLLM_DP_RANK / VLLM_DP_SIZE / VLLM_DP_MASTER_*
in the environment (vLLM's own offline data-parallel example does the same).
stdin: one JSON command per line: {"prompts": [[ids]...], "max_tokens": n} generates greedily and answers
"@@" + JSON list of generated ids per prompt; {"exit": true} ends. "@@ready" once the engine is up.
"""
from __future__ import annotations

import json
import sys


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    checkpoint, mode = sys.argv[1], sys.argv[2]
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    llm = LLM(model=checkpoint, skip_tokenizer_init=True, dtype="float32", max_model_len=128, max_num_seqs=8,
              max_num_batched_tokens=256, gpu_memory_utilization=0.2, enforce_eager=(mode == "eager"), seed=0,
              **extra)
    print("@@ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("exit"):
            break
        params = SamplingParams(max_tokens=command["max_tokens"], temperature=0.0, detokenize=False)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in command["prompts"]], params,
                               use_tqdm=False)
        print("@@" + json.dumps([list(o.outputs[0].token_ids) for o in outputs]), flush=True)


if __name__ == "__main__":
    main()
