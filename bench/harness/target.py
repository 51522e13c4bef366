"""Where the benchmarks' load goes: a private redis-server (start_redis) or a private LocalCluster (Target), every
node with maxmemory and maxmemory-policy set; plain clients of its nodes, redis-benchmark's XADD rate into it
(entry_size, benchmark_xadd) and used_memory in MiB (mib). Used by bench.scale and bench.faults."""

from __future__ import annotations

import contextlib
import statistics

import redis

from bench.harness import loadgen
from moe_monitor import core


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def start_redis(tmp: str, maxmemory_bytes: int, policy: str):
    """A private redis-server with maxmemory and maxmemory-policy set."""
    from moe_monitor.demo.localredis import RedisServer

    server = RedisServer(tmp)
    client = server.client()
    client.config_set("maxmemory", str(maxmemory_bytes))
    client.config_set("maxmemory-policy", policy)
    client.close()
    return server


def node_client(url: str) -> redis.Redis:
    """A plain client of one redis-server (a cluster node answers INFO, CPU and memory of its own)."""
    return redis.Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=5.0)


class Target:
    """Where the load goes: a private redis-server (kind "single") or a private LocalCluster of `masters` masters
    with `replicas` replicas each ("cluster"), every node with maxmemory and maxmemory-policy set. url: what the
    writers, the aggregators and the dashboard are given; node_urls: client port -> redis:// URL of every node."""

    def __init__(self, kind: str, tmp: str, maxmemory_bytes: int, policy: str, masters: int = 3,
                 replicas: int = 0):
        self.kind, self.server, self.cluster = kind, None, None
        if kind == "single":
            self.server = start_redis(tmp, maxmemory_bytes, policy)
            self.url = self.server.url
            self.node_urls = {self.server.port: self.server.url}
        else:
            from moe_monitor.demo.localcluster import LocalCluster

            self.cluster = LocalCluster(tmp, masters=masters, replicas=replicas)
            self.url = self.cluster.url
            self.node_urls = {port: self.cluster.url_of(port) for port in self.cluster.ports}
            for url in self.node_urls.values():
                node = node_client(url)
                node.config_set("maxmemory", str(maxmemory_bytes))
                node.config_set("maxmemory-policy", policy)
                node.close()

    @property
    def masters(self) -> list[int]:
        return self.cluster.masters() if self.cluster is not None else list(self.node_urls)

    @property
    def replicas(self) -> list[int]:
        return self.cluster.replicas() if self.cluster is not None else []

    def master_of(self, key: str) -> int:
        """Port of the master serving key (the single server's own port)."""
        return self.cluster.master_of(key) if self.cluster is not None else next(iter(self.node_urls))

    def version(self) -> str:
        node = node_client(next(iter(self.node_urls.values())))
        try:
            return str(node.info("server")["redis_version"])
        finally:
            node.close()

    def figures(self) -> dict[int, dict[str, float]]:
        """loadgen.redis_figures (used_memory, used_memory_peak, CPU seconds) of every node, by port."""
        out = {}
        for port, url in self.node_urls.items():
            node = node_client(url)
            try:
                out[port] = loadgen.redis_figures(node)
            finally:
                node.close()
        return out

    def flush(self) -> None:
        """FLUSHALL every master (a cluster's replicas follow)."""
        for port in self.masters:
            node = node_client(self.node_urls[port])
            node.flushall()
            node.close()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.cluster is not None:
            self.cluster.stop()


def entry_size(tokens: int) -> int:
    """Bytes of one step entry as the load generator writes it (every field, compact counts; the median over 16
    ranks of real-shaped decode records of `tokens` tokens)."""
    from bench.wire import entry_bytes, records_for

    return int(statistics.median(entry_bytes(core.encode_step(rec)) for rec in records_for("decode", tokens, 16)))


def benchmark_xadd(target: Target, payload_bytes: int, maxlen: int) -> float | None:
    """redis-benchmark's XADD rate (bench.wire.redis_benchmark_rate) for one field of payload_bytes into the
    master of its key (bench:s), the key deleted afterwards; None (said why) when it cannot run."""
    from bench.wire import redis_benchmark_rate

    port = target.master_of("bench:s")
    try:
        return redis_benchmark_rate(port, payload_bytes, maxlen)
    except Exception as exc:  # no redis-benchmark here, or it failed: the rest of the figures stand
        print(f"  redis-benchmark: not measured ({type(exc).__name__}: {exc})")
        return None
    finally:
        with contextlib.suppress(Exception):
            node = node_client(target.node_urls[port])
            node.delete("bench:s")
            node.close()
