"""The soak's rig: one redis-server per rank behind a loopback proxy, the faults, the engine job.

Everything started here is stopped by its PID (servers, proxies' threads end with the rig).

    rig = Rig(out_dir, ranks=2, maxmemory="8mb")
    rig.start()                      # servers on free ports, a proxy in front of each
    job = rig.start_engine(build, ["--duration-s", "60"])
    with rig.fault("blackhole", rank=1):  # ... for as long as the block runs
        time.sleep(10)
    rig.stop()
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time

FAULTS = ["dead", "restart", "sigstop", "blackhole", "wrongpass", "tls", "corrupt", "evict", "slow"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resp(port: int, *args, password: str | None = None, timeout: float = 5.0):
    """One command on a fresh connection (AUTH first with `password`); the reply, or an
    Exception instance for an error reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        f = s.makefile("rb")
        cmds = ([("AUTH", password)] if password else []) + [args]
        for c in cmds:
            parts = [a if isinstance(a, bytes) else str(a).encode() for a in c]
            s.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
        replies = [_read(f) for _ in cmds]
        return replies[-1]


def _read(f):
    line = f.readline()
    if not line:
        raise ConnectionError("closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        return Exception(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read(f) for _ in range(n)]
    raise ConnectionError(f"bad reply {line!r}")


class Proxy:
    """Loopback TCP proxy in front of a server. Modes: pass; blackhole (accepts, never answers,
    holds what was sent; at its end every connection is dropped); slow (every reply delayed to
    about ten times its pass-mode time: `slow_s_per_byte` and `slow_s_per_reply`); closed (the
    port refuses connections: a dead host)."""

    def __init__(self, upstream: int):
        self.upstream, self.port, self.mode = upstream, free_port(), "pass"
        self.slow_s_per_byte, self.slow_s_per_reply = 0.0, 0.0
        self.lock, self.conns, self.listener, self.running = threading.Lock(), set(), None, True
        self._listen()

    def _listen(self):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(128)
        self.listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls):
        while self.running:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        with self.lock:
            self.conns.add(c)
        u = None
        try:
            while self.mode == "blackhole":  # accepted, never answered
                time.sleep(0.05)
            if c.fileno() < 0:
                return
            u = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            u.settimeout(None)
            with self.lock:
                self.conns.add(u)
            threading.Thread(target=self._pump, args=(c, u, False), daemon=True).start()
            self._pump(u, c, True)
        except OSError:
            pass
        finally:
            for s in (c, u):
                if s is not None:
                    self._close(s)

    def _pump(self, src, dst, replies: bool):
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                while self.mode == "blackhole":
                    time.sleep(0.05)
                if replies and self.mode == "slow":
                    time.sleep(self.slow_s_per_reply + self.slow_s_per_byte * len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src)
            self._close(dst)

    def _close(self, s):
        with self.lock:
            self.conns.discard(s)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()

    def drop_all(self):
        with self.lock:
            conns = list(self.conns)
        for s in conns:
            self._close(s)

    def set_mode(self, mode: str):
        if mode == "closed":
            self.mode = "closed"
            self.listener.close()
            self.drop_all()
            return
        if self.mode == "closed":
            self._listen()
        if self.mode == "blackhole" and mode != "blackhole":
            self.mode = mode
            self.drop_all()  # the held connections are gone, as after a half-open path
        self.mode = mode

    def stop(self):
        self.running = False
        with contextlib.suppress(OSError):
            self.listener.close()
        self.drop_all()


class Server:
    """One redis-server on a free port (or `port`), no persistence, stopped by PID."""

    def __init__(self, out_dir: str, name: str, maxmemory: str, port: int | None = None):
        self.out_dir, self.name, self.maxmemory = out_dir, name, maxmemory
        self.port, self.proc, self.tls = port or free_port(), None, False

    def start(self, tls_dir: str | None = None):
        args = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru",
                "--dir", self.out_dir, "--logfile", os.path.join(self.out_dir, self.name + ".log")]
        if tls_dir:  # TLS only on the same port: a client speaking plain RESP fails its handshake
            args += ["--port", "0", "--tls-port", str(self.port),
                     "--tls-cert-file", os.path.join(tls_dir, "cert.pem"),
                     "--tls-key-file", os.path.join(tls_dir, "key.pem"),
                     "--tls-ca-cert-file", os.path.join(tls_dir, "cert.pem"), "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        self.proc, self.tls = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), bool(tls_dir)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.tls:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                    return
            else:
                with contextlib.suppress(OSError, ConnectionError):
                    if resp(self.port, "PING", timeout=0.5) == "PONG":
                        return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: redis-server did not come up on port {self.port}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def signal(self, sig):
        os.kill(self.proc.pid, sig)


class Rig:
    def __init__(self, out_dir: str, ranks: int = 2, maxmemory: str = "8mb", seed: int = 1):
        self.out_dir, self.ranks, self.maxmemory = out_dir, ranks, maxmemory
        self.servers = [Server(out_dir, f"redis{r}", maxmemory) for r in range(ranks)]
        self.proxies: list[Proxy] = []
        self.rng = random.Random(seed)
        self.tls_dir = None

    def start(self):
        os.makedirs(self.out_dir, exist_ok=True)
        for s in self.servers:
            s.start()
        self.proxies = [Proxy(s.port) for s in self.servers]
        for p in self.proxies:
            self._calibrate_slow(p)

    def _calibrate_slow(self, p: Proxy):
        """Slow mode's delays from this proxy's own pass-mode times (a 147 kB value and a PING):
        each reply then takes about ten times as long."""
        value = os.urandom(147456)
        resp(p.port, "SET", "soak:calibrate", value)
        ts, tp = [], []
        for _ in range(15):
            t = time.perf_counter(); resp(p.port, "GET", "soak:calibrate"); ts.append(time.perf_counter() - t)
            t = time.perf_counter(); resp(p.port, "PING"); tp.append(time.perf_counter() - t)
        resp(p.port, "DEL", "soak:calibrate")
        ping, get = sorted(tp)[len(tp) // 2], sorted(ts)[len(ts) // 2]
        p.slow_s_per_reply = 9 * ping
        p.slow_s_per_byte = 9 * max(get - ping, 1e-5) / len(value)

    def ports(self) -> str:
        return ",".join(str(p.port) for p in self.proxies)

    def stop(self):
        for p in self.proxies:
            p.stop()
        for s in self.servers:
            s.kill()

    def _tls_files(self) -> str:
        if self.tls_dir is None:
            self.tls_dir = os.path.join(self.out_dir, "tls")
            os.makedirs(self.tls_dir, exist_ok=True)
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=127.0.0.1", "-keyout", os.path.join(self.tls_dir, "key.pem"),
                            "-out", os.path.join(self.tls_dir, "cert.pem")], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self.tls_dir

    def _corrupt_all(self, port: int) -> int:
        n, cursor = 0, b"0"
        while True:
            cursor, keys = resp(port, "SCAN", cursor, "COUNT", 1000)
            for k in keys:
                resp(port, "SETRANGE", k, 100, b"\xde\xad\xbe\xef garbage")
                n += 1
            if cursor in (b"0", "0"):
                return n

    @contextlib.contextmanager
    def fault(self, kind: str, rank: int, log=print):
        """Injects `kind` on rank `rank`'s server for as long as the block runs; yields a dict in
        which the fault's end writes 'ended' (monotonic time the server was whole again)."""
        s, p, info = self.servers[rank], self.proxies[rank], {}
        pw = "soak-wrong-%d" % self.rng.randrange(1 << 30)
        if kind in ("dead", "restart", "tls"):
            p.set_mode("closed") if kind == "dead" else None
            s.kill()
            if kind == "restart":
                s.start()
            if kind == "tls":
                s.start(tls_dir=self._tls_files())
        elif kind == "sigstop":
            s.signal(signal.SIGSTOP)
        elif kind == "blackhole":
            p.set_mode("blackhole")
        elif kind == "slow":
            p.set_mode("slow")
        elif kind == "wrongpass":
            resp(s.port, "CONFIG", "SET", "requirepass", pw)
            resp(s.port, "CLIENT", "KILL", "TYPE", "normal", password=pw)  # drops the engine's connections
        elif kind == "evict":
            resp(s.port, "CONFIG", "SET", "maxmemory", "1mb")
        elif kind != "corrupt":
            raise ValueError(f"unknown fault {kind!r}: expected one of {', '.join(FAULTS)}")
        stop = threading.Event()
        if kind == "corrupt":  # every value on the server, again and again while it lasts
            def corrupt_loop():
                while not stop.is_set():
                    with contextlib.suppress(OSError, ConnectionError):
                        info["corrupted"] = info.get("corrupted", 0) + self._corrupt_all(s.port)
                    stop.wait(0.5)
            th = threading.Thread(target=corrupt_loop, daemon=True)
            th.start()
        try:
            yield info
        finally:
            stop.set()
            if kind == "corrupt":
                th.join()
            if kind in ("dead", "tls"):
                s.kill()
                s.start()
                p.set_mode("pass")
            elif kind == "sigstop":
                s.signal(signal.SIGCONT)
            elif kind in ("blackhole", "slow"):
                p.set_mode("pass")
            elif kind == "wrongpass":
                resp(s.port, "CONFIG", "SET", "requirepass", "", password=pw)
            elif kind == "evict":
                resp(s.port, "CONFIG", "SET", "maxmemory", self.maxmemory)
            info["ended"] = time.monotonic()

    def start_engine(self, binary: str, args: list[str], mpiexec: str = "mpiexec", env: dict | None = None):
        cmd = [mpiexec, "-n", str(self.ranks), "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
               binary, "--ports", self.ports(), *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(os.path.join(self.out_dir, "engine.err"), "ab"),
                                text=True, bufsize=1, start_new_session=True, env={**os.environ, **(env or {})})


def rank_pids(job_pid: int, name: str = "soak_engine") -> list[int]:
    """The engine's rank processes under mpiexec (children named `name`)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            comm = st[st.index("(") + 1:st.rindex(")")]
            ppid = int(st[st.rindex(")") + 2:].split()[1])
            if ppid == job_pid and comm.startswith(name[:15]):
                out.append(int(d))
    return sorted(out)


def sample(pid: int) -> dict | None:
    """VmRSS (kB) and its anonymous, file and shared-memory parts, open descriptors and threads
    of `pid`, or None once it is gone."""
    fields = {"VmRSS:": "rss_kb", "RssAnon:": "anon_kb", "RssFile:": "file_kb", "RssShmem:": "shmem_kb"}
    try:
        out = {"rss_kb": 0, "threads": 0}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0] + ":"
                if key in fields:
                    out[fields[key]] = int(line.split()[1])
                elif key == "Threads:":
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        return out
    except OSError:
        return None
