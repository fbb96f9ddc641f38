// python/src/connector_impl.hpp: the C++ side of kvtier.KvCacheView and the communicators that
// kvtier.Connector takes. A view holds the Python page objects (tensors or buffers), their buffer
// views and an alias of each page tensor (the same storage), so the pages' memory lives as long as
// the view and every connector that holds it, even if a page tensor is moved onto other memory
// (set_) meanwhile: the connector's mover and saver threads write and read it at any time.
//
//   auto v = std::make_shared<kvtier_py::py_view>();
//   v->view = kvtier::kv_cache_view::per_layer(layout, ptrs);   // ptrs from bytes_of(page)
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "common.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/kv_layout.hpp"
#if defined(KVTIER_PY_HAS_MPI)
#include "kvtier/comm/mpi.hpp"
#endif

namespace kvtier_py {

/// A kv_cache_view over Python pages; `hold` keeps the pages' memory (buffer views, storage aliases).
struct py_view {
  kvtier::kv_cache_view view;
  buffer_hold hold;
};

/// One rank of an in-process world (threads); keeps the world alive.
struct py_inproc_comm {
  std::shared_ptr<kvtier::comm::inproc_world> world;
  std::unique_ptr<kvtier::comm::inproc_communicator> comm;
};

#if defined(KVTIER_PY_HAS_MPI)
/// kvtier's duplicate of an mpi4py communicator.
struct py_mpi_comm {
  kvtier::comm::mpi_communicator comm;
};
#endif

}  // namespace kvtier_py
