"""A private redis-server child that a test can break: SIGKILL and restart (empty) on the same port, SIGSTOP
(stalled: connections are accepted by the kernel, nothing answers) and SIGCONT, extra server flags
(maxmemory, ACL users, TLS). Never a shared Redis: always a child on a free loopback port."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from moe_monitor import core
from moe_monitor.demo.localredis import free_port, wait_for_port


class FaultyRedis:
    """redis-server on 127.0.0.1:port with no persistence (a restart comes back empty). extra: more server
    flags. tls: (cert, key, ca) to serve TLS only; url then trusts `ca`."""

    def __init__(self, tmp_dir: str | os.PathLike[str], *extra: str, tls: tuple[str, str, str] | None = None):
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: apt-get install -y redis-server")
        self.port = free_port()
        self.dir = Path(tmp_dir)
        self.args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", str(self.dir), "--daemonize", "no", "--loglevel", "warning", *extra]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        if tls is not None:
            cert, key, ca = tls
            self.args[1:3] = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert,
                              "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
            self.url = f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={ca}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for_port(self.port):
            self.stop()
            raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: every connection is reset, everything held is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(5)

    def restart(self) -> None:
        """Kill (if running) and start again on the same port, empty."""
        self.kill()
        self.start()

    def stall(self) -> None:
        """SIGSTOP: the port still accepts connections (the kernel's backlog), nothing is answered. Returns once
        the process is stopped (a signal lands when the process is next scheduled: on a loaded machine, later)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30.0
        while not self.stalled() and time.monotonic() < deadline:
            time.sleep(0.005)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stalled(self) -> bool:
        """True while the process is stopped (state T in /proc)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")

    def client(self, url: str | None = None) -> core.AutoClient:
        return core.connect(url or self.url, timeout_s=2.0)

    def stop(self) -> None:
        self.kill()


def make_cert(folder: Path, name: str) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 made with the openssl command line: (cert.pem, key.pem). It is
    its own CA: a client that trusts another certificate refuses it."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is needed to make a test certificate")
    cert, key = str(folder / f"{name}-cert.pem"), str(folder / f"{name}-key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", f"/CN=127.0.0.1 {name}", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key
