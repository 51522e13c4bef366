"""The zero-plugin path against the real vLLM package (`make test-engines`).

vLLM's CPU build cannot serve --enable-return-routed-experts: its config refuses it without Model Runner V2
("AuxOutput Connector requires Model Runner V2; set VLLM_USE_V2_MODEL_RUNNER=1."), and with
VLLM_USE_V2_MODEL_RUNNER=1 refuses V2 ("Model Runner V2 requires Triton."). Both refusals are asserted here (the
day the CPU build serves it, these fail: then run the sampler against it). What can be run is: the response
vLLM's own server code builds (its CompletionResponse and CompletionResponseChoice, its numpy2base64 encoder,
serialised the way the server sends it) read by the sampler and published through the tests' Redis.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.collectors.routed import RoutedSampler
from moe_monitor.demo.checkpoints import write_checkpoint
from tests.engines.engine import Engine

ROUTED_ARGS = {"enable_return_routed_experts": True, "enable_prefix_caching": True}


@pytest.mark.parametrize("v2,refusal", [
    ("", "AuxOutput Connector requires Model Runner V2; set VLLM_USE_V2_MODEL_RUNNER=1."),
    ("1", "Model Runner V2 requires Triton."),
])
def test_cpu_build_refuses_return_routed_experts(v2, refusal, tmp_path):
    checkpoint = write_checkpoint("qwen3_moe", tmp_path / "qwen3_moe")
    env = {"VLLM_USE_V2_MODEL_RUNNER": v2} if v2 else {}
    with pytest.raises(AssertionError, match="vLLM stopped") as stopped:
        Engine(checkpoint, "eager", env, tmp_path / "engine.log", timeout_s=300, engine_args=ROUTED_ARGS)
    assert refusal in str(stopped.value) or refusal in (tmp_path / "engine.log").read_text(errors="replace")


def test_vllm_built_response_is_published(redis_url):
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo
    from vllm.utils.serial_utils import numpy2base64

    prompt, generated, num_layers, top_k, num_experts = 6, 3, 3, 2, 8
    rng = np.random.default_rng(0)
    ids_TLK = np.stack([np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_layers)])
                        for _ in range(prompt + generated - 1)]).astype(np.uint8)   # the capturer's dtype, E <= 256
    choice = CompletionResponseChoice(index=0, text="abc", finish_reason="length", token_ids=[1, 2, 3],
                                      routed_experts=numpy2base64(ids_TLK))
    response = CompletionResponse(model="tiny", choices=[choice],
                                  usage=UsageInfo(prompt_tokens=prompt, completion_tokens=generated,
                                                  total_tokens=prompt + generated))
    body = json.loads(json.dumps(response.model_dump()))   # the server's JSONResponse(content=model_dump())
    sampler = RoutedSampler(redis_url, "routed-vllm-schema", num_experts)
    try:
        assert sampler.add(body) == 2
        assert sampler.flush()
    finally:
        sampler.close()
    client = core.connect(redis_url)
    steps = [core.decode_step(f) for _, f in client.xrange(core.steps_key("routed-vllm-schema"))]
    assert [(s.phase, s.tokens) for s in steps] == [("prefill", prompt), ("decode", generated - 1)]
    for step, rows in zip(steps, (ids_TLK[:prompt], ids_TLK[prompt:])):
        expected = np.stack([np.bincount(rows[:, layer].ravel(), minlength=num_experts)
                             for layer in range(num_layers)])
        np.testing.assert_array_equal(step.counts_LE, expected)


def test_plugin_and_vllms_capturer_share_the_router():
    """vLLM binds its routed-experts capturer (set_capture_fn) after the plugin's load_model binding: both must
    see every topk_ids, whichever is set first (collectors/vllm/patch.py), on vLLM's own router class."""
    import torch
    from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter

    from moe_monitor.collectors.vllm.patch import attach

    router = FusedTopKRouter(top_k=2, global_num_experts=8)
    seen: dict[str, list] = {"plugin": [], "vllm": []}
    attach(router, lambda ids: seen["plugin"].append(ids))
    router.set_capture_fn(lambda ids: seen["vllm"].append(ids))   # what bind_routed_experts_capturer does
    ids = torch.tensor([[1, 2], [3, 4]])
    router.capture_fn(ids)
    assert len(seen["plugin"]) == 1 and len(seen["vllm"]) == 1
    router.set_capture_fn(None)                                  # vLLM unbinding its own: the plugin stays
    router.capture_fn(ids)
    assert len(seen["plugin"]) == 2 and len(seen["vllm"]) == 1
