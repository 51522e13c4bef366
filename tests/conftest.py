"""Fixtures that start real services: a private redis-server on a free loopback port per test session."""
from __future__ import annotations

import os

import pytest

from moe_monitor.demo.localredis import RedisServer

# The engine tests need vLLM's CPU build, which lives in its own .venv-engines: `make test-engines` runs them
# (MOE_ENGINE_TESTS=1); `make test` does not collect them.
collect_ignore = [] if os.environ.get("MOE_ENGINE_TESTS") == "1" else ["engines"]
# Megatron-Core, torchtitan and SGLang live in .venv-frameworks: `make test-frameworks` (MOE_FRAMEWORK_TESTS=1).
if os.environ.get("MOE_FRAMEWORK_TESTS") != "1":
    collect_ignore.append("frameworks")


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
