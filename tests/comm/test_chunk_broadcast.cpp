// chunk_broadcast on the in-process backend: collective counts for a 16k-token
// prompt, partial loads, symmetric failures. Short; also run under TSan.
#include <chrono>
#include <cstdint>
#include <iostream>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "comm/faulty.hpp"
#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "support/deadline_check.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

struct world_run {
  std::vector<broadcast_result> results;
  std::vector<std::vector<comm::collective_call>> calls;
  std::vector<std::vector<std::byte>> dst;
  std::vector<std::byte> src;
};

// Runs chunk_broadcast on W ranks; rank r loaded loaded_owned[r] of its owned chunks.
// `tweak(rank, params)` lets a test corrupt one rank's arguments.
template <ownership_policy P, class Tweak>
world_run run(const P& own, std::size_t n, std::size_t chunk_bytes, broadcast_mode mode,
              const std::vector<std::size_t>& loaded_owned, Tweak tweak, deadline dl = deadline_after(20s)) {
  const rank_t W = own.world_size();
  world_run out;
  out.results.resize(W);
  out.calls.resize(W);
  out.dst.assign(W, std::vector<std::byte>(n * chunk_bytes, std::byte{0xEE}));
  out.src.resize(n * chunk_bytes);
  for (std::size_t i = 0; i < out.src.size(); ++i) out.src[i] = static_cast<std::byte>(i * 131 + 7);
  std::vector<std::vector<std::byte>> staging(
      W, std::vector<std::byte>(gathered_staging_bytes(own, n, chunk_bytes)));
  comm::inproc_world world(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c0) {
    comm::recording c(std::move(c0));
    const rank_t r = c.rank();
    chunk_span_buffers b;
    for (std::size_t k = 0; k < n; ++k) {
      b.sources.push_back(std::span<const std::byte>(out.src).subspan(k * chunk_bytes, chunk_bytes));
      b.destinations.push_back(std::span<std::byte>(out.dst[r]).subspan(k * chunk_bytes, chunk_bytes));
    }
    broadcast_params p{.n_chunks = n,
                       .chunk_tokens = 256,
                       .chunk_bytes = chunk_bytes,
                       .mode = mode,
                       .staging = staging[r],
                       .request_id = 1};
    std::uint64_t loaded = rank_answer_loaded(own, r, n, 256, loaded_owned[r]);
    if (!tweak(r, p, loaded)) return;  // this rank never joins
    out.results[r] = chunk_broadcast(c, own, loaded, b, p, dl);
    out.calls[r] = c.calls();
  });
  return out;
}

auto no_tweak = [](rank_t, broadcast_params&, std::uint64_t&) { return true; };

constexpr broadcast_mode all_modes[] = {broadcast_mode::per_chunk, broadcast_mode::grouped,
                                        broadcast_mode::gathered};

}  // namespace

TEST_CASE("chunk_broadcast: collective count per load for a 16k-token prompt (64 chunks, W = 8)", "[unit]") {
  const modulo_ownership own(8);
  const std::vector<std::size_t> everything(8, 64);
  std::size_t counts[3] = {};
  for (int m = 0; m < 3; ++m) {
    auto out = run(own, 64, 64, all_modes[m], everything, no_tweak);
    for (rank_t r = 0; r < 8; ++r) {
      REQUIRE(!out.results[r].ec);
      REQUIRE(out.results[r].agreed_tokens == 16384u);
      REQUIRE(out.calls[r] == out.calls[0]);
      REQUIRE(out.dst[r] == out.src);
    }
    counts[m] = comm::collective_count(out.calls[0]);
    REQUIRE(counts[m] == out.results[0].collectives);
  }
  std::cout << "collectives per load, 16384 tokens, 64 chunks, W=8: per_chunk=" << counts[0]
            << " grouped=" << counts[1] << " gathered=" << counts[2] << "\n";
  CHECK(counts[0] == 64 + 1);
  CHECK(counts[1] == 8 + 1);
  CHECK(counts[2] == 2);
  CHECK(counts[1] <= 8 + 1);
  CHECK(counts[2] <= 8 + 1);
}

TEST_CASE("chunk_broadcast: batched modes stay within W + 1 collectives for every ownership policy",
          "[unit]") {
  const block_interleave_ownership block(8, 3);
  const rendezvous_ownership hrw(8, 42);
  const std::vector<std::size_t> everything(8, 64);
  for (auto mode : {broadcast_mode::grouped, broadcast_mode::gathered}) {
    auto a = run(block, 64, 8, mode, everything, no_tweak);
    auto b = run(hrw, 64, 8, mode, everything, no_tweak);
    CHECK(comm::collective_count(a.calls[0]) <= 9u);
    CHECK(comm::collective_count(b.calls[0]) <= 9u);
    CHECK(a.dst[5] == a.src);
    CHECK(b.dst[5] == b.src);
  }
}

TEST_CASE("chunk_broadcast: a rank cut short limits the agreed prefix; nothing past it is written",
          "[unit]") {
  const modulo_ownership own(8);
  std::vector<std::size_t> loaded(8, 64);
  loaded[3] = 2;  // rank 3 loaded chunks 3 and 11, then its fetch timed out before chunk 19
  for (auto mode : all_modes) {
    auto out = run(own, 64, 16, mode, loaded, no_tweak);
    for (rank_t r = 0; r < 8; ++r) {
      REQUIRE(!out.results[r].ec);
      CHECK(out.results[r].agreed_chunks == 19u);
      CHECK(out.results[r].agreed_tokens == 19u * 256);
      CHECK(out.calls[r] == out.calls[0]);
      CHECK(std::equal(out.src.begin(), out.src.begin() + 19 * 16, out.dst[r].begin()));
      CHECK(std::all_of(out.dst[r].begin() + 19 * 16, out.dst[r].end(),
                        [](std::byte b) { return b == std::byte{0xEE}; }));
    }
  }
}

TEST_CASE("chunk_broadcast: a rank with no hits reports its first owned chunk, not 0", "[unit]") {
  const modulo_ownership own(4);
  CHECK(rank_answer_loaded(own, 1, 16, 256, 0) == 256u);
  CHECK(rank_answer_loaded(own, 1, 16, 256, 4) == 16u * 256);
  CHECK(rank_answer_loaded(own, 3, 2, 256, 0) == 2u * 256);  // owns nothing among 2 chunks
  std::vector<std::size_t> loaded{16, 0, 16, 16};
  auto out = run(own, 16, 4, broadcast_mode::grouped, loaded, no_tweak);
  for (const auto& r : out.results) CHECK(r.agreed_chunks == 1u);
}

TEST_CASE("chunk_broadcast: inconsistent arguments fail on every rank at the agreement", "[unit]") {
  const modulo_ownership own(4);
  const std::vector<std::size_t> all(4, 8);
  SECTION("one rank passes a different chunk count") {
    auto out =
        run(own, 8, 4, broadcast_mode::per_chunk, all, [](rank_t r, broadcast_params& p, std::uint64_t&) {
          if (r == 2) p.n_chunks = 7;
          return true;
        });
    for (const auto& r : out.results) {
      CHECK(r.ec == errc::invalid_argument);
      CHECK(r.agreed_tokens == 0u);
      CHECK(r.collectives == 1u);
    }
    for (const auto& c : out.calls) CHECK(c == out.calls[0]);
  }
  SECTION("one rank is a load behind (another request id), same shapes") {
    auto out =
        run(own, 8, 4, broadcast_mode::per_chunk, all, [](rank_t r, broadcast_params& p, std::uint64_t&) {
          p.request_id = r == 3 ? 41 : 42;
          return true;
        });
    for (rank_t r = 0; r < 4; ++r) {
      CHECK(out.results[r].ec == errc::invalid_argument);
      CHECK(out.results[r].agreed_tokens == 0u);
      for (std::byte b : out.dst[r]) REQUIRE(b == std::byte{0xEE});  // nothing written
    }
    for (const auto& c : out.calls) CHECK(c == out.calls[0]);
  }
  SECTION("one rank's staging buffer is too small") {
    auto out =
        run(own, 8, 4, broadcast_mode::gathered, all, [](rank_t r, broadcast_params& p, std::uint64_t&) {
          if (r == 0) p.staging = p.staging.first(3);
          return true;
        });
    for (const auto& r : out.results) CHECK(r.ec == errc::invalid_argument);
    CHECK(out.results[0].message.find("staging") != std::string::npos);
  }
}

TEST_CASE("gathered_staging_bytes saturates instead of wrapping, so the staging check holds", "[unit]") {
  // W * (largest owner share) * chunk_bytes = 4 * 1 * 2^62 = 2^64 once wrapped to 0:
  // every staging buffer, even an empty one, passed the size check.
  const modulo_ownership own(4);
  const std::size_t huge = std::size_t{1} << 62;
  CHECK(gathered_staging_bytes(own, 4, huge) == SIZE_MAX);
  CHECK(gathered_staging_bytes(own, 64, std::size_t{1} << 59) == SIZE_MAX);  // 4 * 16 * 2^59
  CHECK(gathered_staging_bytes(own, 8, 100) == 4u * 2 * 100);
  std::vector<broadcast_result> res(4);
  comm::inproc_world world(4);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    chunk_span_buffers none;
    const broadcast_params p{.n_chunks = 4,
                             .chunk_tokens = 256,
                             .chunk_bytes = huge,
                             .mode = broadcast_mode::gathered,
                             .request_id = 1};  // empty staging
    res[c.rank()] = chunk_broadcast(c, own, 0, none, p, deadline_after(20s));
  });
  for (const auto& r : res) {
    CHECK(r.ec == errc::invalid_argument);
    CHECK(r.message.find("staging") != std::string::npos);
  }
}

TEST_CASE("chunk_broadcast: a rank that never joins makes the others return by their deadline", "[unit]") {
  const modulo_ownership own(3);
  const std::vector<std::size_t> all(3, 8);
  const auto dl = deadline_after(200ms);
  auto out = run(
      own, 8, 4, broadcast_mode::per_chunk, all,
      [](rank_t r, broadcast_params&, std::uint64_t&) { return r != 1; }, dl);
  CHECK(kvtier::test::returned_by(dl));
  for (rank_t r : {0u, 2u}) {
    CHECK(out.results[r].ec == errc::timeout);
    CHECK(out.results[r].agreed_tokens == 0u);
    CHECK(out.results[r].message.find("missing {1}") != std::string::npos);
    CHECK(
        std::all_of(out.dst[r].begin(), out.dst[r].end(), [](std::byte b) { return b == std::byte{0xEE}; }));
  }
}

TEST_CASE("pipelined_broadcast: stages follow the fetch; every rank ends on the same prefix", "[unit]") {
  // 16k-token prompt, W = 8; every rank's fetch delivers 2 owned chunks per step, but
  // rank 5 stops after 5 (its 6th owned chunk, chunk 45, was evicted).
  const rank_t W = 8;
  const std::size_t N = 64, CB = 32;
  const modulo_ownership own(W);
  for (auto mode : all_modes) {
    std::vector<std::byte> src(N * CB);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
    std::vector<std::vector<std::byte>> dst(W, std::vector<std::byte>(N * CB, std::byte{0xEE}));
    std::vector<std::vector<std::byte>> staging(W,
                                                std::vector<std::byte>(gathered_staging_bytes(own, N, CB)));
    std::vector<broadcast_result> res(W);
    std::vector<std::vector<std::size_t>> stages(W);
    std::vector<std::vector<comm::collective_call>> calls(W);
    comm::inproc_world world(W);
    comm::run_ranks(world, [&](comm::inproc_communicator& c0) {
      comm::recording c(std::move(c0));
      const rank_t r = c.rank();
      chunk_span_buffers b;
      for (std::size_t k = 0; k < N; ++k) {
        b.sources.push_back(std::span<const std::byte>(src).subspan(k * CB, CB));
        b.destinations.push_back(std::span<std::byte>(dst[r]).subspan(k * CB, CB));
      }
      pipelined_broadcast pb(c, own, b,
                             {.n_chunks = N,
                              .chunk_tokens = 256,
                              .chunk_bytes = CB,
                              .mode = mode,
                              .staging = staging[r],
                              .request_id = 1});
      const std::size_t final_loaded = r == 5 ? 5 : 8;
      for (std::size_t s = 1; !pb.done() && s <= 10; ++s) {
        const std::size_t have = std::min<std::size_t>(2 * s, final_loaded);
        pb.step(rank_answer_loaded(own, r, N, 256, have), have == final_loaded, deadline_after(20s));
        stages[r].push_back(pb.agreed_chunks());
      }
      res[r] = pb.result();
      calls[r] = c.calls();
    });
    for (rank_t r = 0; r < W; ++r) {
      INFO("mode " << to_string(mode) << " rank " << r);
      CHECK(!res[r].ec);
      CHECK(res[r].agreed_chunks == 45u);  // chunk 45 = rank 5's 6th owned chunk
      CHECK(stages[r] == std::vector<std::size_t>{16, 32, 45});
      CHECK(calls[r] == calls[0]);
      CHECK(res[r].collectives == comm::collective_count(calls[r]));
      CHECK(std::equal(src.begin(), src.begin() + 45 * CB, dst[r].begin()));
      CHECK(std::all_of(dst[r].begin() + 45 * CB, dst[r].end(),
                        [](std::byte x) { return x == std::byte{0xEE}; }));
    }
  }
}

// broadcast_params::request_id has no default: a parameter set that omits it does
// not compile (it used to default to 0, silently turning the one-load-behind guard off).
template <class P>
concept omits_request_id_ok = requires {
  P{.n_chunks = 1, .chunk_tokens = 16, .chunk_bytes = 8};
};
static_assert(!omits_request_id_ok<broadcast_params>);
static_assert(!std::is_default_constructible_v<load_id>);
static_assert(requires {
  broadcast_params{.n_chunks = 1, .chunk_tokens = 16, .chunk_bytes = 8, .request_id = 7};
});

namespace {
// Claims that its rounds do not fail together, so the protocol adds its confirmation
// (the path MPI and NCCL take) while running on the in-process backend.
struct not_atomic : comm::inproc_communicator {
  static constexpr bool rounds_fail_together = false;
  explicit not_atomic(comm::inproc_communicator c) : comm::inproc_communicator(std::move(c)) {}
};
}  // namespace

// Runs the control/data form with a control world of type Ctrl (in-process, or
// not_atomic to take the confirmation path) and checks where each collective went.
template <class Ctrl>
void check_control_data(broadcast_mode mode) {
  constexpr bool confirm = !comm::rounds_fail_together<Ctrl>;
  const modulo_ownership own(4);
  const std::size_t n = 12, cb = 32;
  std::vector<std::byte> src(n * cb);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 3);
  comm::inproc_world ctrl_world(4), data_world(4);
  std::vector<std::vector<std::byte>> dst(4, std::vector<std::byte>(n * cb, std::byte{0xEE}));
  std::vector<broadcast_result> res(4);
  std::vector<std::vector<comm::collective_call>> ctrl_calls(4), data_calls(4);
  std::vector<std::uint64_t> after(4, 0);
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c0) {
    const rank_t r = c0.rank();
    comm::recording<Ctrl> ctrl{Ctrl(std::move(c0))};
    comm::recording<comm::inproc_communicator> data(data_world.communicator_for(r));
    std::vector<std::byte> staging(gathered_staging_bytes(own, n, cb));
    chunk_span_buffers b;
    for (std::size_t k = 0; k < n; ++k) {
      b.sources.push_back(std::span<const std::byte>(src).subspan(k * cb, cb));
      b.destinations.push_back(std::span<std::byte>(dst[r]).subspan(k * cb, cb));
    }
    broadcast_params p{.n_chunks = n,
                       .chunk_tokens = 256,
                       .chunk_bytes = cb,
                       .mode = mode,
                       .staging = staging,
                       .request_id = 9};
    // Rank 2 loaded 1 of its 3 chunks: the prefix ends at its second one, chunk 6.
    const auto loaded = rank_answer_loaded(own, r, n, 256, r == 2 ? 1 : 3);
    res[r] = chunk_broadcast(ctrl, data, own, loaded, b, p, deadline_after(20s));
    after[r] = r;
    (void)comm::all_reduce_value(ctrl, after[r], comm::reduce_op::max, deadline_after(20s));
    ctrl_calls[r] = ctrl.calls();
    data_calls[r] = data.calls();
  });
  for (rank_t r = 0; r < 4; ++r) {
    INFO("mode " << to_string(mode) << ", confirm " << confirm << ", rank " << r << ": " << res[r].message);
    REQUIRE(!res[r].ec);
    CHECK(res[r].agreed_chunks == 6u);
    CHECK(std::equal(src.begin(), src.begin() + 6 * cb, dst[r].begin()));
    CHECK(
        std::all_of(dst[r].begin() + 6 * cb, dst[r].end(), [](std::byte x) { return x == std::byte{0xEE}; }));
    CHECK(data_calls[r] == data_calls[0]);
    // ctrl: the agreement, the confirmation where needed, then the follow-up; data: only chunk moves.
    CHECK(comm::collective_count(ctrl_calls[r]) == (confirm ? 3u : 2u));
    CHECK(comm::collective_count(data_calls[r]) == expected_collectives(mode, own, 6) - 1);
    for (const auto& c : data_calls[r]) CHECK(c.op != comm::op_kind::all_reduce);
    CHECK(res[r].collectives == expected_collectives(mode, own, 6, confirm));
    CHECK(after[r] == 3u);
  }
}

TEST_CASE("chunk_broadcast: control/data form agrees on one world and moves bytes on the other", "[unit]") {
  for (auto mode : all_modes) {
    check_control_data<comm::inproc_communicator>(mode);
    check_control_data<not_atomic>(mode);
  }
}

namespace {
// Chunk spans over one source and one destination buffer of n chunks of cb bytes.
chunk_span_buffers span_buffers(const std::vector<std::byte>& src, std::vector<std::byte>& dst, std::size_t n,
                                std::size_t cb) {
  chunk_span_buffers b;
  for (std::size_t k = 0; k < n; ++k) {
    b.sources.push_back(std::span<const std::byte>(src).subspan(k * cb, cb));
    b.destinations.push_back(std::span<std::byte>(dst).subspan(k * cb, cb));
  }
  return b;
}

// The control/data form on 4 ranks whose rounds do not fail together (not_atomic), 8
// chunks of 16 bytes, with `plan` injected into rank 1's data communicator; then one
// more all-reduce on the control world.
struct faulty_data_outcome {
  std::vector<broadcast_result> res = std::vector<broadcast_result>(4);
  std::vector<std::uint64_t> after = std::vector<std::uint64_t>(4, 0);
  std::vector<std::error_code> after_ec = std::vector<std::error_code>(4);
  std::vector<char> fired = std::vector<char>(4),
                    bytes_moved = std::vector<char>(
                        4);  // not vector<bool>: one byte per rank thread (bits of one word race)
};
faulty_data_outcome run_faulty_data(broadcast_mode mode, test::fault_plan plan) {
  const modulo_ownership own(4);
  const std::size_t n = 8, cb = 16;
  std::vector<std::byte> src(n * cb, std::byte{0x42});
  comm::inproc_world ctrl_world(4), data_world(4);
  faulty_data_outcome out;
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c0) {
    const rank_t r = c0.rank();
    not_atomic ctrl(std::move(c0));
    test::faulty<not_atomic> data(not_atomic(data_world.communicator_for(r)),
                                  r == 1 ? plan : test::fault_plan{});
    std::vector<std::byte> dst(n * cb), staging(gathered_staging_bytes(own, n, cb));
    chunk_span_buffers b = span_buffers(src, dst, n, cb);
    broadcast_params p{.n_chunks = n,
                       .chunk_tokens = 256,
                       .chunk_bytes = cb,
                       .mode = mode,
                       .staging = staging,
                       .request_id = 1};
    out.res[r] = chunk_broadcast(ctrl, data, own, n * 256, b, p, deadline_after(20s));
    out.fired[r] = data.fired();
    out.bytes_moved[r] = dst == src;
    out.after[r] = r;
    out.after_ec[r] = comm::all_reduce_value(ctrl, out.after[r], comm::reduce_op::max, deadline_after(20s));
  });
  return out;
}
}  // namespace

TEST_CASE(
    "chunk_broadcast: control/data form, a data failure on one rank fails every rank and keeps control "
    "aligned",
    "[unit]") {
  for (auto mode : all_modes) {
    // Rank 1's data communicator refuses its first move: it never reaches the peers.
    const auto out = run_faulty_data(mode, {.at = 0, .how = test::fault::invalid});
    for (rank_t r = 0; r < 4; ++r) {
      INFO("mode " << to_string(mode) << ", rank " << r << ": " << out.res[r].message);
      CHECK(out.res[r].ec);
      CHECK(out.res[r].agreed_tokens == 0u);
      CHECK(!out.after_ec[r]);  // the control world stayed aligned: its next collective pairs
      CHECK(out.after[r] == 3u);
    }
  }
}

// The final confirmation is what makes a late failure symmetric: the data world's
// rounds do not fail together, and rank 1's last move ran everywhere (every rank has
// the bytes) before rank 1 reported a failure. Only the confirmation's reduced value
// tells ranks 0, 2 and 3 that rank 1 failed; every rank must end with the same result.
TEST_CASE("chunk_broadcast: control/data form, a late failure of one rank's last move fails every rank",
          "[unit]") {
  for (auto mode : all_modes) {
    const std::uint64_t last_move = expected_collectives(mode, modulo_ownership(4), 8) - 2;  // data ones - 1
    const auto out = run_faulty_data(mode, {.at = last_move, .how = test::fault::after});
    CHECK(out.fired[1]);
    for (rank_t r = 0; r < 4; ++r) {
      INFO("mode " << to_string(mode) << ", rank " << r << ": " << out.res[r].message);
      // The move completed: the peers hold rank 1's bytes (rank 1 gave up before unpacking, if gathered).
      if (r != 1) CHECK(out.bytes_moved[r]);
      CHECK(out.res[r].ec);  // rank 1 its own timeout, its peers "another rank failed"
      CHECK(out.res[r].agreed_tokens == 0u);
      CHECK(out.res[r].collectives == out.res[0].collectives);
      CHECK(!out.after_ec[r]);
    }
    CHECK(out.res[0].message == "confirmation: another rank failed to move its chunks");
  }
}

TEST_CASE("chunk_broadcast: a poisoned data communicator keeps its first error (grouped)", "[unit]") {
  const modulo_ownership own(2);
  const std::size_t n = 4, cb = 8;
  std::vector<std::byte> src(n * cb, std::byte{0x11});
  comm::inproc_world ctrl_world(2), data_world(2);
  std::vector<broadcast_result> res(2);
  std::vector<int> misuses(2, -1);
  std::vector<std::string> data_error(2);
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c0) {
    const rank_t r = c0.rank();
    not_atomic ctrl(std::move(c0));
    test::poisoned<comm::inproc_communicator> data(data_world.communicator_for(r), "timeout in request 6");
    std::vector<std::byte> dst(n * cb);
    chunk_span_buffers b = span_buffers(src, dst, n, cb);
    broadcast_params p{.n_chunks = n,
                       .chunk_tokens = 256,
                       .chunk_bytes = cb,
                       .mode = broadcast_mode::grouped,
                       .request_id = 7};
    res[r] = chunk_broadcast(ctrl, data, own, n * 256, b, p, deadline_after(20s));
    misuses[r] = data.misuses();
    data_error[r] = data.last_error();
  });
  for (rank_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << res[r].message);
    CHECK(res[r].ec == errc::backend_error);
    CHECK(res[r].message == "grouped broadcast: poisoned by an earlier failure: timeout in request 6");
    CHECK(misuses[r] == 0);  // never a group_end after the refused group_start
    CHECK(data_error[r] == "poisoned by an earlier failure: timeout in request 6");
  }
}

// confirmed_chunks(): what every rank is known to hold. Where rounds fail together it
// is agreed_chunks(); elsewhere a step's moves are confirmed by the next agreement
// (or, at the end, by the confirmation), so it lags one step.
template <class Comm>
std::vector<std::size_t> confirmed_per_step(std::vector<std::size_t>& agreed) {
  const modulo_ownership own(2);
  const std::size_t n = 8, cb = 8;
  std::vector<std::byte> src(n * cb, std::byte{0x33});
  std::vector<std::vector<std::size_t>> confirmed(2), seen(2);
  comm::inproc_world world(2);
  comm::run_ranks(world, [&](comm::inproc_communicator& c0) {
    Comm c(std::move(c0));
    const rank_t r = c.rank();
    std::vector<std::byte> dst(n * cb);
    chunk_span_buffers b = span_buffers(src, dst, n, cb);
    pipelined_broadcast pb(c, own, b,
                           {.n_chunks = n, .chunk_tokens = 16, .chunk_bytes = cb, .request_id = 4});
    for (std::size_t s = 1; !pb.done() && s <= 4; ++s) {  // 2 owned chunks per step, of 4
      pb.step(rank_answer_loaded(own, r, n, 16, 2 * s), s == 2, deadline_after(20s));
      confirmed[r].push_back(pb.confirmed_chunks());
      seen[r].push_back(pb.agreed_chunks());
    }
  });
  CHECK(confirmed[1] == confirmed[0]);
  agreed = seen[0];
  return confirmed[0];
}

TEST_CASE("pipelined_broadcast: confirmed_chunks lags agreed_chunks where rounds do not fail together",
          "[unit]") {
  std::vector<std::size_t> agreed;
  CHECK(confirmed_per_step<comm::inproc_communicator>(agreed) == std::vector<std::size_t>{4, 8});
  CHECK(agreed == std::vector<std::size_t>{4, 8});
  CHECK(confirmed_per_step<not_atomic>(agreed) == std::vector<std::size_t>{0, 8});
  CHECK(agreed == std::vector<std::size_t>{4, 8});
}

TEST_CASE("chunk_broadcast: sources_ready runs before the agreement; its failure fails every rank there",
          "[unit]") {
  const modulo_ownership own(3);
  for (bool fail_one : {false, true}) {
    std::vector<int> calls(3, 0);
    auto out = run(own, 6, 8, broadcast_mode::grouped, {2, 2, 2},
                   [&](rank_t r, broadcast_params& p, std::uint64_t&) {
                     p.sources_ready = [&, r](deadline) -> std::error_code {
                       ++calls[r];
                       if (fail_one && r == 2) return errc::backend_error;
                       return {};
                     };
                     return true;
                   });
    for (rank_t r = 0; r < 3; ++r) {
      INFO("fail_one " << fail_one << ", rank " << r << ": " << out.results[r].message);
      CHECK(calls[r] == 1);
      if (!fail_one) {
        CHECK(!out.results[r].ec);
        CHECK(out.results[r].agreed_chunks == 6u);
      } else {
        CHECK(out.results[r].ec == errc::invalid_argument);
        CHECK(comm::collective_count(out.calls[r]) == 1u);  // the agreement only: no move was issued
      }
    }
    if (fail_one) CHECK(out.results[2].message.rfind("sources_ready: ", 0) == 0);
  }
}
