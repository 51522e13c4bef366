"""Fixtures that start real services: a private redis-server on a free loopback port per test session."""
from __future__ import annotations

import pytest

from demo.localredis import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """URL of the session's private redis-server, flushed before each test."""
    redis_server.client().flushdb()
    return redis_server.url
