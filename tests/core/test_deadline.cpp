// Deadlines: local_io_deadline / phase_deadlines saturate; and the phase recipe
// itself: with one server stuck until its deadline, rank-local I/O that ends a
// margin before the collectives' deadline lets every rank still agree on a prefix
// (with one deadline for both, the stuck rank reaches the all-reduce too late).
#include <chrono>
#include <cstdint>
#include <deque>
#include <system_error>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/comm/inproc.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/rank_view.hpp"
#include "store/store_fakes.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

TEST_CASE("local_io_deadline moves a deadline earlier and saturates", "[unit]") {
  const deadline d = clock::now() + 10s;
  REQUIRE(local_io_deadline(d, 3s) == d - 3s);
  REQUIRE(local_io_deadline(d, 0s) == d);
  REQUIRE(local_io_deadline(d, -5s) == d);  // a negative margin never extends the deadline
  REQUIRE(local_io_deadline(no_deadline, 3s) == no_deadline);
  REQUIRE(local_io_deadline(deadline::min() + 1s, 3s) == deadline::min());  // no wrap to the future
  REQUIRE(expired(local_io_deadline(d, clock::duration::max())));           // no overflow, just expired
  const phase_deadlines p = phase_deadlines::split(d, 2s);
  REQUIRE(p.collective == d);
  REQUIRE(p.local_io == d - 2s);
  REQUIRE(phase_deadlines{}.local_io == no_deadline);  // default members: no -Wextra warning in {.x = ...}
}

TEST_CASE("phase recipe: a stuck server on one rank does not cost the others the agreement", "[unit]") {
  constexpr rank_t W = 2;
  constexpr std::size_t T = 16, C = 4;
  std::vector<chunk_key> keys;
  for (std::size_t c = 0; c < C; ++c) keys.push_back(chunk_key{0x7a, c});
  memory_store healthy(1 << 20);  // rank 0's server: every chunk it owns is there
  std::vector<std::byte> v(8);
  for (std::size_t c = 0; c < C; c += 2) {
    std::span<const std::byte> src[1] = {v};
    chunk_status st[1];
    REQUIRE_FALSE(healthy.put(std::span<const chunk_key>(&keys[c], 1), src, st, deadline_after(1s)));
  }
  kvtier::test::gated_store stuck;  // rank 1's server: never answers (each call waits for its deadline)

  std::uint64_t agreed[W] = {};
  std::error_code reduce_ec[W], lookup_ec[W];
  comm::inproc_world world(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    // One request deadline on every rank; the local I/O ends 2 s before it.
    const phase_deadlines dl = phase_deadlines::split(deadline_after(4s), 2s);
    std::uint64_t hit = 0;
    if (r == 0) {
      rank_view view(healthy, modulo_ownership(W), r, T);
      hit = view.lookup(keys, C * T, dl.local_io).answer_tokens;
    } else {
      rank_view view(stuck, modulo_ownership(W), r, T);
      const rank_lookup a = view.lookup(keys, C * T, dl.local_io);
      hit = a.answer_tokens, lookup_ec[r] = a.ec;
    }
    reduce_ec[r] = comm::all_reduce_value(c, hit, comm::reduce_op::min, dl.collective);
    agreed[r] = hit;
  });
  REQUIRE(lookup_ec[1] == errc::timeout);  // the stuck server cost rank 1 its chunks...
  REQUIRE_FALSE(reduce_ec[0]);             // ...but not the agreement
  REQUIRE_FALSE(reduce_ec[1]);
  REQUIRE(agreed[0] == 1 * T);  // chunk 0 (rank 0's) still counts; rank 1's chunk 1 is recomputed
  REQUIRE(agreed[1] == 1 * T);
}
