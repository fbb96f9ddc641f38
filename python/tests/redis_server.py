"""Real redis-server processes on free loopback ports for kvtier's Python tests and benchmarks,
started and stopped by PID (as tests/support/redis_server.hpp does for the C++ tests), and a
harness client independent of kvtier.

    srv = Server(); srv.call("PING"); srv.pause(); srv.resume(); srv.stop()
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

REDIS = "/usr/bin/redis-server"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Server:
    """One redis-server child on 127.0.0.1:port; stop() by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, tls_args=(), extra_args=(), max_port=65535):
        """tls_args: also listen with TLS on tls_port with these arguments (see Pki.server_args);
        max_port: a cluster node needs port + 10000 for its bus."""
        self.dir = tempfile.mkdtemp(prefix="kvtier-py-redis-")
        self.proc = None
        self.tls_args = list(tls_args)
        self.extra_args = list(extra_args)
        self.tls_port = 0
        for _ in range(5):  # a port picked free may be taken before the server binds it
            self.port = free_port()
            for _ in range(100):
                if self.port <= max_port:
                    break
                self.port = free_port()
            if self.tls_args:
                self.tls_port = free_port()
            if self.tls_port != self.port and self._launch():
                return
        self.stop()
        raise RuntimeError("could not start redis-server; log:\n" + self.log())

    def _launch(self):
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--daemonize", "no", "--logfile", os.path.join(self.dir, "log")]
            + (["--tls-port", str(self.tls_port)] + self.tls_args if self.tls_args else []) + self.extra_args,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(500):  # 5 s at most
            if self.proc.poll() is not None:
                return False
            try:
                if self.call("PING") == b"PONG":
                    return True
            except OSError:
                time.sleep(0.01)
        self.stop()
        return False

    @property
    def url(self):
        return "resp://127.0.0.1:%d" % self.port

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return f.read()
        except OSError:
            return ""

    def call(self, *args, timeout=5.0):
        """One command over a fresh connection; the reply's payload (bytes, int or None)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(encode(*args))
            f = s.makefile("rb")
            line = f.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else f.read(n + 2)[:-2]
            raise RuntimeError("harness: unexpected reply %r" % line)

    def pause(self):
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.pid, signal.SIGCONT)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Pki:
    """A CA and certificates signed by it for 127.0.0.1 (server) and a client, made with the
    openssl command line in a temporary directory (as tests/support/test_pki.hpp does)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvtier-py-tls-")
        with open(self.path("san.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for ca in ("ca", "other-ca"):
            self._run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.path(ca + ".key"),
                      "-out", self.path(ca + ".pem"), "-days", "2", "-subj", "/CN=kvtier-test-" + ca)
        for name, cn in (("server", "127.0.0.1"), ("client", "kvtier-client")):
            self._run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", self.path(name + ".key"),
                      "-out", self.path(name + ".csr"), "-subj", "/CN=" + cn)
            self._run("x509", "-req", "-in", self.path(name + ".csr"), "-CA", self.path("ca.pem"),
                      "-CAkey", self.path("ca.key"), "-CAcreateserial", "-out", self.path(name + ".pem"),
                      "-days", "2", "-extfile", self.path("san.ext"))

    def path(self, name):
        return os.path.join(self.dir, name)

    def server_args(self, client_certs=True):
        a = ["--tls-cert-file", self.path("server.pem"), "--tls-key-file", self.path("server.key"),
             "--tls-ca-cert-file", self.path("ca.pem")]
        return a if client_certs else a + ["--tls-auth-clients", "no"]

    def _run(self, *args):
        subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """A Redis Cluster of `masters` Server nodes (no replicas) on loopback, joined by
    `redis-cli --cluster create`, ready once every node says cluster_state:ok (as
    tests/support/redis_cluster.hpp does)."""

    def __init__(self, masters=3, tls_args=()):
        """tls_args: every node also listens with TLS (Server's tls_args) and the cluster bus runs
        over TLS (--tls-cluster yes), so a client asking over TLS is told TLS ports."""
        self.nodes = []
        try:
            for _ in range(masters):
                self.nodes.append(Server(tls_args=tls_args,
                                         extra_args=["--cluster-enabled", "yes", "--cluster-config-file",
                                                     "nodes.conf", "--cluster-node-timeout", "5000"]
                                         + (["--tls-cluster", "yes"] if tls_args else []),
                                         max_port=55535))
            subprocess.run(["/usr/bin/redis-cli", "--cluster", "create",
                            *["127.0.0.1:%d" % n.port for n in self.nodes], "--cluster-replicas", "0",
                            "--cluster-yes"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
            for _ in range(1000):  # 10 s at most
                if all(b"cluster_state:ok" in n.call("CLUSTER", "INFO") for n in self.nodes):
                    return
                time.sleep(0.01)
            raise RuntimeError("cluster: not ok within 10 s")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self):
        return "resp+cluster://" + ",".join("127.0.0.1:%d" % n.port for n in self.nodes)

    @property
    def tls_url(self):
        return "resp+cluster+tls://" + ",".join("127.0.0.1:%d" % n.tls_port for n in self.nodes)

    def stop(self):
        for n in self.nodes:
            n.stop()
