"""Clients shared per URL, at most a few of them: a page where users type Redis URLs must not keep one open
socket per URL ever typed.

ClientCache keeps the clients (core.connect) of the last max_clients (URL, timeout, retries) asked for; asking
for another evicts the least recently used. An evicted client is not closed under its holders: a reader that
still holds it (a dashboard session watching that URL) may be inside a command on another thread. Eviction
closes only the connections no command is using (AutoClient.release_idle); the client stays usable, and its
next command connects again. So the open sockets are at most max_clients plus those of commands in flight and of
evicted clients whose holders still use them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from .client import AutoClient, connect

MAX_SHARED_CLIENTS = 16


class ClientCache:
    """At most max_clients AutoClients, one per (url, timeout_s, retries), least recently used evicted (module
    docstring). Thread-safe."""

    def __init__(self, max_clients: int = MAX_SHARED_CLIENTS):
        if max_clients < 1:
            raise ValueError(f"max_clients must be at least 1, not {max_clients}")
        self.max_clients = max_clients
        self._clients: OrderedDict[tuple[str, float, int], AutoClient] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, url: str, *, timeout_s: float = 1.0, retries: int = 1) -> AutoClient:
        """The shared client of url (made by core.connect on first use: ValueError for a bad URL, nothing
        cached then)."""
        key = (url, float(timeout_s), int(retries))
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                self._clients.move_to_end(key)
                return client
        made = connect(url, timeout_s=timeout_s, retries=retries)
        with self._lock:
            client = self._clients.setdefault(key, made)  # another thread may have made it meanwhile
            self._clients.move_to_end(key)
            evicted = [self._clients.popitem(last=False)[1] for _ in range(len(self._clients) - self.max_clients)]
        for old in evicted + ([made] if client is not made else []):
            old.release_idle()
        return client

    def __len__(self) -> int:
        return len(self._clients)

    def clear(self) -> None:
        """Forget every client, closing the connections none of them is using."""
        with self._lock:
            evicted, self._clients = list(self._clients.values()), OrderedDict()
        for old in evicted:
            old.release_idle()


_SHARED = ClientCache()


def shared_client(url: str, *, timeout_s: float = 1.0, retries: int = 1) -> AutoClient:
    """The process-wide ClientCache's client of url (at most MAX_SHARED_CLIENTS kept)."""
    return _SHARED.get(url, timeout_s=timeout_s, retries=retries)
