"""kvtier.Connector at W = 2 MPI processes (mpiexec) on kvtier.MpiCommunicator from mpi4py's
MPI.COMM_WORLD, each rank against its own real redis-server: the lifecycle byte for byte, and a
rank whose store is gone shortening both ranks' load alike."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import kvtier
from connector_rig import PROMPT
from redis_server import Server

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None or not hasattr(kvtier, "MpiCommunicator"),
                                reason="no mpiexec or the module has no MpiCommunicator (mpi4py headers)")


def run(*extra):
    out = tempfile.mkdtemp(prefix="kvtier-py-conn-")
    a, b = Server(), Server()
    try:
        cmd = ["mpiexec", "-n", "2", "--oversubscribe", "--allow-run-as-root", sys.executable,
               os.path.join(HERE, "connector_mpi_rank.py"), "--urls", f"{a.url},{b.url}",
               "--out", os.path.join(out, "r.json"), *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=150,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        res = [json.load(open(os.path.join(out, f"r.json.{r}"))) for r in (0, 1)]
    finally:
        a.stop()
        b.stop()
        shutil.rmtree(out)
    return res


@pytest.mark.parametrize("extra", [(), ("--separate-data",)])
def test_lifecycle_two_processes_byte_for_byte(extra):
    for r, x in enumerate(run(*extra)):
        assert x["comm"] == [r, 2]
        assert x["cold_cached"] == 0
        assert x["events"] == [["stored", r, 2]]
        assert x["warm_plan"] == [PROMPT, 0, PROMPT]
        assert x["loaded"] == [0, PROMPT, PROMPT]
        assert x["load_errors"] == []
        assert x["wrong_loaded"] == 0
        assert x["two_steps"]  # wait_local, then two steps on both processes: the load agreed
        assert x["counters"]["tokens_loaded"] == PROMPT and x["counters"]["agreement_failures"] == 0


def test_a_rank_without_its_server_shortens_both_alike():
    for x in run("--drop-rank", "1"):
        assert x["warm_plan"] == [32, 0, 32]
        assert x["loaded"] == [0, 32, 32]
        assert x["wrong_loaded"] == 0
