"""One MPI process of test_connector_mpi: kvtier.Connector on kvtier.MpiCommunicator (made from
MPI.COMM_WORLD) against this rank's own redis-server; writes what it saw to <out>.<rank>.

    mpiexec -n 2 python3 connector_mpi_rank.py --urls resp://...,resp://... --out /tmp/r.json [--drop-rank 1]
"""
import argparse
import json
import sys

from mpi4py import MPI

import kvtier
from connector_rig import namespace, run_rank


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--urls", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--drop-rank", type=int, default=-1)
    ap.add_argument("--separate-data", action="store_true")
    a = ap.parse_args()
    rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    comm = kvtier.MpiCommunicator(MPI.COMM_WORLD, 10.0)
    data = kvtier.MpiCommunicator(MPI.COMM_WORLD, 10.0) if a.separate_data else None
    store = kvtier.RemoteStore(a.urls.split(",")[rank], namespace(world), connect_timeout=2.0)
    try:
        res = run_rank(comm, store, data=data, tamper=store.close if rank == a.drop_rank else None)
        res["comm"] = (comm.rank, comm.size)
    finally:
        store.close()
    with open(f"{a.out}.{rank}", "w") as f:
        json.dump(res, f)
    del comm, data  # freed before mpi4py finalizes MPI
    return 0


if __name__ == "__main__":
    sys.exit(main())
