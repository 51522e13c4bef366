"""A private Redis Cluster on loopback for tests and benchmarks: redis-server children started with --cluster-enabled yes on
free ports (the cluster bus on a free port of its own, --cluster-port), joined by `redis-cli --cluster create`,
then SIGKILL of the master that owns a key's slot and the wait for its replica's promotion. Never a shared
Redis: every process is a child of this object, every port one it picked; stop() kills only those."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis
from redis.cluster import key_slot

from moe_monitor.demo.children import start_child
from moe_monitor.demo.localredis import PORT_TRIES, free_port, own_server, wait_for_port


class LocalCluster:
    """masters x (1 + replicas) redis-server processes on 127.0.0.1, no persistence, cluster-node-timeout
    node_timeout_ms. url: a redis:// URL of the first node (with the password when one is set); ports: every
    node's client port, in start order. password: requirepass and masterauth of every node (None: no AUTH)."""

    def __init__(self, tmp_dir: str | os.PathLike[str], masters: int = 3, replicas: int = 1,
                 node_timeout_ms: int = 1000, password: str | None = None, ready_timeout_s: float = 30.0):
        exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if exe is None or cli is None:
            raise RuntimeError("redis-server and redis-cli are needed: apt-get install -y redis-server")
        self.dir, self.password, self._cli = Path(tmp_dir), password, cli
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # client port -> its redis-server
        self._args: dict[int, list[str]] = {}  # client port -> its command line
        self._stalled: set[int] = set()  # ports of the nodes stopped with SIGSTOP
        try:
            for _ in range(masters * (1 + replicas)):
                self._start_node(exe, node_timeout_ms)
            self.ports = list(self.procs)
            self._create(replicas)
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.url = self.url_of(self.ports[0])

    def url_of(self, port: int) -> str:
        """A redis:// URL of one node (with the password when one is set)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{port}/0"

    # ------------------------------------------------------------------ starting
    def _start_node(self, exe: str, node_timeout_ms: int) -> None:
        """One redis-server child on a free client port and a free cluster bus port, serving on the client port
        itself; another pair of ports when another process took one first (PORT_TRIES in all)."""
        for _ in range(PORT_TRIES):
            port, bus = free_port(), free_port()
            folder = self.dir / f"node-{port}"
            folder.mkdir(parents=True, exist_ok=True)
            args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                    "--cluster-port", str(bus), "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", str(node_timeout_ms), "--save", "", "--appendonly", "no",
                    "--repl-diskless-sync-delay", "0", "--dir", str(folder), "--daemonize", "no",
                    "--loglevel", "warning"]
            if self.password:
                args += ["--requirepass", self.password, "--masterauth", self.password]
            proc = start_child(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if own_server(proc, port, self.url_of(port)):
                self.procs[port], self._args[port] = proc, args
                return
            proc.kill()
            proc.wait()
        raise RuntimeError(f"redis-server (cluster node) did not start in {PORT_TRIES} tries")

    def _launch(self, port: int) -> None:
        """Start again the node of port with its own arguments (its nodes-<port>.conf keeps its identity)."""
        self.procs[port] = start_child(self._args[port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for_port(port):
            raise RuntimeError(f"redis-server (cluster node) did not start on port {port}")

    def _create(self, replicas: int) -> None:
        """redis-cli --cluster create over every node: the first len/(1 + replicas) become masters."""
        args = [self._cli, "--cluster", "create", *[f"127.0.0.1:{port}" for port in self.ports],
                "--cluster-replicas", str(replicas), "--cluster-yes"]
        if self.password:
            args[1:1] = ["-a", self.password, "--no-auth-warning"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until every live node says cluster_state:ok, all of them map all 16384 slots to the same masters and
        every replica's link to its master is up (its first sync done). RuntimeError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        why = "not checked"
        while time.monotonic() < deadline:
            why = self._not_ready()
            if not why:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the test cluster is not ready after {timeout_s} s: {why}")

    def _not_ready(self) -> str:
        """Why the cluster is not ready yet ('' when it is)."""
        views = set()
        try:
            for port in self.live_ports():
                node = self.node(port)
                state = _cluster_state(node)
                if state != "ok":
                    return f"node {port}: cluster_state {state}"
                replication = node.info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return f"replica {port}: master link {replication.get('master_link_status')}"
                views.add(tuple(sorted(self._slot_owners(node).items())))
        except (redis.RedisError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if len(views) != 1:
            return "the nodes do not agree on the slot owners yet"
        (owners,) = views
        covered = sum(hi - lo + 1 for (lo, hi), _ in owners)
        return "" if covered == 16384 else f"{covered} of 16384 slots covered"

    # ------------------------------------------------------------------ looking
    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (short timeouts, no retry; decoded replies)."""
        return redis.Redis(host="127.0.0.1", port=port, password=self.password, socket_timeout=2.0,
                           socket_connect_timeout=2.0, decode_responses=True)

    def live_ports(self) -> list[int]:
        """Client ports of the nodes whose process runs and is not stopped (stall())."""
        return [port for port, proc in self.procs.items() if proc.poll() is None and port not in self._stalled]

    @staticmethod
    def _slot_owners(node: redis.Redis) -> dict[tuple[int, int], int]:
        """CLUSTER SLOTS of one node -> {(first slot, last slot): port of the master serving them}."""
        reply = node.execute_command("CLUSTER SLOTS")
        owners = {}
        for entry in reply:
            lo, hi, master = entry[0], entry[1], entry[2]
            owners[(int(lo), int(hi))] = int(master[1])
        return owners

    def master_of(self, key: str) -> int:
        """Port of the master that serves key's slot, as the first live node sees it."""
        slot = key_slot(key.encode())
        for (lo, hi), port in self._slot_owners(self.node(self.live_ports()[0])).items():
            if lo <= slot <= hi:
                return port
        raise RuntimeError(f"slot {slot} of {key!r} has no master")

    def masters(self) -> list[int]:
        """Ports of the masters serving slots, as the first live node sees it."""
        return sorted(set(self._slot_owners(self.node(self.live_ports()[0])).values()))

    def replicas(self) -> list[int]:
        """Ports of the live nodes that serve no slot as master."""
        masters = set(self.masters())
        return [port for port in self.live_ports() if port not in masters]

    # ------------------------------------------------------------------ breaking
    def kill(self, port: int) -> None:
        """SIGKILL one node (a child of this object): its connections reset, what it held is gone."""
        proc = self.procs[port]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)  # a stopped process dies too
            proc.wait(5)
        self._stalled.discard(port)

    def stall(self, port: int) -> None:
        """SIGSTOP one node: the kernel still accepts connections to it, nothing is answered (a host gone)."""
        self.procs[port].send_signal(signal.SIGSTOP)
        self._stalled.add(port)

    def resume(self, port: int) -> None:
        """SIGCONT a node stopped by stall()."""
        self.procs[port].send_signal(signal.SIGCONT)
        self._stalled.discard(port)

    def restart(self, port: int) -> None:
        """Start a killed node again on its port; it rejoins the cluster from its nodes.conf (call wait_ready)."""
        if self.procs[port].poll() is None:
            raise RuntimeError(f"node {port} still runs")
        self._launch(port)

    def kill_master_of(self, key: str, timeout_s: float = 20.0, stall: bool = False) -> tuple[int, int]:
        """SIGKILL the master serving key's slot (SIGSTOP with stall: it then accepts connections and answers
        nothing) and wait until its replica has taken the slot over and every live node says cluster_state:ok.
        Returns (the failed master's port, the new master's port); RuntimeError after timeout_s."""
        old = self.master_of(key)
        if stall:
            self.stall(old)
        else:
            self.kill(old)
        deadline = time.monotonic() + timeout_s
        why = "not checked"
        while time.monotonic() < deadline:
            why = self._not_ready()
            if not why:
                new = self.master_of(key)
                if new != old:
                    return old, new
                why = f"slot of {key!r} still served by {old}"
            time.sleep(0.05)
        raise RuntimeError(f"no failover of {key!r} within {timeout_s} s: {why}")

    def stop(self) -> None:
        """SIGKILL every node this object started and wait for them (nothing is persisted)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def _cluster_state(node: redis.Redis) -> str:
    """The cluster_state field of one node's CLUSTER INFO ("ok", "fail")."""
    reply = node.execute_command("CLUSTER INFO")  # redis-py parses it into a dict
    if isinstance(reply, dict):
        return str(reply.get("cluster_state", "unknown"))
    fields = dict(line.strip().partition(":")[::2] for line in str(reply).splitlines())
    return fields.get("cluster_state", "unknown")
