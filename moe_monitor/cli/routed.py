"""moe-monitor routed --server URL --redis URL --run NAME --num-experts E (--prompts FILE | --listen HOST:PORT):
the zero-plugin sampler. Reads the routed experts a vLLM or SGLang server started with
--enable-return-routed-experts returns per request and publishes them as sampled steps
(collectors/routed.py does the conversion; cli/routed_proxy.py the HTTP side and its bounds).

--prompts FILE probes the server with each prompt every --every seconds (or --once); a bad answer is said and
the next prompt goes on. --listen H:P proxies clients' requests to --server, answers them unchanged and
publishes their routing. Exit codes: 0 done or stopped, 1 (--once) a prompt, the server or Redis failed, 2 bad
settings. Docs: docs/vllm-parallel.md, bounds: docs/collectors.md.
"""
from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading

from moe_monitor import core

from .common import add_redis, add_run, fail, guarded
from .routed_proxy import ByteBudget, ProxyServer, ProxySettings, Upstream, fetch_json, parse_server

MAX_ANSWER_BYTES = 64 << 20   # default cap of a request body and of a sampled response (--max-body-bytes)


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
    parser.add_argument("--max-body-bytes", type=int, default=MAX_ANSWER_BYTES, metavar="BYTES",
                        help="the largest request body the proxy takes (413 beyond) and the largest response "
                             "it samples (larger ones are relayed, not sampled); default 64 MiB")
    parser.add_argument("--buffer-budget-bytes", type=int, default=256 << 20, metavar="BYTES",
                        help="proxy: bytes all clients' buffered bodies may hold together (default 256 MiB)")
    parser.add_argument("--max-clients", type=int, default=64, metavar="N",
                        help="proxy: connections served at once; one more is answered 503 (default 64)")
    parser.add_argument("--client-timeout-s", type=float, default=30.0, metavar="SECONDS",
                        help="proxy: a client connection idle this long is closed (default 30)")
    parser.set_defaults(handler=lambda args: guarded(main, args))


def main(args: argparse.Namespace) -> int:
    from moe_monitor.collectors.routed import RoutedSampler

    if args.engine == "sglang" and (args.layers_total is None or args.top_k is None):
        return fail("--engine sglang needs --layers-total and --top-k (SGLang's rows are raw int32 bytes)")
    for name in ("max_body_bytes", "buffer_budget_bytes", "max_clients"):
        if getattr(args, name) < 1:
            return fail(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.client_timeout_s < 86400 or not 0 < args.timeout_s < 86400:
        return fail("--timeout-s and --client-timeout-s are seconds, more than 0")
    upstream = parse_server(args.server)
    core.check_run_name(args.run)
    sampler = RoutedSampler(args.redis, args.run, args.num_experts, engine=args.engine, layers=args.layers,
                            num_layers=args.layers_total, top_k=args.top_k, gpus=args.gpus,
                            model_name=args.model, sample_tokens=args.sample_tokens)
    try:
        if args.listen:
            return proxy(args, upstream, sampler)
        return probe(args, upstream, sampler)
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


def served_model(upstream: Upstream, timeout_s: float, max_bytes: int) -> str:
    answer = fetch_json(upstream, "GET", "/v1/models", None, timeout_s, max_bytes)
    models = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise ValueError(f"{upstream.base}/v1/models lists no model: pass --model")
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


ANSWER_ERRORS = (OSError, http.client.HTTPException, ValueError, TypeError, KeyError, MemoryError, RecursionError)


def probe(args: argparse.Namespace, upstream: Upstream, sampler) -> int:
    """Probe rounds until stopped (or one with --once). A prompt whose answer fails or is unreadable is said and
    counted; the round goes on with the next prompt."""
    prompts = read_prompts(args.prompts)
    stop = _stop_on_signals()
    model = args.model
    failed = bad_answers = 0
    while True:
        failed = 0
        try:
            model = model or served_model(upstream, args.timeout_s, args.max_body_bytes)
        except ANSWER_ERRORS as exc:
            failed += 1
            _say(f"the server did not name its model: {type(exc).__name__}: {str(exc)[:200]}")
        for number, prompt in enumerate(prompts if model else [], start=1):
            try:
                sampler.add(fetch_json(upstream, "POST", "/v1/completions",
                                       probe_body(args.engine, model, prompt, args.max_tokens), args.timeout_s,
                                       args.max_body_bytes))
            except ANSWER_ERRORS as exc:
                failed += 1
                _say(f"prompt {number}: {type(exc).__name__}: {str(exc)[:200]}")
        bad_answers += failed
        if not sampler.flush():
            failed += 1
            _say(f"Redis: {sampler.last_error or 'records wait for the next round'}")
        if args.once or stop.wait(args.every):
            break
    _say(f"{sampler.requests} requests, {bad_answers} bad answers, {sampler.published} records published, "
         f"{sampler.dropped} dropped")
    return 1 if failed and args.once else 0


# ---------------------------------------------------------------------------------------------- proxy mode
def proxy(args: argparse.Namespace, upstream: Upstream, sampler) -> int:
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        return fail(f"--listen {args.listen!r} must be HOST:PORT")
    settings = ProxySettings(upstream, sampler.add, _say, sglang=args.engine == "sglang", timeout_s=args.timeout_s,
                             client_timeout_s=args.client_timeout_s, max_body_bytes=args.max_body_bytes,
                             budget=ByteBudget(args.buffer_budget_bytes))
    httpd = ProxyServer((host.strip("[]"), int(port)), settings, args.max_clients)
    stop = _stop_on_signals()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _say(f"proxy on http://{host}:{httpd.server_address[1]} -> {upstream.base}, publishing run {sampler.run}")
    try:
        while not stop.wait(1.0):
            sampler.flush()
    finally:
        httpd.shutdown()
        httpd.server_close()
    c = settings.counts
    _say(f"{c.relayed} relayed, {c.sampled} sampled, not sampled: {c.too_large} too large, {c.busy} over the "
         f"budget, {c.unreadable} unreadable; {c.clients_refused} clients and {c.requests_refused} requests refused")
    return 0


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def _say(line: str) -> None:
    print(f"routed: {line}", file=sys.stderr, flush=True)
