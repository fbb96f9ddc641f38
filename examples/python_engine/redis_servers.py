"""Start and stop throwaway redis-server processes on free loopback ports (tests, benchmarks).

    with RedisServer() as srv:           # started on a free 127.0.0.1 port, no persistence
        url = srv.url                    # 'resp://127.0.0.1:PORT'
        srv.kill()                       # SIGKILL by PID (a server dying mid-load)
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time

REDIS_SERVER = "/usr/bin/redis-server"
REDIS_CLI = "/usr/bin/redis-cli"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, start_timeout_s: float = 10.0):
        self.dir = tempfile.mkdtemp(prefix="kvtier-py-redis-")
        last = None
        for _ in range(5):  # a port taken between free_port() and bind: try another
            self.port = free_port()
            self.proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--maxmemory", "0", "--daemonize", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + start_timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.cli("PING", check=False).strip() == "PONG":
                    return
                time.sleep(0.05)
            last = f"redis-server on port {self.port} did not answer PING (exit {self.proc.poll()})"
            self.stop()
        raise RuntimeError(last)

    @property
    def url(self) -> str:
        return f"resp://127.0.0.1:{self.port}"

    def cli(self, *args: str, check: bool = True) -> str:
        r = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port), *args],
                           capture_output=True, text=True, timeout=10)
        if check and r.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def command(self, *args) -> bytes | int | None:
        """One RESP command over a plain socket; binary-safe (redis-cli mangles binary bytes)."""
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        req = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in parts)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(req)
            f = s.makefile("rb")
            line = f.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else f.read(n + 2)[:-2]
            if kind == b"+":
                return rest
            raise RuntimeError(f"{args[0]}: {line!r}")

    def flip_byte(self, key: bytes, offset: int) -> None:
        """Overwrites one stored byte with another value (SETRANGE), as silent corruption would."""
        old = self.command("GETRANGE", key, offset, offset)
        if len(old) != 1:
            raise RuntimeError(f"{key!r} has no byte at offset {offset}")
        self.command("SETRANGE", key, offset, bytes([old[0] ^ 0x5A]))

    def kill(self) -> None:
        """SIGKILL by PID, as a crash would."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
