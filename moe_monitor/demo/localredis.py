"""A private redis-server child process on a free loopback port (tests and the demo; never a shared Redis)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time

from moe_monitor.demo.children import start_child


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 10.0) -> bool:
    """True once something accepts connections on 127.0.0.1:port, False after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


PORT_TRIES = 5


def own_server(proc: subprocess.Popen, port: int, url: str, timeout_s: float = 10.0) -> bool:
    """Whether the redis-server answering on 127.0.0.1:port (url) is proc, not another process that took the
    port first; False when proc exits first (the port taken, a bad option) or nothing answers in timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not wait_for_port(port, timeout_s=0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
    import redis  # a plain client: a cluster node is asked before its cluster exists

    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        return int(client.info("server")["process_id"]) == proc.pid
    except Exception:  # noqa: BLE001 (someone else's server: another password, no TLS, not Redis at all)
        return False
    finally:
        client.close()


class RedisServer:
    """A redis-server child process on 127.0.0.1:port, no persistence. `url` for clients."""

    def __init__(self, tmp_dir, password: str | None = None, tls_cert_key: tuple[str, str] | None = None,
                 own_session: bool = False):
        """tls_cert_key (cert.pem, key.pem): serve TLS only; url is then rediss:// trusting that cert.
        own_session: keep the terminal's Ctrl-C away from it, so its owner can flush before stopping it."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: apt-get install -y redis-server")
        self.password = password
        for _ in range(PORT_TRIES):  # another process may take the free port before redis-server binds it
            self.port = free_port()
            self._start(exe, tmp_dir, password, tls_cert_key, own_session)
            if own_server(self.proc, self.port, self.url):
                return
            exited = self.proc.poll()  # its own exit, before stop() ends a child that only lost the port
            self.stop()
        raise RuntimeError(f"redis-server did not start in {PORT_TRIES} tries"
                           + (f" (it exited with code {exited})" if exited else ""))

    def _start(self, exe: str, tmp_dir, password: str | None, tls_cert_key: tuple[str, str] | None,
               own_session: bool) -> None:
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(tmp_dir), "--daemonize", "no", "--loglevel", "warning"]
        if tls_cert_key:
            cert, key = tls_cert_key
            args[1:3] = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert, "--tls-key-file",
                         key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no"]
        if password:
            args += ["--requirepass", password]
        self.proc = start_child(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=own_session)  # dies with its owner, SIGKILL included
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        if tls_cert_key:
            self.url = f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={tls_cert_key[0]}"

    def client(self):
        from moe_monitor import core
        return core.connect(self.url, timeout_s=2.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
