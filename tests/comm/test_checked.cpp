// checked<C>: every call is verified across ranks before it runs, so mismatches are
// reported (naming both calls) by the decorator itself, whatever the backend.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/checked.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"

using namespace kvtier;
using namespace kvtier::comm;
using namespace std::chrono_literals;

static_assert(communicator<checked<inproc_communicator>>);

namespace {
deadline soon() { return deadline_after(10s); }

struct rank_out {
  std::error_code ec;
  std::string msg;
  std::vector<std::byte> data;
};
}  // namespace

TEST_CASE("checked: matching calls run unchanged", "[unit]") {
  inproc_world world(3);
  std::vector<rank_out> out(3);
  run_ranks(world, [&](inproc_communicator& c0) {
    checked c(std::move(c0));
    const rank_t r = c.rank();
    std::vector<std::byte> a(6, static_cast<std::byte>(r + 1)), b(6, static_cast<std::byte>(0x40 + r)),
        all(18);
    std::uint64_t v = 10 + r;
    std::error_code ec = c.broadcast(a, a, 2, soon());
    if (!ec) ec = all_reduce_value(c, v, reduce_op::sum, soon());
    if (!ec) ec = c.group_start();
    if (!ec) ec = c.all_gather(b, all, soon());
    if (!ec) ec = c.group_end(soon());
    out[r].ec = ec;
    out[r].data = a;
    out[r].data.insert(out[r].data.end(), all.begin(), all.end());
    out[r].data.push_back(static_cast<std::byte>(v));
  });
  for (const auto& o : out) {
    CHECK(!o.ec);
    CHECK(o.data[0] == std::byte{3});
    CHECK(o.data[6] == std::byte{0x40});
    CHECK(o.data[6 + 17] == std::byte{0x42});
    CHECK(o.data.back() == std::byte{33});
  }
}

TEST_CASE("checked: a mismatch is caught before the collective, naming both calls", "[unit]") {
  inproc_world world(3);
  std::vector<rank_out> out(3);
  std::vector<std::vector<collective_call>> inner_calls(3);
  run_ranks(world, [&](inproc_communicator& c0) {
    checked<recording<inproc_communicator>> c(recording<inproc_communicator>(std::move(c0)));
    std::vector<std::byte> a(16);
    out[c.rank()].ec = c.broadcast(a, a, c.rank() == 2 ? 1 : 0, soon());
    out[c.rank()].msg = c.last_error();
    inner_calls[c.rank()] = c.inner().calls();
  });
  for (rank_t r = 0; r < 3; ++r) {
    CHECK(out[r].ec == errc::collective_mismatch);
    CHECK(out[r].msg ==
          "collective mismatch: rank 0 called broadcast(root=0, bytes=16) but rank 2 called "
          "broadcast(root=1, bytes=16)");
    REQUIRE(inner_calls[r].size() == 1u);  // only the check ran on the inner communicator
    CHECK(inner_calls[r][0].op == op_kind::all_reduce);
  }
}

TEST_CASE("checked: groups with different operations are mismatches", "[unit]") {
  inproc_world world(2);
  std::vector<rank_out> out(2);
  run_ranks(world, [&](inproc_communicator& c0) {
    checked c(std::move(c0));
    std::vector<std::byte> a(4), b(4);
    (void)c.group_start();
    (void)c.broadcast(a, a, 0, soon());
    (void)c.broadcast(b, b, c.rank(), soon());
    out[c.rank()].ec = c.group_end(soon());
    out[c.rank()].msg = c.last_error();
  });
  for (const auto& o : out) {
    CHECK(o.ec == errc::collective_mismatch);
    CHECK(o.msg.find("group(2 ops)") != std::string::npos);
    CHECK(o.msg.find("ops hash") != std::string::npos);
  }
}

TEST_CASE("checked: group ops that differ only where root and size bits overlap are still mismatches",
          "[unit]") {
  // broadcast(root=1, B) and broadcast(root=0, B ^ 2^20) once hashed alike (root was
  // XORed in at bit 20 of the size), so the check passed and only the backend could
  // notice: NCCL would have hung until the deadline. 12.4 MB chunks have bit 20 set.
  constexpr std::size_t big = 12'400'000, other = big ^ (std::size_t{1} << 20);
  inproc_world world(2);
  std::vector<rank_out> out(2);
  std::vector<std::vector<collective_call>> inner_calls(2);
  run_ranks(world, [&](inproc_communicator& c0) {
    checked<recording<inproc_communicator>> c(recording<inproc_communicator>(std::move(c0)));
    const bool zero = c.rank() == 0;
    std::vector<std::byte> a(zero ? big : other);
    (void)c.group_start();
    (void)c.broadcast({}, a, zero ? 1 : 0, soon());
    out[c.rank()].ec = c.group_end(soon());
    out[c.rank()].msg = c.last_error();
    inner_calls[c.rank()] = c.inner().calls();
  });
  for (rank_t r = 0; r < 2; ++r) {
    CHECK(out[r].ec == errc::collective_mismatch);
    CHECK(out[r].msg.rfind("collective mismatch: rank 0 called group(1 ops)", 0) == 0);
    CHECK(inner_calls[r].size() == 1u);  // only the check ran on the inner communicator
  }
}

TEST_CASE("checked: chunk_broadcast through the checker issues the same collectives, each checked once",
          "[unit]") {
  const rank_t W = 4;
  const std::size_t N = 12, CB = 8;
  const modulo_ownership own(W);
  for (auto mode : {broadcast_mode::per_chunk, broadcast_mode::grouped, broadcast_mode::gathered}) {
    inproc_world world(W);
    std::vector<std::byte> src(N * CB);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i);
    std::vector<std::vector<std::byte>> dst(W, std::vector<std::byte>(N * CB));
    std::vector<std::vector<std::byte>> staging(W,
                                                std::vector<std::byte>(gathered_staging_bytes(own, N, CB)));
    std::vector<broadcast_result> res(W);
    std::vector<std::size_t> outer(W), inner(W);
    run_ranks(world, [&](inproc_communicator& c0) {
      recording<checked<recording<inproc_communicator>>> c{
          checked<recording<inproc_communicator>>(recording<inproc_communicator>(std::move(c0)))};
      const rank_t r = c.rank();
      chunk_span_buffers b;
      for (std::size_t k = 0; k < N; ++k) {
        b.sources.push_back(std::span<const std::byte>(src).subspan(k * CB, CB));
        b.destinations.push_back(std::span<std::byte>(dst[r]).subspan(k * CB, CB));
      }
      broadcast_params p{.n_chunks = N,
                         .chunk_tokens = 16,
                         .chunk_bytes = CB,
                         .mode = mode,
                         .staging = staging[r],
                         .request_id = 1};
      res[r] = chunk_broadcast(c, own, N * 16, b, p, soon());
      outer[r] = collective_count(c.calls());
      inner[r] = collective_count(c.inner().inner().calls());
    });
    for (rank_t r = 0; r < W; ++r) {
      CHECK(!res[r].ec);
      CHECK(dst[r] == src);
      CHECK(outer[r] == expected_collectives(mode, own, N));
      CHECK(inner[r] == 2 * outer[r]);
    }
  }
}

TEST_CASE(
    "checked: an empty group against a non-empty one is a mismatch on every rank, later calls stay aligned",
    "[unit]") {
  inproc_world world(2);
  std::vector<rank_out> out(2);
  std::vector<std::error_code> next(2), empty_both(2);
  std::vector<std::uint64_t> sums(2);
  run_ranks(world, [&](inproc_communicator& c0) {
    checked c(std::move(c0));
    const rank_t r = c.rank();
    std::vector<std::byte> a(8);
    (void)c.group_start();
    if (r == 1) (void)c.broadcast(a, a, 0, soon());  // rank 0's group stays empty
    out[r].ec = c.group_end(soon());
    out[r].msg = c.last_error();
    std::uint64_t v = 1 + r;  // the next collective pairs with the peer's next one
    next[r] = all_reduce_value(c, v, reduce_op::sum, soon());
    sums[r] = v;
    (void)c.group_start();  // empty on both ranks: checked, then nothing issued
    empty_both[r] = c.group_end(soon());
  });
  for (rank_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << out[r].msg);
    CHECK(out[r].ec == errc::collective_mismatch);
    CHECK(out[r].msg == "collective mismatch: rank 0 called group(0 ops) but rank 1 called group(1 ops)");
    CHECK(!next[r]);
    CHECK(sums[r] == 3u);
    CHECK(!empty_both[r]);
  }
}
