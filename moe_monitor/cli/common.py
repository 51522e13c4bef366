"""What every subcommand of `moe-monitor` shares: the parser class, the flags that mean the same thing
everywhere (--redis, --run, --trace, --json), and the error convention: bad input, a Redis that is down or a
file that cannot be read is one `error: ...` line on stderr and exit status 2, never a traceback."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from moe_monitor import core

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class Parser(argparse.ArgumentParser):
    """argparse with the house's error line: `error: MESSAGE`, exit status 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def add_redis(p: argparse.ArgumentParser, required: bool = False) -> None:
    """--redis URL: redis://, rediss:// (TLS) or unix://, with user and password; default $REDIS_URL."""
    env = os.environ.get("REDIS_URL")
    if required and env is None:
        p.add_argument("--redis", required=True, metavar="URL",
                       help="Redis URL: redis://[user:password@]host:port/db, rediss:// (TLS) or unix:// "
                            "(default: $REDIS_URL)")
    else:
        p.add_argument("--redis", default=env or DEFAULT_REDIS, metavar="URL",
                       help=f"Redis URL: redis://[user:password@]host:port/db, rediss:// (TLS) or unix:// "
                            f"(default: $REDIS_URL or {DEFAULT_REDIS})")


def add_run(p: argparse.ArgumentParser, required: bool = True, help: str = "run name (letters, digits, _ . -)"):
    p.add_argument("--run", required=required, metavar="NAME", help=help)


def add_trace(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--trace", required=True, metavar="FILE", help=help)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


def fail(message: str) -> int:
    """One `error: ...` line on stderr (whatever the message holds, newlines included); returns 2."""
    print("error: " + (" ".join(message.split()) or "bad input"), file=sys.stderr)
    return 2


def guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """run(args) under the error convention: ValueError (bad input), OSError (a file), the Redis errors (down,
    refusing, a wrong password: the URL's password never printed), MemoryError and RecursionError each become
    one `error:` line and exit status 2. Anything else is a bug: one `error: internal error ...` line too (exit
    status 2), with the traceback only when MOE_MONITOR_DEBUG=1."""
    try:
        with warnings.catch_warnings():  # stderr carries one line: no numpy / torch warnings beside it
            warnings.simplefilter("ignore")
            return run(args)
    except ValueError as exc:
        return fail(str(exc).splitlines()[0] if str(exc) else "bad input")
    except core.REDIS_ONLY_ERRORS as exc:
        return fail(f"Redis: {type(exc).__name__}: {core.redact(str(exc))[:200]}")
    except OSError as exc:
        return fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
    except RecursionError:
        return fail("input nested too deeply")
    except MemoryError:
        return fail("out of memory: give a smaller input")
    except Exception as exc:
        if os.environ.get("MOE_MONITOR_DEBUG") == "1":
            raise
        return fail(f"internal error ({type(exc).__name__}: {exc}); please report it with the input "
                    "(MOE_MONITOR_DEBUG=1 shows the traceback)")


def print_json(payload: Any) -> None:
    """The --json output: one strict JSON object (no NaN or Infinity) on stdout."""
    print(json.dumps(payload, allow_nan=False, separators=(",", ":")))


class StopSignal:
    """SIGINT / SIGTERM set .stop (a long-running command finishes its batch, closes its files and exits 0)."""

    def __init__(self) -> None:
        self.stop = False
        signal.signal(signal.SIGINT, self._set)
        signal.signal(signal.SIGTERM, self._set)

    def _set(self, *_) -> None:
        self.stop = True
