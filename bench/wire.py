"""Bytes per rank-step on the wire, on real-shaped records (bench.loadgen's: DeepSeek-V3's 58 x 256, top-8):
1. for decode steps of 8, 64 and 256 tokens per rank and a prefill of 4096, the stream entry (every field) and its
   counts as core.encode_step writes them (version 2), the same counts as int32 (version 1's payload, still read,
   no longer written), Redis memory per entry (MEMORY USAGE over XLEN), encode / decode us; medians over records.
2. zstd levels 1 (core/compact.py's) and 3 against lz4 (when installed; never a dependency) on the narrowed counts:
   size, compress and decompress us, medians of interleaved calls.
3. `redis-benchmark` XADD rate (-n 20000 -P 16) of the v2 decode-64 payload beside bench.loadgen's rate into the
   same private redis-server (ranks writing as fast as they can), runs alternating; the ratio loadgen / benchmark.

    python -m bench.wire [--records 32] [--reps 30] [--rounds 3] [--load-ranks 32] [--load-seconds 4] [--no-redis]
"""
from __future__ import annotations

import argparse
import functools
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import zstandard

from bench import routing
from bench.harness import loadgen
from bench.malloc_env import pin_malloc
from moe_monitor import core

SHAPES = (("decode", 8), ("decode", 64), ("decode", 256), ("prefill", 4096))
SAMPLE_TOKENS, SAMPLE_EVERY = 16, 4  # the collectors' default sampled rows (16 tokens per layer, one step in 4)


def records_for(phase: str, tokens: int, count: int, seed: int = 0) -> list[core.StepRecord]:
    """`count` StepRecords of `tokens` tokens per rank (int32 counts [58, 256]), one per rank 0..count-1."""
    base_LE = routing.popularity_LE(source="prefill_in4096" if phase == "prefill" else routing.DEFAULT_SOURCE)
    out = []
    for rank in range(count):
        pool = routing.rank_pool(rank, 1, tokens, base_LE, seed=seed)
        out.append(core.StepRecord(run="bench", rank=rank, world_size=256, step=1000, time_s=1.7e9, phase=phase,
                                   tokens=tokens, counts_LE=pool.counts_SLE[0], instance="bench-instance"))
    return out


def entry_bytes(fields: dict) -> int:
    """Bytes of a stream entry's field names and values as sent (ints and strs as their text)."""
    return sum(len(str(k).encode()) + len(v if isinstance(v, bytes) else str(v).encode()) for k, v in fields.items())


def median_us(fn: Callable[[], object], reps: int) -> float:
    """Median microseconds of one call of fn over reps calls."""
    times = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def codecs() -> dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes, int], bytes]]]:
    """name -> (compress(raw), decompress(payload, raw size)); lz4 only when installed."""
    z1 = zstandard.ZstdCompressor(level=1, write_content_size=True)
    z3 = zstandard.ZstdCompressor(level=3, write_content_size=True)
    dz = zstandard.ZstdDecompressor()
    table: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes, int], bytes]]] = {
        "zstd-1": (z1.compress, lambda data, size: dz.decompress(data, max_output_size=size)),
        "zstd-3": (z3.compress, lambda data, size: dz.decompress(data, max_output_size=size)),
    }
    try:
        import lz4.frame
    except ImportError:
        return table
    table["lz4"] = (lambda data: lz4.frame.compress(data, store_size=True), lambda data, size: lz4.frame.decompress(data))
    return table


def codec_table(records: list[core.StepRecord], reps: int) -> dict[str, tuple[float, float, float]]:
    """codec -> (median bytes, median compress us, median decompress us) on each record's narrowed counts, calls
    interleaved (codecs in random order for every record and repetition)."""
    table = codecs()
    raws = []
    for rec in records:
        type_name = core.compact.narrowest_type(rec.counts_LE)
        raws.append(np.ascontiguousarray(rec.counts_LE, dtype=core.COUNT_TYPES[type_name]).tobytes())
    sizes: dict[str, list[int]] = {name: [] for name in table}
    enc: dict[str, list[int]] = {name: [] for name in table}
    dec: dict[str, list[int]] = {name: [] for name in table}
    for rep in range(reps):
        for raw in raws:
            names = list(table)
            random.shuffle(names)
            for name in names:
                compress, decompress = table[name]
                start = time.perf_counter_ns()
                packed = compress(raw)
                mid = time.perf_counter_ns()
                back = decompress(packed, len(raw))
                end = time.perf_counter_ns()
                if back != raw:
                    raise AssertionError(f"{name} did not round-trip")
                enc[name].append(mid - start)
                dec[name].append(end - mid)
                if rep == 0:
                    sizes[name].append(len(packed))
    out = {"narrowed": (float(statistics.median(len(r) for r in raws)), 0.0, 0.0)}
    for name in table:
        out[name] = (float(statistics.median(sizes[name])), statistics.median(enc[name]) / 1e3,
                     statistics.median(dec[name]) / 1e3)
    return out


def redis_entry_bytes(client, records: list[core.StepRecord], copies: int = 4) -> float:
    """Bytes of Redis memory per stream entry (MEMORY USAGE of a stream of the records, `copies` times each,
    over its length)."""
    key = "bench:wire:entries"
    client.delete(key)
    pipe = client.pipeline(transaction=False)
    for _ in range(copies):
        for rec in records:
            pipe.xadd(key, core.encode_step(rec))
    pipe.execute()
    usage = client.memory_usage(key, samples=0)
    length = client.xlen(key)
    client.delete(key)
    return usage / length


def sizes(records: list[core.StepRecord], reps: int, client) -> dict[str, float | str]:
    """{entry, counts, int32 (the counts as int32), redis (bytes, medians over records), type, encode_us,
    decode_us}."""
    encoded = [core.encode_step(rec) for rec in records]
    out: dict[str, float | str] = {
        "entry": statistics.median(entry_bytes(f) for f in encoded),
        "counts": statistics.median(len(f["counts"]) for f in encoded),  # type: ignore[arg-type]
        "int32": statistics.median(rec.counts_LE.size * 4 for rec in records),
        "redis": redis_entry_bytes(client, records) if client is not None else float("nan"),
        "type": str(encoded[0]["ct"]),
    }
    per_record = max(1, reps // 4)
    out["encode_us"] = statistics.median(median_us(functools.partial(core.encode_step, rec), per_record)
                                         for rec in records)
    out["decode_us"] = statistics.median(median_us(functools.partial(core.decode_step, fields), per_record)
                                         for fields in encoded)
    return out


def redis_benchmark_rate(port: int, payload_bytes: int, maxlen: int, requests: int = 20000) -> float:
    """XADD requests per second redis-benchmark reports for one field of payload_bytes (-P 16, its default 50
    clients), MAXLEN ~ maxlen."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        raise RuntimeError("redis-benchmark is not installed (it comes with redis-server: apt-get install redis-tools)")
    cmd = [exe, "-h", "127.0.0.1", "-p", str(port), "-n", str(requests), "-P", "16", "-q",
           "XADD", "bench:s", "MAXLEN", "~", str(maxlen), "*", "counts", "x" * payload_bytes]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    rates = re.findall(r"([\d.]+) requests per second", done.stdout.replace(",", ""))
    if not rates:
        raise RuntimeError(f"no rate in redis-benchmark's output: {done.stdout[-300:]!r}")
    return float(rates[-1])


def compare_rates(server, rounds: int, load_ranks: int, load_seconds: float, processes: int,
                  payloads: dict[str, int], requests: int = 20000) -> None:
    """redis-benchmark against bench.loadgen, alternating, for each payload size; prints medians."""
    client = server.client()
    print(f"\nRedis XADD rate, private redis-server {client.info('server')['redis_version']}, "
          f"{rounds} alternating rounds, medians:")
    for version, payload in payloads.items():
        maxlen = loadgen.LoadConfig(url=server.url, run="x", ranks=1, steps_per_s=1, seconds=1).maxlen
        bench_rates, load_rates, batch_sizes, cores, bench_server_us = [], [], [], [], []
        for r in range(rounds):
            for which in (("rb", "lg") if r % 2 == 0 else ("lg", "rb")):
                client.flushall()
                if which == "rb":
                    before_s = loadgen.redis_figures(client)["cpu_s"]
                    bench_rates.append(redis_benchmark_rate(server.port, payload, maxlen, requests))
                    bench_server_us.append((loadgen.redis_figures(client)["cpu_s"] - before_s) / requests * 1e6)
                    continue
                before = loadgen.redis_figures(client)
                report = loadgen.run_load(server.url, f"wire-{version}", load_ranks, 100_000, load_seconds, processes,
                                          64, stop_after_seconds=True)
                after = loadgen.redis_figures(client)
                load_rates.append(report.rate)
                batch_sizes.append(report.written / max(report.writes, 1))
                cores.append((report.cpu_s, (after["cpu_s"] - before["cpu_s"]), report.duration_s, report.written))
                if report.failed:
                    print(f"  ({version} loadgen round {r}: {report.failed} records failed: {report.errors()})")
        rb, lg = statistics.median(bench_rates), statistics.median(load_rates)
        client_cores = statistics.median(c[0] / c[2] for c in cores)
        client_us = statistics.median(c[0] / max(c[3], 1) * 1e6 for c in cores)
        server_us = statistics.median(c[1] / max(c[3], 1) * 1e6 for c in cores)
        print(f"  {version} ({payload:,} B counts): redis-benchmark XADD {rb:9,.0f}/s (redis-server "
              f"{statistics.median(bench_server_us):.0f} us CPU per XADD); loadgen {lg:8,.0f} records/s "
              f"({load_ranks} ranks, {processes} processes, {statistics.median(batch_sizes):.0f} records per write; "
              f"client {client_cores:.2f} cores = {client_us:.0f} us per record, redis-server {server_us:.0f} us per "
              f"record); loadgen / redis-benchmark = {lg / rb:.3f}")
    client.close()


def main(argv: list[str] | None = None) -> int:
    pin_malloc()
    parser = argparse.ArgumentParser(prog="python -m bench.wire", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=32, help="records per decode shape (prefill: a quarter)")
    parser.add_argument("--reps", type=int, default=30, help="timed calls per record and codec")
    parser.add_argument("--rounds", type=int, default=3, help="alternating redis-benchmark / loadgen rounds")
    parser.add_argument("--load-ranks", type=int, default=32)
    parser.add_argument("--load-seconds", type=float, default=4.0)
    parser.add_argument("--processes", type=int, default=4, help="loadgen processes")
    parser.add_argument("--no-redis", action="store_true", help="sizes and codecs only (no redis-server)")
    args = parser.parse_args(argv)
    random.seed(0)
    server = None
    if not args.no_redis:
        from moe_monitor.demo.localredis import RedisServer

        server = RedisServer(tempfile.mkdtemp(prefix="bench-wire-redis-"))
    try:
        client = server.client() if server is not None else None
        print("bytes per rank-step, DeepSeek-V3 shape (58 MoE layers x 256 experts, top-8), real-shaped counts;")
        print("  entry: every field of the stream entry; counts: its counts payload; int32: the counts as int32 "
              "(version 1's payload); redis: memory per stream entry")
        print(f"  {'shape':16s} {'entry':>9s} {'counts':>9s} {'type':>5s} {'int32':>9s} {'int32/entry':>11s} "
              f"{'redis':>9s}  {'encode us':>9s} {'decode us':>9s}")
        per_shape = {}
        for phase, tokens in SHAPES:
            count = args.records if phase == "decode" else max(2, args.records // 4)
            records = records_for(phase, tokens, count)
            per_shape[(phase, tokens)] = records
            got = sizes(records, args.reps, client)
            print(f"  {phase + ' ' + str(tokens):16s} {got['entry']:9,.0f} {got['counts']:9,.0f} {got['type']!s:>5s} "
                  f"{got['int32']:9,.0f} {float(got['int32']) / float(got['entry']):11.1f} {got['redis']:9,.0f}  "
                  f"{got['encode_us']:9.1f} {got['decode_us']:9.1f}")
        sample = np.random.default_rng(0).integers(0, 256, (routing.LAYERS, SAMPLE_TOKENS, routing.TOP_K))
        sample_raw = np.sort(sample, axis=2).astype("<i2").tobytes()
        print(f"  + sampled routing rows (collectors' default {SAMPLE_TOKENS} tokens/layer, one step in "
              f"{SAMPLE_EVERY}): {len(sample_raw):,} B int16 = {len(sample_raw) / SAMPLE_EVERY:,.0f} B "
              f"per rank-step on average (zstd-1 would make them "
              f"{len(zstandard.ZstdCompressor(level=1).compress(sample_raw)):,} B)")

        print(f"\ncodecs on the narrowed counts (medians; {args.reps} interleaved calls per record):")
        available = codecs()
        if "lz4" not in available:
            print("  lz4 not installed (pip install lz4 to compare; it is no dependency of this project)")
        print(f"  {'shape':16s} " + "".join(f"{name:>28s}" for name in ["narrowed", *available]))
        print(f"  {'':16s} " + "".join(f"{'bytes  comp us  decomp us':>28s}" for _ in ["narrowed", *available]))
        lz4_ratio = []
        for (phase, tokens), records in per_shape.items():
            table = codec_table(records, args.reps)
            cells = "".join(f"{size:>10,.0f} {enc:8.1f} {dec:8.1f}" if name != "narrowed" else
                            f"{size:>10,.0f} {'-':>8s} {'-':>8s}" for name, (size, enc, dec) in table.items())
            print(f"  {phase + ' ' + str(tokens):16s} {cells}")
            if "lz4" in table:
                lz4_ratio.append((f"{phase} {tokens}", table["zstd-1"][0] / table["lz4"][0],
                                  table["zstd-1"][1] / table["lz4"][1], table["zstd-1"][2] / table["lz4"][2]))
        for label, size_r, enc_r, dec_r in lz4_ratio:
            print(f"  zstd-1 / lz4 {label:12s}: size {size_r:.2f}, compress time {enc_r:.2f}, decompress time "
                  f"{dec_r:.2f}")

        if server is not None:
            decode64 = [core.encode_step(rec) for rec in per_shape[("decode", 64)]]
            payloads = {"v2": int(statistics.median(len(f["counts"]) for f in decode64))}  # type: ignore[arg-type]
            compare_rates(server, args.rounds, args.load_ranks, args.load_seconds, args.processes, payloads)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
