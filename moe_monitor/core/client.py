"""Redis clients with explicit timeouts and retries, shared by the collectors and the dashboard (redis-py 8
defaults to 5 s and 10 retries; a monitor must fail fast). URLs: redis://[[user]:password@]host:port/db,
rediss:// for TLS, unix:///path.sock.

connect() returns an AutoClient for a single Redis or a Redis Cluster alike: its first command asks `INFO
cluster` (until a server answers, every command asks again), then goes through redis.Redis or a RedisCluster
for good (a server refusing INFO is a single Redis). Cluster failures outside redis.RedisError come out as
redis.exceptions.ConnectionError (or ClusterError), so callers catch one family. An ACL user for a cluster also
needs CLUSTER SLOTS, COMMAND and INFO. docs/wire.md (Redis Cluster).

A writer's batch (AutoClient.batch()) is a PackedPipeline on a single Redis, a ClusterBatch on a cluster.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, Self, TypeAlias

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import PipelineCommand, RedisCluster
from redis.commands import CoreCommands
from redis.exceptions import AskError, ClusterDownError, RedisClusterException, SlotNotCoveredError, TryAgainError
from redis.retry import Retry

from .redaction import redact
from .redisurl import check_url, explain


def connect(url: str, *, timeout_s: float = 1.0, retries: int = 1) -> AutoClient:
    """A client for url (a single Redis or any node of a Redis Cluster: AutoClient) that gives up after
    timeout_s per socket operation and retries `retries` times (a single Redis: with a short exponential
    backoff; a cluster: after mapping its slots again). Connecting is lazy: nothing is sent until the first
    command, but the URL is read now: ValueError, in words that never quote a secret (core.redisurl), for a URL
    that is not redis://, rediss:// or unix://, a bad port, an option redis-py does not know (which it would
    only refuse at the first command, with a TypeError) or a value it refuses."""
    check_url(url)
    try:
        client = AutoClient(url, timeout_s=timeout_s, retries=retries)
        client.check_options()
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise explain(exc, url) from None
    return client


def _retry(retries: int) -> Retry:
    return Retry(ExponentialBackoff(cap=0.5, base=0.05), retries)


def _single(url: str, timeout_s: float, retries: int) -> redis.Redis:
    """The plain client of url (parses the URL now: a bad port or option raises ValueError here)."""
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                retry=_retry(retries), health_check_interval=30, decode_responses=False)


def _cluster(url: str, timeout_s: float, retries: int) -> RedisCluster:
    """A RedisCluster bootstrapped from the node of url (sends CLUSTER SLOTS and COMMAND now). Slots no node
    serves do not stop it (require_full_coverage=False): the runs on the other shards go on."""
    return RedisCluster.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                 retry=_retry(retries), require_full_coverage=False, decode_responses=False)


def _cluster_enabled(info: object) -> bool:
    """True when an `INFO cluster` reply (redis-py parses it into a dict) says cluster_enabled:1."""
    return isinstance(info, dict) and str(info.get("cluster_enabled", "0")) == "1"


def _as_redis_error(exc: RedisClusterException) -> redis.RedisError:
    """A RedisClusterException (not a redis.RedisError) as the RedisError a single Redis would have raised:
    ConnectionError when no node could be reached or the slot has no node, ClusterError otherwise."""
    cause = exc.__cause__
    unreachable = isinstance(exc, SlotNotCoveredError) or isinstance(
        cause, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError))
    kind = redis.exceptions.ConnectionError if unreachable else redis.exceptions.ClusterError
    return kind(f"Redis Cluster: {exc}")


def _plain_errors(call: Callable[..., Any]) -> Callable[..., Any]:
    """call (a RedisCluster method) raising RedisClusterException as redis.RedisError (_as_redis_error)."""

    @functools.wraps(call)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except RedisClusterException as exc:
            raise _as_redis_error(exc) from exc

    return wrapped


_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py works without hiredis; so does this, at redis-py's cost
    _hiredis_pack = None

_EMPTY_RESPONSE = "EMPTY_RESPONSE"  # redis-py's option: the value a refused command stands for


class QueuedCommands(CoreCommands):
    """What a pipeline of ours shares (PackedPipeline, ClusterBatch): redis-py's command methods
    queue (args, options) in _queued, and execute() (the subclass's) sends them."""

    _is_async_client = False  # redis-py's typing marker: the command methods return replies, not awaitables
    _event_dispatcher: Any = None  # redis-py's CommandsProtocol asks for it; no command method uses it
    _queued: list[tuple[tuple[Any, ...], dict[str, Any]]]

    def execute_command(self, *args: Any, **options: Any) -> Self:
        """Queue one command (what every command method calls); returns the pipeline."""
        self._queued.append((args, options))
        return self

    def __len__(self) -> int:
        return len(self._queued)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reset()

    def reset(self) -> None:  # type: ignore[override]  # the pipeline's reset, not the RESET command
        """Forget the queued commands."""
        self._queued = []


class PackedPipeline(QueuedCommands):
    """A writer's batch to a single Redis (AutoClient.batch()) in one round trip, for a fraction of redis-py's CPU.
    Every queued command is packed by hiredis in one C call (redis-py's packer when hiredis is missing or a command
    name has a space) and the batch goes out in one send; each reply is read with read_response and given
    redis-py's response callback, so the replies are those of pipeline(transaction=False).execute(): in order, a
    refused command's exception in its place (raise_on_error=False), or the first of them raised. A connection or
    timeout error closes that connection and is raised: the caller retries the whole batch (a command that landed
    before the error may then land twice). Figures: docs/collectors.md."""

    def __init__(self, client: redis.Redis):
        self._client = client
        self._queued = []

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands in one round trip; their replies in order (class docstring)."""
        queued, self._queued = self._queued, []
        if not queued:
            return []
        pool = self._client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command(_pack(queued, connection))
            callbacks: dict[Any, Any] = {}  # each command name's response callback, looked up once a batch
            replies = [self._reply(connection, args[0], options, callbacks) for args, options in queued]
        except BaseException:
            connection.disconnect()  # a reply may be left unread on it: never reuse it
            raise
        finally:
            pool.release(connection)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _reply(self, connection: Any, command: Any, options: dict[str, Any], callbacks: dict[Any, Any]) -> Any:
        """One command's reply as redis-py's client would give it (its response callback applied); a refusal is
        returned as its ResponseError (or the value of EMPTY_RESPONSE when the command method gave one).
        callbacks: the callbacks looked up so far, by command name."""
        try:
            reply = connection.read_response()
        except redis.ResponseError as exc:
            return options.get(_EMPTY_RESPONSE, exc)
        if command in callbacks:
            callback = callbacks[command]
        else:
            callback = callbacks[command] = self._client.response_callbacks.get(command)
        if callback is None:
            return reply
        options = {name: value for name, value in options.items() if name not in (_EMPTY_RESPONSE, "keys")}
        return callback(reply, **options)


def _pack(queued: list[tuple[tuple[Any, ...], dict[str, Any]]], connection: Any) -> list[bytes]:
    """The queued commands in Redis's protocol, as send_packed_command takes them."""
    if _hiredis_pack is not None and all(isinstance(args[0], str) and " " not in args[0] for args, _ in queued):
        try:
            return [b"".join([_hiredis_pack(args) for args, _ in queued])]
        except TypeError:  # an argument hiredis does not take (a memoryview, say): redis-py's packer converts it
            pass
    return connection.pack_commands([args for args, _ in queued])


_REDIRECTED = (AskError, TryAgainError)  # the node answered: the key is elsewhere now (MovedError is an AskError)
# the node did not answer, or answered that the cluster is down (a failover under way): read the slot map again
_REMAP = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ClusterDownError)


class ClusterBatch(QueuedCommands):
    """AutoClient.pipeline() and .batch() on a Redis Cluster: redis-py's command methods queue here; execute() sends each
    node its share of the commands in one round trip (keys on any slots; a transaction goes through redis-py's
    own transactional pipeline and needs one slot). execute(raise_on_error=False) returns one reply per
    command, in order, an exception in the place of each that failed.

    Unlike redis-py's ClusterPipeline, commands whose node did not answer (ConnectionError, TimeoutError) are
    not retried one by one: that would make one write last until a failover completes (each retry waits for
    the socket timeout of a stalled node) and could land later commands of a batch before earlier ones (steps
    out of order). They stay failed (the caller retries the batch, in order) and the slot map is read again at
    once (also after CLUSTERDOWN, a failover under way), so the next batch finds a promoted replica. Commands
    the node answered with MOVED, ASK or TRYAGAIN are sent again one by one, in order, through the cluster
    client, which follows the redirection. A node that cannot be connected to at all fails the whole batch
    before anything is sent (redis-py reads the map again and retries `retries` times)."""

    def __init__(self, cluster: RedisCluster, transaction: bool | None = None, shard_hint: str | None = None):
        if shard_hint:
            raise redis.exceptions.ClusterError("shard_hint is not supported by a Redis Cluster pipeline")
        self._cluster, self._transaction = cluster, bool(transaction)
        self._queued = []

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands (module docstring); replies in order. RedisClusterException comes out as
        redis.RedisError; with raise_on_error, the first failed command's exception is raised."""
        queued, self._queued = self._queued, []
        if not queued:
            return []
        try:
            if self._transaction:
                pipe = self._cluster.pipeline(transaction=True)
                for args, options in queued:
                    pipe.execute_command(*args, **options)
                return pipe.execute(raise_on_error=raise_on_error)
            stack = [PipelineCommand(args, options, position) for position, (args, options) in enumerate(queued)]
            self._cluster.pipeline().send_cluster_commands(stack, raise_on_error=False, allow_redirections=False)
        except RedisClusterException as exc:  # no node for a slot, no node answering: the map may be stale
            self._remap()
            raise _as_redis_error(exc) from exc
        replies = self._follow(stack)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _follow(self, stack: list[PipelineCommand]) -> list[Any]:
        """The replies of a sent stack, after sending again (in order) the commands that were redirected and
        reading the slot map again when a node did not answer."""
        for command in stack:
            if isinstance(command.result, _REDIRECTED):
                try:
                    command.result = self._cluster.execute_command(*command.args, **command.options)
                except redis.RedisError as exc:
                    command.result = exc
                except RedisClusterException as exc:
                    command.result = _as_redis_error(exc)
        replies = [command.result for command in stack]
        failed = next((command for command in stack if isinstance(command.result, _REMAP)), None)
        if failed is not None:
            self._remap(failed)
        return replies

    def _remap(self, failed: PipelineCommand | None = None) -> None:
        """Read the slot map again (CLUSTER SLOTS from a node that answers); when none does, the next command
        tries again anyway. failed: a command whose node did not answer; that node is asked last (redis-py's
        last_failed_node_name, where it has one), so a stalled node costs a write one socket timeout, not two."""
        manager = self._cluster.nodes_manager
        name = None
        if failed is not None:
            with contextlib.suppress(Exception):
                slot = self._cluster.determine_slot(*failed.args)
                name = None if slot is None else manager.get_node_from_slot(slot).name
        with contextlib.suppress(Exception):
            if name is None:
                manager.initialize()
                return
            try:
                manager.initialize(last_failed_node_name=name)
            except TypeError:  # an older redis-py has no such argument: the nodes in its own order
                manager.initialize()


class AutoClient:
    """A client of a single Redis or a Redis Cluster, decided at the first command that reaches the server
    (module docstring). Every redis-py command and pipeline() go to the client decided (redis.Redis or
    redis.cluster.RedisCluster), so callers write the same code for both. cluster: None until decided, then
    whether the server is a cluster node. resolve() decides now (one INFO round trip, then CLUSTER SLOTS and
    COMMAND for a cluster) and returns that client; it raises what the command would (ConnectionError,
    TimeoutError, AuthenticationError) while the server cannot be reached. Thread-safe: one decision."""

    _target: redis.Redis | RedisCluster | None = None  # class default: __getattr__ never recurses

    def __init__(self, url: str, *, timeout_s: float, retries: int):
        self.url, self.timeout_s, self.retries = url, float(timeout_s), int(retries)
        self._single = _single(url, self.timeout_s, self.retries)
        self._target = None
        self._lock = threading.Lock()

    @property
    def cluster(self) -> bool | None:
        """None until a server answered, then True for a Redis Cluster node, False for a single Redis."""
        target = self._target
        return None if target is None else isinstance(target, RedisCluster)

    def resolve(self) -> redis.Redis | RedisCluster:
        """The client every command goes through, decided now if no server has answered yet."""
        target = self._target
        if target is not None:
            return target
        with self._lock:
            if self._target is None:
                self._target = self._decide()
            return self._target

    def _decide(self) -> redis.Redis | RedisCluster:
        """Ask INFO cluster through the single client; make the RedisCluster when the server is a cluster node.
        Raises (and decides nothing) while no server answers or the cluster cannot be mapped yet."""
        try:
            info = self._single.info("cluster")
        except redis.exceptions.ResponseError:  # INFO refused (an ACL without it): use it as a single Redis
            return self._single
        if not _cluster_enabled(info):
            return self._single
        try:
            cluster = _cluster(self.url, self.timeout_s, self.retries)
        except Exception as exc:  # not formed yet, no slots, a node lost meanwhile: ask again next time
            raise redis.exceptions.ConnectionError(
                f"Redis Cluster at {redact(self.url)} cannot be used yet: {type(exc).__name__}: {exc}") from exc
        self._single.close()
        return cluster

    def __getattr__(self, name: str) -> Any:
        """Any redis-py command or attribute, of the client decided (decides first)."""
        if name.startswith("_"):  # never a command; also keeps a half-made object from recursing
            raise AttributeError(name)
        target = self.resolve()
        if isinstance(target, RedisCluster):
            if name == "pipeline":
                return functools.partial(ClusterBatch, target)
            attr = getattr(target, name)
            return _plain_errors(attr) if callable(attr) else attr
        return getattr(target, name)

    def batch(self) -> PackedPipeline | ClusterBatch:
        """A pipeline (transaction=False) for a writer's batch: PackedPipeline on a single Redis (one
        round trip for a fraction of redis-py's CPU), ClusterBatch on a cluster. Decides first, as pipeline() does."""
        target = self.resolve()
        if isinstance(target, RedisCluster):
            return ClusterBatch(target)
        return PackedPipeline(target)

    def check_options(self) -> None:
        """Make (not open) one connection of the URL's kind with the URL's options, as the first command would:
        redis-py refuses an option it does not know (TypeError) or a value it cannot use (RedisError, ValueError)
        only then. Nothing is sent."""
        pool = self._single.connection_pool
        pool.connection_class(**pool.connection_kwargs)

    def release_idle(self) -> None:
        """Close the connections no command is using now. A command in flight (another thread's) keeps its own
        connection, and the client stays usable: its next command connects again (core.clientcache evicts so)."""
        target = self._target
        pools = [self._single.connection_pool]
        if isinstance(target, RedisCluster):
            pools += [node.redis_connection.connection_pool for node in target.get_nodes()
                      if node.redis_connection is not None]
        for pool in pools:
            pool.disconnect(inuse_connections=False)

    def close(self) -> None:
        """Close the connections (no server is asked; a client never decided closes its single client)."""
        target = self._target
        if target is not None and target is not self._single:
            target.close()
        self._single.close()

    def __repr__(self) -> str:
        mode = {None: "undecided", True: "cluster", False: "single"}[self.cluster]
        return f"AutoClient({redact(self.url)!r}, {mode})"


# What the readers and writers accept: an AutoClient (core.connect) or a redis-py client made directly.
Client: TypeAlias = AutoClient | redis.Redis | RedisCluster
