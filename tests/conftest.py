"""Fixtures that start real services (a private redis-server on a free loopback port per test session), and the
marks that split the tests in two tiers: `make test` runs what starts none of the slow things, `make test-all`
(CI) runs everything."""
from __future__ import annotations

import inspect
import os
import sys
import types

import pytest

from moe_monitor.demo.localredis import RedisServer

# The engine tests need vLLM's CPU build, which lives in its own .venv-engines: `make test-engines` runs them
# (MOE_ENGINE_TESTS=1); `make test` does not collect them.
collect_ignore = [] if os.environ.get("MOE_ENGINE_TESTS") == "1" else ["engines"]
# Megatron-Core, torchtitan and SGLang live in .venv-frameworks: `make test-frameworks` (MOE_FRAMEWORK_TESTS=1).
if os.environ.get("MOE_FRAMEWORK_TESTS") != "1":
    collect_ignore.append("frameworks")

# What a test starts, found in its own code, in its fixtures' and in the test-side helpers (tests.*) they call,
# and the mark it gets. A name `executable` (sys.executable) is a Python child: mark `subprocess`. Modules that
# start children through moe_monitor/ or bench/ (the EP runtime, bench.faults) say so in `pytestmark`; the
# dashboard's upload check runs in a child of its own by design and stays in the fast tier.
STARTERS = {
    "tests.support.browserkit.chromium_page": "browser",
    "tests.support.apptest.run_app": "app",
    "streamlit.testing.v1.app_test.AppTest": "app",
    "moe_monitor.demo.localcluster.LocalCluster": "cluster",
}
LOOKED_INTO = ("tests.", "moe_monitor.demo.localcluster", "streamlit.testing")  # modules whose names are followed


def _names(code: types.CodeType):
    """Every global or attribute name that code and the functions nested in it use."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _marks_of(funcs) -> set[str]:
    """The marks for what funcs (and the tests.* functions and classes they name, transitively) start."""
    marks: set[str] = set()
    seen: set[types.CodeType] = set()
    stack = [inspect.unwrap(f) for f in funcs]
    while stack:
        func = stack.pop()
        code = getattr(func, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        names = set(_names(code))
        if "executable" in names:
            marks.add("subprocess")
        scope = func.__globals__
        found = [scope[n] if n in scope else sys.modules[n] for n in names if n in scope or n in sys.modules]
        found += [getattr(m, n) for m in list(found) if isinstance(m, types.ModuleType)
                  and m.__name__.startswith(LOOKED_INTO) for n in names
                  if hasattr(m, n)]  # module.attribute, and `from module import name` inside a function
        for obj in found:
            where = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
            if where in STARTERS:
                marks.add(STARTERS[where])
            elif where.startswith("tests."):
                if inspect.isfunction(obj):
                    stack.append(obj)
                elif inspect.isclass(obj):
                    stack.extend(v for v in vars(obj).values() if inspect.isfunction(v))
    return marks


def pytest_collection_modifyitems(config, items):
    for item in items:
        func = getattr(item, "function", None)
        if func is None:
            continue
        inner = getattr(getattr(func, "hypothesis", None), "inner_test", func)
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        for mark in sorted(_marks_of([inner, *fixtures])):
            item.add_marker(mark)


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
