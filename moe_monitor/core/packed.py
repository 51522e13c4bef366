"""PackedPipeline: the collectors' batches to a single Redis in one round trip, for a fraction of redis-py's CPU.

Every queued command is packed by hiredis in one C call (redis-py's packer when hiredis is missing or a command
name has a space) and the batch goes out in one send; each reply is read with read_response and given redis-py's
response callback, so the replies are those of pipeline(transaction=False).execute(): in order, a refused
command's exception in its place (raise_on_error=False), or the first of them raised. Figures: docs/collectors.md.
Only for a single Redis (AutoClient.batch hands out ClusterBatch on a cluster). A connection or timeout error
closes that connection and is raised, as redis-py's pipeline does without retries: the caller retries the whole
batch (a command that landed before the error may then land twice)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

import redis
from redis.commands import CoreCommands

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py works without hiredis; so does this, at redis-py's cost
    _hiredis_pack = None

_EMPTY_RESPONSE = "EMPTY_RESPONSE"  # redis-py's option: the value a refused command stands for


class QueuedCommands(CoreCommands):
    """What a pipeline of ours shares (PackedPipeline here, core.client.ClusterBatch): redis-py's command methods
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
    """redis-py's command methods queue here; execute() sends them (module docstring)."""

    def __init__(self, client: redis.Redis):
        self._client = client
        self._queued = []

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands in one round trip; their replies in order (module docstring)."""
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
