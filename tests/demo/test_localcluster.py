"""The private Redis Cluster's nodes take ports of their own, even when another server takes a free port first."""
from __future__ import annotations

import itertools

from moe_monitor.demo import localcluster
from moe_monitor.demo.localcluster import LocalCluster
from moe_monitor.demo.localredis import RedisServer


def test_a_client_port_taken_before_a_node_binds_it_is_passed_over(tmp_path, monkeypatch):
    (tmp_path / "squatter").mkdir()
    squatter = RedisServer(tmp_path / "squatter")
    real_free_port = localcluster.free_port
    ports = itertools.chain([squatter.port], iter(real_free_port, None))  # the first node's first port is taken
    monkeypatch.setattr(localcluster, "free_port", lambda: next(ports))
    squatter.client().set("whose", "squatter")
    try:
        cluster = LocalCluster(tmp_path / "cluster", masters=3, replicas=0)
        try:
            assert squatter.port not in cluster.ports and len(cluster.ports) == 3
            for port in cluster.ports:
                assert int(cluster.node(port).info("server")["process_id"]) == cluster.procs[port].pid
            assert squatter.client().get("whose") == b"squatter"
            assert squatter.client().info("cluster")["cluster_enabled"] == 0
        finally:
            cluster.stop()
    finally:
        squatter.stop()
