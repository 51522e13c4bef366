"""moe-monitor routed --server URL --redis URL --run NAME --num-experts E (--prompts FILE | --listen HOST:PORT):
the zero-plugin sampler. Reads the routed experts a vLLM or SGLang server started with
--enable-return-routed-experts returns per request and publishes them as sampled steps
(collectors/routed.py does the conversion).

--prompts FILE probes the server with each prompt every --every seconds (or --once); --listen H:P proxies
clients' completions to --server, answers them unchanged and publishes their routing. Exit codes: 0 done or
stopped, 1 (--once) the server or Redis failed, 2 bad settings. Docs: docs/vllm-parallel.md.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from moe_monitor import core

from .common import add_redis, add_run, fail, guarded

SAMPLED_PATHS = ("/v1/completions", "/v1/chat/completions")


def register(sub) -> None:
    parser = sub.add_parser(
        "routed", help="publish the routed experts a vLLM / SGLang server returns per request (no plugin)",
        description="Publish the routed experts that a vLLM or SGLang server started with "
                    "--enable-return-routed-experts returns with each response, as sampled steps.")
    parser.add_argument("--server", required=True, help="the engine's URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm", help="the server's engine")
    add_redis(parser, required=True)
    add_run(parser)
    parser.add_argument("--num-experts", type=int, required=True, metavar="E", help="the model's routed experts")
    parser.add_argument("--layers", default="all", metavar="SPEC",
                        help="the MoE layers among the response's layers (engines return every hidden layer; a "
                             "dense layer's rows read 0): 'all' (default) or indices and ranges, e.g. 3-60")
    parser.add_argument("--layers-total", type=int, metavar="L",
                        help="SGLang: the model's num_hidden_layers (its rows do not say)")
    parser.add_argument("--top-k", type=int, metavar="K", help="SGLang: the model's top-k (its rows do not say)")
    parser.add_argument("--gpus", type=int, help="GPUs of the layout (default: a divisor of E)")
    parser.add_argument("--model", default="", help="model name sent with probes (default: the server's first "
                        "from /v1/models) and kept in the run's metadata")
    parser.add_argument("--sample-tokens", type=int, default=16, choices=range(0, 257), metavar="N",
                        help="routing rows kept per record and layer (0: none; default 16)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prompts", metavar="FILE", help="probe prompts, one JSON string or id list per line")
    mode.add_argument("--listen", metavar="HOST:PORT", help="serve as a proxy in front of --server")
    parser.add_argument("--every", type=float, default=10.0, metavar="SECONDS", help="probe period (default 10)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per probe (default 16)")
    parser.add_argument("--once", action="store_true", help="probe once, publish, exit")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="HTTP timeout towards the server")
    parser.set_defaults(handler=lambda args: guarded(main, args))


def main(args: argparse.Namespace) -> int:
    from moe_monitor.collectors.routed import RoutedSampler

    if args.engine == "sglang" and (args.layers_total is None or args.top_k is None):
        return fail("--engine sglang needs --layers-total and --top-k (SGLang's rows are raw int32 bytes)")
    server = args.server.rstrip("/")
    core.check_run_name(args.run)
    sampler = RoutedSampler(args.redis, args.run, args.num_experts, engine=args.engine, layers=args.layers,
                            num_layers=args.layers_total, top_k=args.top_k, gpus=args.gpus,
                            model_name=args.model, sample_tokens=args.sample_tokens)
    try:
        if args.listen:
            return proxy(args, server, sampler)
        return probe(args, server, sampler)
    finally:
        sampler.flush()
        sampler.close()


# ---------------------------------------------------------------------------------------------- probe mode
def read_prompts(path: str) -> list[str | list[int]]:
    """The probe prompts of a file: one JSON string or list of token ids per non-empty line."""
    prompts: list[str | list[int]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                prompt = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{number}: not JSON (a string in quotes, or a list of token ids)") from None
            if not (isinstance(prompt, str) or isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
                raise ValueError(f"{path}:{number}: a prompt is a JSON string or a list of token ids")
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def post_json(url: str, body: dict, timeout_s: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (the user's server URL)
        return json.loads(response.read())


def served_model(server: str, timeout_s: float) -> str:
    with urllib.request.urlopen(f"{server}/v1/models", timeout=timeout_s) as response:  # noqa: S310
        models = json.loads(response.read()).get("data") or []
    if not models:
        raise ValueError(f"{server}/v1/models lists no model: pass --model")
    return str(models[0]["id"])


def probe_body(engine: str, model: str, prompt: str | list[int], max_tokens: int) -> dict:
    """A greedy /v1/completions request that returns routing: vLLM returns it for every request of a server
    started with the flag (return_token_ids tells prompt rows from generated ones); SGLang asks per request."""
    body: dict = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    if engine == "vllm":
        body["return_token_ids"] = True
    else:
        body["return_routed_experts"] = True
    return body


def probe(args: argparse.Namespace, server: str, sampler) -> int:
    prompts = read_prompts(args.prompts)
    stop = _stop_on_signals()
    model = args.model
    failed = False
    while True:
        failed = False
        try:
            model = model or served_model(server, args.timeout_s)
            for prompt in prompts:
                sampler.add(post_json(f"{server}/v1/completions", probe_body(args.engine, model, prompt,
                                                                               args.max_tokens), args.timeout_s))
        except (OSError, urllib.error.URLError, json.JSONDecodeError) as exc:
            failed = True
            _say(f"the server did not answer: {exc}")
        if not sampler.flush():
            failed = True
            _say(f"Redis: {sampler.last_error or 'records wait for the next round'}")
        if args.once or stop.wait(args.every):
            break
    _say(f"{sampler.requests} requests, {sampler.published} records published, {sampler.dropped} dropped")
    return 1 if failed and args.once else 0


# ---------------------------------------------------------------------------------------------- proxy mode
def proxy(args: argparse.Namespace, server: str, sampler) -> int:
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        return fail(f"--listen {args.listen!r} must be HOST:PORT")
    lock = threading.Lock()
    handler = _handler_class(server, args.engine, sampler, lock, args.timeout_s)
    httpd = ThreadingHTTPServer((host, int(port)), handler)
    httpd.daemon_threads = True
    stop = _stop_on_signals()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _say(f"proxy on http://{host}:{httpd.server_address[1]} -> {server}, publishing run {sampler.run}")
    try:
        while not stop.wait(1.0):
            with lock:
                sampler.flush()
    finally:
        httpd.shutdown()
        httpd.server_close()
    return 0


def _handler_class(server: str, engine: str, sampler, lock: threading.Lock, timeout_s: float):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            pass

        def do_GET(self):
            self._relay(None)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            body = None
            if self.path.split("?")[0] in SAMPLED_PATHS:
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = None
            if isinstance(body, dict) and not body.get("stream"):
                if engine == "sglang":
                    body["return_routed_experts"] = True
                    raw = json.dumps(body).encode()
            else:
                body = None
            self._relay(raw, sample=body is not None)

        def _relay(self, raw: bytes | None, sample: bool = False) -> None:
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
            request = urllib.request.Request(server + self.path, data=raw, method=self.command, headers=headers)
            try:
                response = urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310
            except urllib.error.HTTPError as exc:
                response = exc
            except OSError as exc:
                self.send_error(502, f"the server did not answer: {exc}")
                return
            with response:
                payload = response.read()
                self.send_response(response.status)
                for key, value in response.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            if sample and response.status == 200:
                try:
                    with lock:
                        sampler.add(json.loads(payload))
                except (ValueError, json.JSONDecodeError) as exc:
                    _say(f"a response's routing was not read: {exc}")
    return Handler


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def _say(line: str) -> None:
    print(f"routed: {line}", file=sys.stderr, flush=True)
