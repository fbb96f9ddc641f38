"""Fixtures of the kvtier Python tests: real redis-server processes (redis_server.Server)."""
import os

import pytest

from redis_server import REDIS, Cluster, Pki, Server


@pytest.fixture
def redis_server():
    if not os.access(REDIS, os.X_OK):
        pytest.fail(REDIS + " is missing: install redis-server (scripts/install_deps.sh)")
    srv = Server()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def two_redis_servers():
    a, b = Server(), Server()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture(scope="module")
def pki():
    p = Pki()
    try:
        yield p
    finally:
        p.remove()


@pytest.fixture
def tls_redis_server(pki):
    srv = Server(tls_args=pki.server_args())
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def redis_cluster():
    c = Cluster(3)
    try:
        yield c
    finally:
        c.stop()
