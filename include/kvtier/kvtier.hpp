// kvtier/kvtier.hpp: umbrella header for the parts of kvtier that need only the
// standard library and xxHash. Transports with optional dependencies have their
// own headers (kvtier/resp/asio_*.hpp, kvtier/resp/uring_*.hpp, kvtier/comm/nccl.hpp).
#pragma once

#include "kvtier/chunker.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/chunk_store.hpp"
