"""The routed-experts sampler (collectors/routed.py, `moe-monitor routed`) against tiny real HTTP servers that
answer as vLLM 0.32 and SGLang do with --enable-return-routed-experts, publishing to the tests' private Redis.

The servers build their bodies field by field as the engines' schemas do (vLLM: CompletionResponse, the choice's
routed_experts = base64 of np.save bytes [prompt + generated - 1, L, K] uint8, every hidden layer, a dense layer's
rows 0; SGLang: the response's sglext.routed_experts = base64 of raw int32 bytes), and remember every array they
sent: the truth the published counts are compared with.
"""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.cli import main as cli_main
from moe_monitor.collectors.routed import RoutedSampler, decode_vllm, parse_layers, routed_requests

REPO = Path(__file__).resolve().parents[2]
NUM_LAYERS, DENSE_LAYERS, NUM_EXPERTS, TOP_K = 4, 1, 8, 2   # layer 0 is dense, as DeepSeek's first layers
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], "hello there"]
MAX_TOKENS = 4


def routing_TLK(tokens: list[int]) -> np.ndarray:
    """int [T, L, K] the fake engine 'routes': two distinct experts per token and MoE layer, zeros for the dense
    layer (as vLLM's and SGLang's buffers hold for a layer without a router)."""
    ids = np.zeros((len(tokens), NUM_LAYERS, TOP_K), dtype=np.int64)
    for t, token in enumerate(tokens):
        for layer in range(DENSE_LAYERS, NUM_LAYERS):
            first = (token * 5 + layer * 3) % NUM_EXPERTS
            ids[t, layer] = [first, (first + 1 + token % 3) % NUM_EXPERTS]
    return ids


class FakeEngine:
    """A real HTTP server on 127.0.0.1 answering /v1/models and /v1/completions like `engine`; sent: every
    (request body, routed ids [T, L, K], prompt tokens) it answered."""

    def __init__(self, engine: str):
        self.engine, self.sent = engine, []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, body: dict) -> dict:
        prompt = body["prompt"]
        prompt_ids = prompt if isinstance(prompt, list) else [ord(c) % 50 for c in prompt]
        generated = [(sum(prompt_ids) + i * 13) % 50 for i in range(body["max_tokens"])]
        ids = routing_TLK(prompt_ids + generated[:-1])      # the last generated token is never fed back
        self.sent.append((body, ids, len(prompt_ids)))
        usage = {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + len(generated),
                 "completion_tokens": len(generated), "prompt_tokens_details": None}
        if self.engine == "vllm":
            buffer = io.BytesIO()
            np.save(buffer, ids.astype(np.uint8), allow_pickle=False)   # vLLM's numpy2base64, E <= 256: uint8
            wants_ids = bool(body.get("return_token_ids"))
            choice = {"index": 0, "text": "x" * len(generated), "logprobs": None, "finish_reason": "length",
                      "stop_reason": None, "token_ids": generated if wants_ids else None, "prompt_logprobs": None,
                      "prompt_token_ids": prompt_ids if wants_ids else None,
                      "routed_experts": base64.b64encode(buffer.getvalue()).decode("ascii")}
            return {"id": "cmpl-1", "object": "text_completion", "created": int(time.time()), "model": body["model"],
                    "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": usage,
                    "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        routed = None
        if body.get("return_routed_experts"):
            routed = base64.b64encode(ids.astype("<i4").tobytes()).decode("utf-8")
        return {"id": "cmpl-2", "object": "text_completion", "created": int(time.time()), "model": body["model"],
                "choices": [{"index": 0, "text": "y", "logprobs": None, "finish_reason": "length",
                             "matched_stop": None}],
                "usage": usage, "metadata": {"weight_version": "default"},
                "sglext": {"routed_experts": routed, "cached_tokens_details": None}}

    def _handler(self):
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):  # noqa: A002
                pass

            def _send(self, status: int, body: dict) -> None:
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "tiny-moe", "object": "model"}]})
                else:
                    self._send(404, {"error": "no such path"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(200, engine.answer(body))
        return Handler


@pytest.fixture
def vllm_server():
    server = FakeEngine("vllm")
    yield server
    server.close()


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    return path


def steps_of(client, run: str) -> list[core.StepRecord]:
    return [core.decode_step(fields) for _, fields in client.xrange(core.steps_key(run))]


def expected_records(sent) -> list[tuple[str, int, np.ndarray]]:
    """(phase, tokens, counts [M, E]) of every record the sent arrays make: prompt rows, then generated rows."""
    out = []
    for _, ids, prompt_len in sent:
        for phase, rows in (("prefill", ids[:prompt_len]), ("decode", ids[prompt_len:])):
            moe = rows[:, DENSE_LAYERS:, :]
            counts = np.stack([np.bincount(moe[:, m].ravel(), minlength=NUM_EXPERTS) for m in range(moe.shape[1])])
            out.append((phase, rows.shape[0], counts))
    return out


def test_probe_publishes_each_request_as_prefill_and_decode_steps(vllm_server, prompts_file, redis_url):
    code = cli_main(["routed", "--server", vllm_server.url, "--redis", redis_url, "--run", "routed-probe",
                     "--num-experts", str(NUM_EXPERTS), "--layers", f"{DENSE_LAYERS}-{NUM_LAYERS - 1}",
                     "--prompts", str(prompts_file), "--max-tokens", str(MAX_TOKENS), "--once"])
    assert code == 0
    client = core.connect(redis_url)
    steps = steps_of(client, "routed-probe")
    meta = core.decode_meta(client.get(core.meta_key("routed-probe")))
    assert [body["model"] for body, _, _ in vllm_server.sent] == ["tiny-moe"] * len(PROMPTS)   # from /v1/models
    assert all(body["return_token_ids"] for body, _, _ in vllm_server.sent)
    expected = expected_records(vllm_server.sent)
    assert len(steps) == len(expected) == 2 * len(PROMPTS)
    for step, (phase, tokens, counts) in zip(steps, expected):
        assert (step.phase, step.tokens) == (phase, tokens)
        np.testing.assert_array_equal(step.counts_LE, counts)
        assert (step.counts_LE.sum(axis=1) == tokens * TOP_K).all()
    assert [s.step for s in steps] == list(range(len(steps)))
    assert meta.top_k == TOP_K and meta.num_experts == NUM_EXPERTS
    assert meta.layer_names == [f"model.layers.{i}" for i in range(DENSE_LAYERS, NUM_LAYERS)]
    assert meta.extra["source"] == "routed_experts"
    first = steps[0]   # the sampled rows are the routed rows themselves (5 prompt tokens, all kept)
    np.testing.assert_array_equal(first.sample_ids_LNK, vllm_server.sent[0][1][:5, DENSE_LAYERS:].transpose(1, 0, 2))


def test_proxy_answers_unchanged_and_publishes(vllm_server, redis_url, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "moe_monitor", "routed", "--server", vllm_server.url,
                             "--redis", redis_url, "--run", "routed-proxy", "--num-experts", str(NUM_EXPERTS),
                             "--layers", "1-3", "--listen", f"127.0.0.1:{port}"], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        body = {"model": "tiny-moe", "prompt": [3, 4, 5, 6], "max_tokens": MAX_TOKENS}
        answer = post_when_up(f"http://127.0.0.1:{port}/v1/completions", body)
        (sent_body, ids, prompt_len), = vllm_server.sent
        assert sent_body == body                                # vLLM's requests go through untouched
        assert answer["choices"][0]["routed_experts"] is not None and answer["model"] == "tiny-moe"
        np.testing.assert_array_equal(decode_vllm(answer["choices"][0]["routed_experts"]), ids)
        client = core.connect(redis_url)
        steps = wait_for(lambda: steps_of(client, "routed-proxy"), 2)
        # no token_ids asked: the prompt's rows come from usage (one choice)
        assert [(s.phase, s.tokens) for s in steps] == [("prefill", 4), ("decode", MAX_TOKENS - 1)]
        assert sum(int(s.counts_LE.sum()) for s in steps) == ids.shape[0] * 3 * TOP_K
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr


def test_sglang_probe_asks_for_routing_and_reads_raw_int32(prompts_file, redis_url):
    server = FakeEngine("sglang")
    try:
        code = cli_main(["routed", "--server", server.url, "--engine", "sglang", "--redis", redis_url,
                         "--run", "routed-sglang", "--num-experts", str(NUM_EXPERTS), "--layers-total",
                         str(NUM_LAYERS), "--top-k", str(TOP_K), "--layers", "1-3", "--prompts",
                         str(prompts_file), "--max-tokens", str(MAX_TOKENS), "--once"])
    finally:
        server.close()
    assert code == 0
    assert all(body["return_routed_experts"] is True for body, _, _ in server.sent)
    steps = steps_of(core.connect(redis_url), "routed-sglang")
    expected = expected_records(server.sent)
    assert [(s.phase, s.tokens) for s in steps] == [(p, t) for p, t, _ in expected]
    for step, (_, _, counts) in zip(steps, expected):
        np.testing.assert_array_equal(step.counts_LE, counts)


def test_sglang_needs_its_shape(prompts_file, redis_url, capsys):
    code = cli_main(["routed", "--server", "http://127.0.0.1:9", "--engine", "sglang", "--redis", redis_url,
                     "--run", "x", "--num-experts", "8", "--prompts", str(prompts_file), "--once"])
    assert code == 2 and "--layers-total and --top-k" in capsys.readouterr().err


def test_records_wait_while_redis_is_down_and_land_after(tmp_path):
    from tests.support.redisfaults import FaultyRedis

    server = FaultyRedis(tmp_path)
    engine = FakeEngine("vllm")
    sampler = RoutedSampler(server.url, "routed-outage", NUM_EXPERTS, layers="1-3", redis_timeout_s=0.5)
    try:
        body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "return_token_ids": True}
        server.kill()
        assert sampler.add(engine.answer(body)) == 2
        assert not sampler.flush() and sampler.last_error and len(sampler.queue) == 2
        server.start()
        assert sampler.flush() and sampler.published == 2
        steps = steps_of(server.client(), "routed-outage")
    finally:
        sampler.close()
        engine.close()
        server.stop()
    assert [(s.phase, s.tokens) for s in steps] == [("prefill", 3), ("decode", 2)]


def test_bad_fields_are_refused_in_words():
    with pytest.raises(ValueError, match="not valid base64"):
        routed_requests({"choices": [{"routed_experts": "%%%"}]}, "vllm")
    buffer = io.BytesIO()
    np.save(buffer, np.full((2, 1, 2), 7, dtype=np.uint8))
    bad = io.BytesIO()
    np.save(bad, np.full((2, 1, 2), 9, dtype=np.uint8))
    sampler = RoutedSampler("redis://127.0.0.1:1/0", "bad-ids", 8)
    with pytest.raises(ValueError, match="outside 0..7: is --num-experts right"):
        sampler.add({"choices": [{"routed_experts": base64.b64encode(bad.getvalue()).decode()}]})
    other = io.BytesIO()
    np.save(other, np.zeros((2, 3, 2), dtype=np.uint8))
    sampler = RoutedSampler("redis://127.0.0.1:1/0", "two-shapes", 8)
    sampler.add({"choices": [{"routed_experts": base64.b64encode(buffer.getvalue()).decode()}]})
    with pytest.raises(ValueError, match=r"do not match the first response's \[tokens, 1, 2\]"):
        sampler.add({"choices": [{"routed_experts": base64.b64encode(other.getvalue()).decode()}]})
    with pytest.raises(ValueError, match="outside the response's layers 0..3"):
        parse_layers("2-4", 4)
    assert parse_layers("0,2-3", 4) == [0, 2, 3] and parse_layers("all", 2) == [0, 1]
    assert routed_requests({"choices": [{"routed_experts": None}]}, "vllm") == []   # flag off server-side


def post_when_up(url: str, body: dict, timeout_s: float = 30.0) -> dict:
    """POST body once the proxy accepts connections (it starts in its own process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except ConnectionRefusedError:
            pass
        except urllib.error.URLError as exc:
            if not isinstance(exc.reason, ConnectionRefusedError):
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"the proxy at {url} never answered")
        time.sleep(0.1)


def wait_for(read, count: int, timeout_s: float = 20.0):
    """read() once it returns at least count items (or what it returns at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        items = read()
        if len(items) >= count or time.monotonic() > deadline:
            return items
        time.sleep(0.1)
