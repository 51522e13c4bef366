"""The demo's children die with it: a process that started a private redis-server (as `make demo` does, in its
own session so Ctrl-C does not reach it) is SIGKILLed; the redis-server must go too."""
import os
import signal
import subprocess
import sys

from tests.support.waiting import wait_until

STARTER = """
import sys, tempfile, time
from moe_monitor.demo.localredis import RedisServer
server = RedisServer(tempfile.mkdtemp(), own_session=True)
print(server.proc.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sigkilled_demo_takes_its_private_redis_server_with_it():
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    redis_pid = int(starter.stdout.readline())
    assert alive(redis_pid)
    starter.send_signal(signal.SIGKILL)
    starter.wait(30)
    assert wait_until(lambda: not alive(redis_pid), timeout_s=30), "redis-server outlived the demo"
