// NCCL backend: compiles and links wherever CUDA + NCCL are installed; the cases
// that need a GPU skip with a message when cudaGetDeviceCount reports none.
#include <chrono>
#include <cstdint>
#include <iostream>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/checked.hpp"
#include "kvtier/comm/nccl.hpp"
#include "kvtier/comm/recording.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

static_assert(comm::communicator<comm::nccl_communicator>);
static_assert(comm::communicator<comm::recording<comm::nccl_communicator>>);
static_assert(comm::communicator<comm::checked<comm::nccl_communicator>>);

namespace {
bool have_gpu() {
  const int n = comm::cuda_device_count();
  if (n == 0) WARN("SKIPPED: no CUDA device (cudaGetDeviceCount reports none); NCCL GPU cases not run");
  return n > 0;
}
}  // namespace

TEST_CASE("nccl: an unusable communicator reports errors instead of crashing", "[unit]") {
  comm::nccl_communicator c;  // never created
  std::vector<std::byte> b(4);
  CHECK(c.broadcast(b, b, 0, deadline_after(1s)) == errc::backend_error);
  std::uint64_t v = 0;
  CHECK(comm::all_reduce_value(c, v, comm::reduce_op::min, deadline_after(1s)) == errc::backend_error);
  CHECK(!c.last_error().empty());
}

TEST_CASE("nccl: one-rank communicator runs collectives and the load protocol", "[unit]") {
  if (!have_gpu()) return;
  ncclUniqueId id;
  REQUIRE(!comm::nccl_unique_id(id));
  comm::nccl_communicator c;
  auto ec = comm::nccl_communicator::create(c, id, 0, 1, 0, deadline_after(60s));
  INFO(c.last_error());
  REQUIRE(!ec);

  std::uint64_t v = 41;
  REQUIRE(!comm::all_reduce_value(c, v, comm::reduce_op::sum, deadline_after(10s)));
  CHECK(v == 41u);

  const std::size_t n = 8, cb = 4096;
  std::vector<std::byte> host(n * cb);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>(i * 13 + 1);
  comm::device_buffer src(n * cb), dst(n * cb);
  modulo_ownership own(1);
  comm::device_buffer staging(gathered_staging_bytes(own, n, cb));
  REQUIRE(src);
  REQUIRE(dst);
  REQUIRE(cudaMemcpy(src.data(), host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  // cudaMemcpy from pageable memory and cudaMemset may return before the device
  // finished them, on the legacy stream, which the communicator's non-blocking
  // stream does not wait for: synchronise before the collectives read the buffers.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  for (auto mode : {broadcast_mode::per_chunk, broadcast_mode::grouped, broadcast_mode::gathered}) {
    REQUIRE(cudaMemset(dst.data(), 0, dst.size()) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    chunk_span_buffers b;
    for (std::size_t k = 0; k < n; ++k) {
      b.sources.push_back(std::span<const std::byte>(src.bytes()).subspan(k * cb, cb));
      b.destinations.push_back(dst.bytes().subspan(k * cb, cb));
    }
    broadcast_params p{.n_chunks = n,
                       .chunk_tokens = 256,
                       .chunk_bytes = cb,
                       .mode = mode,
                       .staging = staging.bytes(),
                       .request_id = 1};
    auto r = chunk_broadcast(c, own, 6 * 256, b, p, deadline_after(30s));  // 6 of 8 chunks loaded
    INFO(r.message);
    REQUIRE(!r.ec);
    CHECK(r.agreed_chunks == 6u);
    std::vector<std::byte> back(n * cb);
    REQUIRE(cudaMemcpy(back.data(), dst.data(), back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::equal(host.begin(), host.begin() + 6 * cb, back.begin()));
    CHECK(std::all_of(back.begin() + 6 * cb, back.end(), [](std::byte x) { return x == std::byte{0}; }));

    // Pipelined: 3 chunks loaded, then 6 with the fetch finished.
    REQUIRE(cudaMemset(dst.data(), 0, dst.size()) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    pipelined_broadcast pb(c, own, b, p);
    pb.step(3 * 256, false, deadline_after(30s));
    pb.step(6 * 256, true, deadline_after(30s));
    INFO(pb.result().message);
    CHECK(pb.done());
    CHECK(!pb.result().ec);
    CHECK(pb.agreed_chunks() == 6u);
    REQUIRE(cudaMemcpy(back.data(), dst.data(), back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::equal(host.begin(), host.begin() + 6 * cb, back.begin()));
  }
}
