"""The zero-plugin path: the routed experts a vLLM or SGLang server returns with each response (started with
--enable-return-routed-experts), turned into sampled step records and published like every collector's.

A client (`moe-monitor routed`, cli/routed.py) hands each response body to RoutedSampler.add(); each request
becomes up to two step records (its prompt rows, phase "prefill", and generated rows, "decode") over the MoE
layers kept, at most sample_tokens rows of each. A sample of the traffic this client saw, not the engine's
batches: the metadata says extra["source"] = "routed_experts". Where each engine puts them (vLLM: base64 .npy
[T, L, K]; SGLang: base64 int32 [T, L, K]): docs/vllm-parallel.md.
Shapes: T routed tokens of a request, L layers in the response, M MoE layers kept, K top-k, E experts,
N sampled tokens.
"""
from __future__ import annotations

import base64
import binascii
import collections
import io
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core.health import HealthReport

from .sinks import PartialWrite, RedisSink

ENGINES = ("vllm", "sglang")
SAMPLE_TOKENS = 16           # sampled rows per layer and step record
QUEUE_RECORDS = 4096         # records kept while Redis is unreachable (the oldest dropped beyond)
MAX_ROUTED_BYTES = 256 << 20  # a decoded routed_experts array larger than this is refused


@dataclass(frozen=True)
class RoutedRequest:
    """One request's routing: ids_TLK integer [T, L, K] logical expert ids (the engine's dtype, a view of the
    decoded bytes); prompt_rows: how many of the T rows are prompt tokens (-1: not known, the request is
    published as one "mixed" record)."""

    ids_TLK: np.ndarray
    prompt_rows: int


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def decode_vllm(text: object) -> np.ndarray:
    """Integer [T, L, K] from vLLM's routed_experts (base64 of .npy bytes), a view of the decoded bytes;
    ValueError when it is not that. The header is read first: an array it declares is never allocated, the
    bytes that follow must hold exactly its shape."""
    raw = _b64(text)
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = _NPY_HEADERS.get(version)
        if read_header is None:
            raise ValueError(f".npy version {version} (np.save writes 1.0 or 2.0)")
        shape, fortran, dtype = read_header(stream)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise ValueError(f"routed_experts is not a .npy array: {exc}") from None
    if len(shape) != 3 or dtype.kind not in "iu" or min(shape) < 0:
        raise ValueError(f"routed_experts must be an integer array [tokens, layers, top_k], got {dtype} {shape}")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if declared != len(raw) - stream.tell():
        raise ValueError(f"routed_experts declares {shape} {dtype} ({declared} bytes) but holds "
                         f"{len(raw) - stream.tell()} bytes")
    flat = np.frombuffer(raw, dtype=dtype, offset=stream.tell())
    return flat.reshape(shape[::-1]).transpose(2, 1, 0) if fortran else flat.reshape(shape)


def decode_sglang(text: object, num_layers: int, top_k: int) -> np.ndarray:
    """int32 [T, L, K] from SGLang's routed_experts (base64 of raw int32 bytes [T, L, K]), a view of the decoded
    bytes; ValueError when the byte count is not a whole number of [L, K] int32 rows."""
    raw = _b64(text)
    row_bytes = num_layers * top_k * 4
    if row_bytes <= 0 or len(raw) % row_bytes:
        raise ValueError(f"routed_experts holds {len(raw)} bytes: not whole int32 rows of {num_layers} layers x "
                         f"top-{top_k} (check --layers-total and --top-k)")
    return np.frombuffer(raw, dtype="<i4").reshape(-1, num_layers, top_k)


def _b64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"routed_experts must be a base64 string, got {type(text).__name__}")
    if len(text) > MAX_ROUTED_BYTES * 4 // 3 + 4:
        raise ValueError(f"routed_experts is larger than {MAX_ROUTED_BYTES >> 20} MiB")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("routed_experts is not valid base64") from None


def routed_requests(body: Mapping, engine: str, num_layers: int | None = None,
                    top_k: int | None = None) -> list[RoutedRequest]:
    """The requests' routing in one response body of `engine` (ENGINES); [] when it carries none. num_layers,
    top_k: the shape of SGLang's rows (its bytes do not say it). ValueError for a body or field that is
    malformed."""
    if engine == "vllm":
        return _vllm_requests(body)
    if engine == "sglang":
        if num_layers is None or top_k is None:
            raise ValueError("SGLang's routed_experts need the model's layer count and top-k")
        return _sglang_requests(body, num_layers, top_k)
    raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def _vllm_requests(body: Mapping) -> list[RoutedRequest]:
    if not isinstance(body, Mapping):
        raise ValueError(f"a vLLM response body is a JSON object, got {type(body).__name__}")
    choices = body.get("choices") or []
    if not isinstance(choices, list):
        raise ValueError(f"a vLLM response's choices are a list, got {type(choices).__name__}")
    single = len(choices) == 1
    out = []
    for choice in choices:
        if not isinstance(choice, Mapping) or choice.get("routed_experts") is None:
            continue
        ids = decode_vllm(choice["routed_experts"])
        generated = _generated(choice.get("token_ids"), body.get("usage"), single)
        out.append(RoutedRequest(ids, _prompt_rows(ids.shape[0], generated)))
    return out


def _sglang_requests(body: Mapping, num_layers: int, top_k: int) -> list[RoutedRequest]:
    items = body if isinstance(body, list) else [body]
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            raise ValueError(f"an SGLang response is a JSON object (or a list of them), got {type(item).__name__}")
        ext, meta = item.get("sglext") or {}, item.get("meta_info") or {}
        text = ext.get("routed_experts") if isinstance(ext, Mapping) else None
        if text is None and isinstance(meta, Mapping):
            text = meta.get("routed_experts")
        if text is None:
            continue
        ids = decode_sglang(text, num_layers, top_k)
        if meta:
            generated = meta.get("completion_tokens")
        else:
            generated = _generated(None, item.get("usage"), len(item.get("choices") or []) == 1)
        out.append(RoutedRequest(ids, _prompt_rows(ids.shape[0], generated)))
    return out


def _generated(token_ids: object, usage: object, single: bool) -> int | None:
    """Generated tokens of a choice: its token_ids (return_token_ids), else the usage of a one-choice response."""
    if isinstance(token_ids, list):
        return len(token_ids)
    if single and isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return None


def _prompt_rows(num_rows: int, generated: object) -> int:
    if not isinstance(generated, int) or generated < 1 or generated - 1 > num_rows:
        return -1
    return num_rows - (generated - 1)


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """Indices of the MoE layers among the response's num_layers: "all", or comma-separated indices and ranges
    ("1-47", "0,2,4-7"). ValueError for an index outside 0..num_layers-1."""
    if spec.strip() in ("", "all"):
        return list(range(num_layers))
    picked: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"layers {spec!r}: {part!r} is not an index or a range like 3-60") from None
        if not 0 <= lo <= hi < num_layers:
            raise ValueError(f"layers {spec!r}: {part!r} is outside the response's layers 0..{num_layers - 1}")
        picked.update(range(lo, hi + 1))
    return sorted(picked)


def counts_of(ids_TMK: np.ndarray, num_experts: int) -> np.ndarray:
    """int32 [M, E]: tokens routed to each expert in each kept layer. ValueError for an id outside [0, E) (the
    server's model has more experts than --num-experts says). One layer at a time: the only copy is one
    layer's ids as intp."""
    if ids_TMK.size and (int(ids_TMK.min()) < 0 or int(ids_TMK.max()) >= num_experts):
        raise ValueError(f"expert id {int(ids_TMK.max())} is outside 0..{num_experts - 1}: is --num-experts right?")
    counts_ME = np.zeros((ids_TMK.shape[1], num_experts), dtype=np.int32)
    for m in range(ids_TMK.shape[1]):
        counts_ME[m] = np.bincount(ids_TMK[:, m, :].ravel().astype(np.intp), minlength=num_experts)
    return counts_ME


def sampled_rows(ids_TMK: np.ndarray, sample_tokens: int) -> np.ndarray | None:
    """int16 [M, N, K] of N = min(T, sample_tokens) tokens taken evenly over the T rows, or None (none asked or
    no rows)."""
    num_rows = ids_TMK.shape[0]
    if sample_tokens <= 0 or num_rows == 0:
        return None
    take = min(num_rows, sample_tokens)
    pick_N = np.unique(np.arange(take) * num_rows // take)
    return np.ascontiguousarray(ids_TMK[pick_N].transpose(1, 0, 2)).astype(np.int16)


class RoutedSampler:
    """Publishes the routing of the responses given to add() as step records of one run (rank 0 of 1).

    The run's metadata is made from the first response that carries routing: L and K from its shape (SGLang:
    from num_layers / top_k), `layers` picks the MoE layers (parse_layers). Records wait in a queue of at most
    QUEUE_RECORDS (the oldest dropped beyond, counted) until flush() lands them; a failed flush keeps them.
    Thread-safe: add() from any number of threads (decoding and counting outside the lock), flush() from one;
    the lock is held only to number and queue records, never across a decode or a Redis write."""

    def __init__(self, redis_url: str, run: str, num_experts: int, *, engine: str = "vllm", layers: str = "all",
                 num_layers: int | None = None, top_k: int | None = None, gpus: int | None = None,
                 nodes: int = 1, model_name: str = "", sample_tokens: int = SAMPLE_TOKENS,
                 redis_timeout_s: float = 2.0, memory_budget_bytes: int = 256 << 20):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        if not 1 <= num_experts <= core.MAX_SAMPLE_EXPERTS:
            raise ValueError(f"num_experts must be 1..{core.MAX_SAMPLE_EXPERTS}, got {num_experts}")
        if gpus is not None and (gpus < 1 or num_experts % gpus):
            raise ValueError(f"--gpus {gpus} must divide the {num_experts} experts")
        self.redis_url, self.run = redis_url, core.check_run_name(run)
        self.num_experts, self.engine, self.layers_spec = num_experts, engine, layers
        self.num_layers, self.top_k, self.gpus, self.nodes = num_layers, top_k, gpus, nodes
        self.model_name, self.sample_tokens = model_name, sample_tokens
        self.redis_timeout_s, self.memory_budget_bytes = redis_timeout_s, memory_budget_bytes
        self.instance = core.new_instance_id()
        self.meta: core.RunMeta | None = None
        self.sink: RedisSink | None = None
        self.layers_M: list[int] = []
        self.shape_LK: tuple[int, int] = (0, 0)   # layers and top-k of the responses (from the first)
        self.queue: collections.deque[core.StepRecord] = collections.deque()
        self.step = 0
        self.requests = self.published = self.dropped = 0
        self.last_error = ""
        self._lock = threading.Lock()

    def add(self, body: Mapping, time_s: float | None = None) -> int:
        """Queue the step records of one response body; returns how many (0: it carried no routing)."""
        requests = routed_requests(body, self.engine, self.num_layers, self.top_k)
        made = 0
        for request in requests:
            with self._lock:
                self._ensure_meta(request.ids_TLK.shape)
            if request.ids_TLK.shape[1:] != self.shape_LK:
                raise ValueError(f"routed_experts of shape {request.ids_TLK.shape} do not match the first "
                                 f"response's [tokens, {self.shape_LK[0]}, {self.shape_LK[1]}]")
            ids_TMK = request.ids_TLK[:, self.layers_M, :]
            parts = ([("mixed", ids_TMK)] if request.prompt_rows < 0 else
                     [("prefill", ids_TMK[:request.prompt_rows]), ("decode", ids_TMK[request.prompt_rows:])])
            made_here = [(phase, rows.shape[0], counts_of(rows, self.num_experts),
                          sampled_rows(rows, self.sample_tokens)) for phase, rows in parts if rows.shape[0]]
            with self._lock:
                for phase, tokens, counts_ME, sample_MNK in made_here:
                    self._queue(phase, tokens, counts_ME, sample_MNK, time.time() if time_s is None else time_s)
                self.requests += 1
            made += len(made_here)
        return made

    def _queue(self, phase: str, tokens: int, counts_ME: np.ndarray, sample_MNK: np.ndarray | None,
               time_s: float) -> None:
        record = core.StepRecord(
            run=self.run, rank=0, world_size=1, step=self.step, time_s=time_s, phase=phase, tokens=tokens,
            counts_LE=counts_ME, sample_ids_LNK=sample_MNK, dropped_steps=self.dropped, instance=self.instance)
        self.step += 1
        self.queue.append(record)
        while len(self.queue) > QUEUE_RECORDS:
            self.queue.popleft()
            self.dropped += 1

    def _ensure_meta(self, shape_TLK: Sequence[int]) -> None:
        if self.meta is not None:
            return
        _, num_layers, top_k = shape_TLK
        self.layers_M = parse_layers(self.layers_spec, int(num_layers))
        layout = core.Layout(self.gpus or core.default_gpus(self.num_experts), self.nodes,
                             core.contiguous_layout(len(self.layers_M), self.num_experts))
        meta = core.RunMeta(
            run=self.run, model_name=self.model_name, layer_names=[f"model.layers.{i}" for i in self.layers_M],
            num_experts=self.num_experts, top_k=int(top_k), hidden_size=0, moe_intermediate_size=0, dtype_bytes=0,
            layout=layout, started_s=time.time(), host=socket.gethostname(),
            sample_tokens_per_layer=self.sample_tokens, instance=self.instance,
            extra={"source": "routed_experts", "engine": self.engine,
                   "sampled": "the requests one client saw, one record per request and phase"})
        core.encode_meta(meta)  # a layout that cannot work raises here, not at the first write
        maxlen = core.maxlen_for_budget(self.memory_budget_bytes, len(self.layers_M), self.num_experts,
                                        len(self.layers_M) * self.sample_tokens * int(top_k) * 2)
        self.sink = RedisSink(self.redis_url, meta, maxlen, self.redis_timeout_s, self.memory_budget_bytes)
        self.shape_LK = (int(num_layers), int(top_k))
        self.meta = meta

    def flush(self) -> bool:
        """Write the queued records; True when none is left. A failure is kept in last_error, never raised.
        One caller at a time (the lock is not held across the write: add() goes on meanwhile)."""
        with self._lock:
            if self.sink is None or not self.queue:
                return not self.queue
            batch = list(self.queue)
            health = HealthReport(rank=0, dropped_steps=self.dropped, published_steps=self.published,
                                  queued=len(batch), last_error=self.last_error,
                                  extra={"routed_requests": self.requests})
        try:
            self.sink.write(batch, [], health)
        except PartialWrite as exc:
            self._landed([rec for i, rec in enumerate(batch) if i in exc.landed], str(exc))
            return False
        except core.REDIS_ERRORS as exc:
            with self._lock:
                self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        self._landed(batch, "")
        with self._lock:
            return not self.queue

    def _landed(self, landed: list[core.StepRecord], error: str) -> None:
        """Take the records that landed off the queue (records queued meanwhile stay, in order); one that the
        queue dropped while it was being written landed after all, and is no longer counted dropped."""
        gone = {id(rec) for rec in landed}
        with self._lock:
            kept = collections.deque(rec for rec in self.queue if id(rec) not in gone)
            self.dropped -= len(landed) - (len(self.queue) - len(kept))
            self.published += len(landed)
            self.queue = kept
            self.last_error = error

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
