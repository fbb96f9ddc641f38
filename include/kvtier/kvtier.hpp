// kvtier/kvtier.hpp: umbrella header for every part of kvtier that needs only the
// standard library and xxHash. Parts with optional dependencies have their own
// headers and targets: kvtier/resp/asio_connection.hpp (kvtier::asio),
// kvtier/resp/uring_connection.hpp (kvtier::uring), kvtier/comm/nccl.hpp (kvtier::nccl),
// kvtier/cuda/*.hpp and kvtier/cuda/kv_copy.cuh (kvtier::cuda).
//
//   #include <kvtier/kvtier.hpp>
//   kvtier::chunker<> chunk(kvtier::key_namespace{.model = "m", .kv_format = "fp8"});
#pragma once

// pure primitives
#include "kvtier/chunk_status.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"

// the engine's KV in its own layout: layouts, gather/scatter, host paged cache, staging
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"
#include "kvtier/pinned_arena.hpp"

// stores and the fetch queue
#include "kvtier/fetch_queue.hpp"
#include "kvtier/fetch_types.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/rank_view.hpp"
#include "kvtier/store/remote_store.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "kvtier/store/value_header.hpp"

// RESP protocol (sans-io codec, URLs, transport-neutral connection)
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/encoder.hpp"
#include "kvtier/resp/parser.hpp"
#include "kvtier/resp/types.hpp"
#include "kvtier/resp/url.hpp"

// collectives and the load protocol
#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/checked.hpp"
#include "kvtier/comm/communicator.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/comm/recover.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/deployment_check.hpp"
