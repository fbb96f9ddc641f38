// python/src/bind_mpi.cpp: kvtier.MpiCommunicator, kvtier's duplicate of an mpi4py communicator
// (mpi4py's C API: PyMPIComm_Get), for one connector per MPI process. Built where kvtier::mpi
// and mpi4py's headers are found.
#include <pybind11/pybind11.h>

#include <mpi4py/mpi4py.h>

#include "connector_impl.hpp"

namespace kvtier_py {

void bind_mpi(py::module_& m) {
  py::class_<py_mpi_comm, std::shared_ptr<py_mpi_comm>>(
      m, "MpiCommunicator",
      "kvtier's duplicate of an mpi4py communicator (collective over its ranks, by `deadline`). MPI must be "
      "initialised with at least MPI_THREAD_SERIALIZED (mpi4py's default is MULTIPLE). Close it (and its "
      "connectors) before MPI finalizes.\n\n"
      "    from mpi4py import MPI\n"
      "    comm = kvtier.MpiCommunicator(MPI.COMM_WORLD, 10.0)")
      .def(py::init([](py::handle comm, py::handle deadline) {
             if (import_mpi4py() < 0) throw py::error_already_set();
             if (comm.is_none() || !PyObject_TypeCheck(comm.ptr(), &PyMPIComm_Type))
               raise_invalid("comm must be an mpi4py MPI.Comm (e.g. MPI.COMM_WORLD), not " + type_name(comm));
             MPI_Comm* parent = PyMPIComm_Get(comm.ptr());
             if (parent == nullptr) throw py::error_already_set();
             if (*parent == MPI_COMM_NULL) raise_invalid("comm is MPI.COMM_NULL");
             const kvtier::deadline dl = deadline_of(deadline);
             auto c = std::make_shared<py_mpi_comm>();
             std::error_code ec;
             {
               py::gil_scoped_release nogil;
               ec = kvtier::comm::mpi_communicator::create(c->comm, *parent, dl);
             }
             if (ec) raise_error(ec, "MpiCommunicator: " + c->comm.last_error());
             return c;
           }),
           py::arg("comm"), py::arg("deadline") = 10.0)
      .def_property_readonly("rank", [](const py_mpi_comm& c) { return c.comm.rank(); })
      .def_property_readonly("size", [](const py_mpi_comm& c) { return c.comm.size(); })
      .def(
          "last_error", [](const py_mpi_comm& c) { return c.comm.last_error(); },
          "The last collective's error text ('' if none).");
}

}  // namespace kvtier_py
