"""The errors every Redis reader and writer expects, and how an error reads in one line.

REDIS_ERRORS is what a Redis call raises when the server is down, refuses, times out, or a cluster moves under
it: redis-py's own errors, the socket's OSError, and the cluster client's RedisClusterException (not a
RedisError subclass). Code that must survive Redis catches exactly these; anything else is a bug."""
from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError, RedisClusterException)
# the same set without OSError: a failure that is Redis's for sure (an OSError may be a file's)
REDIS_ONLY_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, RedisClusterException)
MAX_ERROR_CHARS = 500


def why(exc: BaseException, max_chars: int = MAX_ERROR_CHARS) -> str:
    """An exception as one short line: the message of a ValueError (written for a user), else the type and the
    message, cut at max_chars."""
    text = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
    return text if len(text) <= max_chars else text[:max_chars] + "..."
