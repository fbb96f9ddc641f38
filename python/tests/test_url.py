"""Server URLs from Python: parsing, rank substitution, redaction (no message shows a password)."""
import pytest

import kvtier


def test_parse():
    ep = kvtier.parse_url("resp://app:s3cret@127.0.0.1:6379/2")
    assert (ep.transport, ep.host, ep.port, ep.db, ep.user, ep.password) == ("tcp", "127.0.0.1", 6379, 2, "app", "s3cret")
    assert ep.describe() == "127.0.0.1:6379/2" and "s3cret" not in repr(ep)
    assert kvtier.parse_url("resp://127.0.0.1:{rank+6400}", rank=3).port == 6403
    assert kvtier.parse_url("resp+unix:///tmp/r.sock").path == "/tmp/r.sock"
    assert kvtier.parse_url("rediss://h:6380").tls
    assert kvtier.substitute_rank("a{rank}b", 7) == "a7b"


def test_redaction():
    assert kvtier.redact_url("resp://app:s3cret@h:6379/2") == "resp://app:***@h:6379/2"
    assert kvtier.redact_url("resp://s3cret@h:6379") == "resp://***@h:6379"
    assert kvtier.redact_url("resp://h:6379") == "resp://h:6379"
    for bad in ("resp://app:s3cret@h:99999", "redis://app:s3cret@h:1", "resp://app:s3cret@h:{rank+1}"):
        with pytest.raises(kvtier.BadUrl) as e:
            kvtier.parse_url(bad)
        assert "s3cret" not in str(e.value) and e.value.code == kvtier.Errc.bad_url


def test_cluster_url():
    assert kvtier.is_cluster_url("resp+cluster://h:7000") and not kvtier.is_cluster_url("resp://h:7000")
    u = kvtier.parse_cluster_url("resp+cluster://a:pw@10.0.0.1:7000,10.0.0.2:7001?placement=pinned")
    assert [s.port for s in u.seeds] == [7000, 7001] and u.placement == "pinned"
    with pytest.raises(kvtier.BadUrl) as e:
        kvtier.parse_cluster_url("resp+cluster://a:pw@h:7000/3")
    assert "pw@" not in str(e.value)
