"""Remote stores from Python against real redis-server processes this test starts on free
loopback ports: round trips, the GIL released during a slow get, corruption, timeouts and
dead servers as exceptions or per-key statuses (never a hang, never wrong bytes)."""
import threading

import numpy as np
import pytest
import torch

import kvtier

H, S, M = kvtier.Status.hit, kvtier.Status.stored, kvtier.Status.miss
NS = kvtier.KeyNamespace("test-model", "fp8", chunk_tokens=4)
VB = 64 << 10


def keys_of(n, salt=0):
    return [kvtier.ChunkKey(salt, i) for i in range(n)]


def payload(n, seed=3):
    return np.random.default_rng(seed).integers(0, 256, size=(n, VB), dtype=np.uint8)


@pytest.mark.parametrize("value_format", [1, 2])
def test_round_trip_into_a_tensor(redis_server, value_format):
    s = kvtier.RemoteStore(redis_server.url, NS, value_format=value_format,
                           group_bytes=16 << 10 if value_format == 2 else 0)
    keys, src = keys_of(8), payload(8)
    assert s.put(keys, torch.from_numpy(src), 2.0) == [S] * 8
    assert s.exists(keys + keys_of(1, salt=9), 2.0) == [H] * 8 + [M]
    dst = torch.zeros(8, VB, dtype=torch.uint8)
    alias = dst.numpy()
    assert s.get(keys, dst, 2.0) == [H] * 8
    assert np.array_equal(alias, src)  # the tensor's own memory was written
    assert redis_server.call("EXISTS", NS.remote_key(keys[0])) == 1
    st = s.stats()
    assert st["hits"] == 8 and st["bytes_fetched"] == 8 * VB and st["bytes_stored"] == 8 * VB
    s.close()


def test_corrupt_value_is_a_status_not_wrong_bytes(redis_server):
    s = kvtier.RemoteStore(redis_server.url, NS)
    keys, src = keys_of(2), payload(2)
    s.put(keys, src, 2.0)
    value = bytearray(redis_server.call("GET", NS.remote_key(keys[1])))
    value[-1] ^= 0xFF  # one payload bit flipped on the server
    redis_server.call("SET", NS.remote_key(keys[1]), bytes(value))
    dst = np.zeros_like(src)
    assert s.get(keys, dst, 2.0) == [H, kvtier.Status.corrupt]
    assert np.array_equal(dst[0], src[0]) and s.stats()["bad_checksum"] == 1


@pytest.mark.parametrize("value_format", [1, 2])
def test_a_destination_of_another_size_is_invalid_argument(redis_server, value_format):
    # The stored values are VB bytes; a destination of another size is the caller's error, named
    # with both sizes (not a corrupt status, which would point at the server). Both formats: the
    # stored payload length comes from the value's length less its header (format 2: a table).
    s = kvtier.RemoteStore(redis_server.url, NS, value_format=value_format,
                           group_bytes=16 << 10 if value_format == 2 else 0)
    keys, src = keys_of(3), payload(3)
    assert s.put(keys, src, 2.0) == [S] * 3
    with pytest.raises(kvtier.InvalidArgument,
                       match=f"RemoteStore.get: key 2's stored value is {VB} bytes, the destination gives {VB // 2}") as e:
        s.get(keys, [bytearray(VB), bytearray(VB), bytearray(VB // 2)], 2.0)
    assert e.value.status == [H, H, kvtier.Status.corrupt]
    with pytest.raises(kvtier.InvalidArgument, match=f"key 0's stored value is {VB} bytes, the destination "
                                                     f"gives {2 * VB} \\(2 more keys like it\\)"):
        s.get(keys, np.zeros((3, 2 * VB), dtype=np.uint8), 2.0)
    assert s.stats()["wrong_length"] == 4
    # A value damaged on the server (same length, a payload bit flipped) is still corrupt, not this.
    value = bytearray(redis_server.call("GET", NS.remote_key(keys[1])))
    value[-1] ^= 0xFF
    redis_server.call("SET", NS.remote_key(keys[1]), bytes(value))
    dst = np.zeros_like(src)
    assert s.get(keys, dst, 2.0) == [H, kvtier.Status.corrupt, H]
    s.close()


def test_the_gil_is_released_during_a_slow_get(redis_server):
    """The get can finish only if this thread runs Python while the get waits: it resumes the
    paused server. With the GIL held, this thread could not run until the get's deadline, and
    the get would end in a timeout."""
    s = kvtier.RemoteStore(redis_server.url, NS, connections=1, reserved_small=0)
    keys, src = keys_of(4), payload(4)
    assert s.put(keys, src, 2.0) == [S] * 4  # the connection is up before the pause
    dst = np.zeros_like(src)
    result, started = {}, threading.Event()

    def reader():
        started.set()
        try:
            result["status"] = s.get(keys, dst, 20.0)
        except kvtier.Error as e:
            result["error"] = e

    redis_server.pause()
    t = threading.Thread(target=reader)
    t.start()
    started.wait(5.0)
    ran = 0
    for _ in range(200):  # Python work in this thread while the get is in flight (bounded)
        if not t.is_alive():
            break
        ran += 1
        threading.Event().wait(0.005)
    redis_server.resume()
    t.join(30.0)
    assert not t.is_alive()
    assert "error" not in result, result.get("error")
    assert result["status"] == [H] * 4 and np.array_equal(dst, src)
    assert ran == 200  # the get was still waiting on the paused server all along


def test_timeout_raises_with_statuses(redis_server):
    s = kvtier.RemoteStore(redis_server.url, NS, connections=1, reserved_small=0)
    keys = keys_of(2)
    s.put(keys, payload(2), 2.0)
    redis_server.pause()
    try:
        with pytest.raises(kvtier.TimeoutError) as e:
            s.get(keys, np.zeros((2, VB), dtype=np.uint8), 0.2)
    finally:
        redis_server.resume()
    assert isinstance(e.value, TimeoutError) and e.value.code == kvtier.Errc.timeout
    assert e.value.status == [kvtier.Status.timeout] * 2
    assert s.stats()["timeouts"] == 1


def test_dead_server_is_a_connection_error(redis_server):
    s = kvtier.RemoteStore(redis_server.url, NS, connect_timeout=0.5)
    s.put(keys_of(1), payload(1), 2.0)
    redis_server.stop()
    with pytest.raises(kvtier.Error) as e:
        s.get(keys_of(1), np.zeros((1, VB), dtype=np.uint8), 1.0)
    assert e.value.status == [kvtier.Status.error] or e.value.status == [kvtier.Status.timeout]
    assert "127.0.0.1:%d" % redis_server.port in str(e.value)
    s.close()
    with pytest.raises(kvtier.ClosedError):
        s.exists(keys_of(1), 1.0)


def test_tiered_and_rendezvous_over_real_servers(two_redis_servers):
    a, b = two_redis_servers
    l2 = kvtier.RendezvousStore([kvtier.RemoteStore(a.url, NS), kvtier.RemoteStore(b.url, NS)])
    tiers = kvtier.TieredStore(kvtier.MemoryStore(1 << 24), l2, writes="l2_only")
    keys, src = keys_of(16), payload(16)
    assert tiers.put(keys, src, 5.0) == [S] * 16
    assert a.call("DBSIZE") > 0 and b.call("DBSIZE") > 0 and a.call("DBSIZE") + b.call("DBSIZE") == 16
    dst = torch.zeros(16, VB, dtype=torch.uint8)
    assert tiers.get(keys, dst, 5.0) == [H] * 16 and np.array_equal(dst.numpy(), src)
    assert tiers.stats()["l2_hits"] == 16


def test_rendezvous_names_remote_instances_by_their_servers(two_redis_servers):
    # As the C++ rendezvous_store: each RemoteStore is named by its server (no credentials), so
    # the list's order does not move a key: a key put through [a, b] is found through [b, a].
    a, b = two_redis_servers
    ra, rb = kvtier.RemoteStore(a.url, NS), kvtier.RemoteStore(b.url, NS)
    assert ra.identity == f"127.0.0.1:{a.port}" and rb.identity == f"127.0.0.1:{b.port}"
    assert kvtier.RemoteStore("resp://user:s3cret@127.0.0.1:1/2", NS).identity == "127.0.0.1:1/2"
    ab, ba = kvtier.RendezvousStore([ra, rb]), kvtier.RendezvousStore([rb, ra])
    assert ab.names == [ra.identity, rb.identity] and ba.names == [rb.identity, ra.identity]
    keys, src = keys_of(16), payload(16)
    assert ab.put(keys, src, 5.0) == [S] * 16
    assert all(ab.names[ab.instance_of(k)] == ba.names[ba.instance_of(k)] for k in keys)
    assert ba.exists(keys, 5.0) == [H] * 16


def test_password_from_a_file(tmp_path, redis_server):
    redis_server.call("CONFIG", "SET", "requirepass", "s3cret")
    f = tmp_path / "pw"
    f.write_text("s3cret\n")
    s = kvtier.RemoteStore(redis_server.url, NS, password_file=str(f))
    assert s.put(keys_of(1), b"abc", 2.0) == [S]
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    with pytest.raises(kvtier.ServerError) as e:
        kvtier.RemoteStore(redis_server.url, NS, password_file=str(wrong)).exists(keys_of(1), 2.0)
    assert "nope" not in str(e.value)


def test_cluster_store_on_a_standalone_server_fails_cleanly(redis_server):
    c = kvtier.ClusterStore("resp+cluster://127.0.0.1:%d" % redis_server.port, NS, connect_timeout=0.5)
    with pytest.raises(kvtier.Error) as e:
        c.put(keys_of(1), b"abc", 2.0)
    assert e.value.status is not None


def test_close_waits_for_the_call_in_flight(redis_server):
    """close() from another thread waits for a get in flight (never frees what it uses); the
    get completes with the right bytes, later calls raise ClosedError."""
    s = kvtier.RemoteStore(redis_server.url, NS, connections=1, reserved_small=0)
    keys, src = keys_of(2), payload(2)
    s.put(keys, src, 2.0)
    dst = np.zeros_like(src)
    out, started = {}, threading.Event()

    def reader():
        started.set()
        out["status"] = s.get(keys, dst, 20.0)

    redis_server.pause()
    r = threading.Thread(target=reader)
    r.start()
    started.wait(5.0)
    threading.Event().wait(0.2)  # let the get reach the paused server
    c = threading.Thread(target=s.close)
    c.start()
    threading.Event().wait(0.2)
    closing_while_get_ran = c.is_alive() and r.is_alive()
    redis_server.resume()
    r.join(30.0)
    c.join(30.0)
    assert not r.is_alive() and not c.is_alive()
    assert closing_while_get_ran  # close was waiting for the get
    assert out["status"] == [H] * 2 and np.array_equal(dst, src)
    with pytest.raises(kvtier.ClosedError):
        s.get(keys, dst, 1.0)


def test_threads_share_one_store(redis_server):
    s = kvtier.RemoteStore(redis_server.url, NS, connections=3, reserved_small=1)
    errors = []

    def worker(w):
        try:
            for i in range(10):
                keys, src = keys_of(3, salt=100 * w + i), payload(3, seed=w * 1000 + i)
                assert s.put(keys, src, 5.0) == [S] * 3
                dst = torch.zeros(3, VB, dtype=torch.uint8)
                assert s.get(keys, dst, 5.0) == [H] * 3
                assert np.array_equal(dst.numpy(), src)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60.0)
    assert not errors and not any(t.is_alive() for t in ts)
    assert s.stats()["hits"] == 4 * 10 * 3


def test_tls_round_trip_and_refusals(pki, tls_redis_server):
    url = "rediss://127.0.0.1:%d" % tls_redis_server.tls_port
    tls = kvtier.TlsOptions(ca_file=pki.path("ca.pem"), cert_file=pki.path("client.pem"),
                            key_file=pki.path("client.key"))
    s = kvtier.RemoteStore(url, NS, tls=tls)
    keys, src = keys_of(3), payload(3)
    assert s.put(keys, src, 5.0) == [S] * 3
    dst = torch.zeros(3, VB, dtype=torch.uint8)
    assert s.get(keys, dst, 5.0) == [H] * 3 and np.array_equal(dst.numpy(), src)
    assert tls_redis_server.call("DBSIZE") == 3  # the same server, seen on its plain port
    # A server certificate from a CA the client does not trust: a TLS failure, not a hang.
    other = kvtier.RemoteStore(url, NS, connect_timeout=2.0, tls=kvtier.TlsOptions(
        ca_file=pki.path("other-ca.pem"), cert_file=pki.path("client.pem"), key_file=pki.path("client.key")))
    with pytest.raises(kvtier.ConnectionError) as e:
        other.exists(keys, 5.0)
    assert e.value.code == kvtier.Errc.tls_failed and "certificate" in str(e.value)
    with pytest.raises(kvtier.InvalidArgument, match="not a TLS URL"):
        kvtier.RemoteStore(tls_redis_server.url, NS, tls=tls)


@pytest.mark.parametrize("placement", ["spread", "pinned"])
def test_cluster_round_trip(redis_cluster, placement):
    c = kvtier.ClusterStore(redis_cluster.url + "?placement=" + placement, NS, rank=1)
    keys, src = keys_of(12), payload(12)
    assert c.put(keys, src, 10.0) == [S] * 12
    sizes = [n.call("DBSIZE") for n in redis_cluster.nodes]
    assert sum(sizes) == 12
    assert (sorted(sizes) == [0, 0, 12]) == (placement == "pinned")  # pinned: one slot, one master
    dst = torch.zeros(12, VB, dtype=torch.uint8)
    assert c.get(keys, dst, 10.0) == [H] * 12 and np.array_equal(dst.numpy(), src)
    assert c.exists(keys + keys_of(1, salt=5), 10.0) == [H] * 12 + [M]
    with pytest.raises(kvtier.InvalidArgument, match=f"ClusterStore.get: key 0's stored value is {VB} bytes, "
                                                     f"the destination gives {VB - 8} \\(11 more keys"):
        c.get(keys, torch.zeros(12, VB - 8, dtype=torch.uint8), 10.0)  # another size: named, as RemoteStore
    c.close()


def test_cluster_over_tls(pki):
    # A 3-master cluster whose nodes and bus speak TLS: resp+cluster+tls:// routes every key over
    # TLS (the plain ports, used only by this harness, see the values land on the masters); a CA
    # the client does not trust is a TLS failure, not a hang.
    from redis_server import Cluster
    cluster = Cluster(3, tls_args=pki.server_args(client_certs=False))
    try:
        c = kvtier.ClusterStore(cluster.tls_url, NS, tls=kvtier.TlsOptions(ca_file=pki.path("ca.pem")))
        keys, src = keys_of(12), payload(12)
        assert c.put(keys, src, 10.0) == [S] * 12
        sizes = [n.call("DBSIZE") for n in cluster.nodes]
        assert sum(sizes) == 12 and sum(1 for x in sizes if x) >= 2, sizes
        dst = torch.zeros(12, VB, dtype=torch.uint8)
        assert c.get(keys, dst, 10.0) == [H] * 12 and np.array_equal(dst.numpy(), src)
        c.close()
        other = kvtier.ClusterStore(cluster.tls_url, NS, connect_timeout=2.0,
                                    tls=kvtier.TlsOptions(ca_file=pki.path("other-ca.pem")))
        with pytest.raises(kvtier.Error) as e:
            other.exists(keys, 5.0)
        assert e.value.code == kvtier.Errc.tls_failed, str(e.value)
        with pytest.raises(kvtier.InvalidArgument, match="not a TLS URL"):
            kvtier.ClusterStore(cluster.url, NS, tls=kvtier.TlsOptions(ca_file=pki.path("ca.pem")))
    finally:
        cluster.stop()
