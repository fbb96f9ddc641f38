// The proof of the load protocol: for random worlds, chunk counts, presence
// patterns, per-rank load failures, ownership policies and modes, running
// chunk_broadcast on the in-process backend behind the recording decorator
//  - gives every rank the same recorded collective sequence,
//  - agrees on exactly the longest prefix whose every chunk its owner loaded,
//  - leaves every rank with the source bytes of every chunk below that prefix and
//    every destination byte at or past it untouched,
//  - issues expected_collectives() collectives, and leaves the world clean.
// The same holds for pipelined_broadcast with random per-rank fetch progress: every
// rank finishes at the same step with the same prefix as the one-shot protocol.
// Failure semantics (the in-process backend's rounds fail together):
//  - a failure injected into any one collective of one rank (tests/comm/faulty.hpp)
//    ends with errc::invalid_argument and agreed 0 on every rank, after the same
//    recorded sequence, and no byte other than a real one is ever written;
//  - one rank with different parameters (chunks, tokens, bytes, mode, request id)
//    makes every rank fail at the agreement, with nothing written;
//  - in pipelined_broadcast, a rank whose loaded prefix goes back below the agreed
//    prefix makes every rank fail at that same step.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "comm/faulty.hpp"
#include "comm/rank_pool.hpp"
#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "support/property.hpp"

namespace {

using namespace kvtier;

std::byte pattern(std::uint64_t seed, std::size_t chunk, std::size_t i) {
  std::uint64_t x = seed ^ (chunk * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 29;
  return static_cast<std::byte>(x * 0x94D049BB133111EBull >> 56);
}

struct case_params {
  rank_t w;
  std::size_t n_chunks, chunk_bytes;
  std::uint64_t chunk_tokens;
  broadcast_mode mode;
  std::vector<bool> present;     // chunk c exists in its owner's store
  std::vector<std::size_t> cut;  // rank r's fetch stops after cut[r] owned chunks
  bool in_place;                 // the owner fetched straight into its destination
  std::uint64_t seed;
  bool pipelined = false;                          // run pipelined_broadcast stages instead
  std::vector<std::vector<std::size_t>> progress;  // pipelined: rank r's owned chunks loaded by step s
  enum class twist { none, fault, differ, backwards } tw = twist::none;
  rank_t odd = 0;                // the faulty rank, the one with other parameters, or the one going back
  std::uint64_t fault_frac = 0;  // fault: which collective, as a fraction (x / 2^32) of those issued
  int differ_what = 0;           // differ: which parameter
  std::size_t back_step = 0;     // backwards: at which step (if something was agreed by then)
};

kvtier::test::rank_pool& pool() {
  static kvtier::test::rank_pool p(16);
  return p;
}

template <ownership_policy P>
void check_case(const P& own, const case_params& k) {
  const rank_t W = k.w;
  const std::size_t N = k.n_chunks, CB = k.chunk_bytes;

  // What each rank loaded: its owned chunks, in order, until the first missing one or its cut.
  std::vector<std::size_t> loaded_owned(W);
  std::vector<bool> loaded(N, false);
  for (rank_t r = 0; r < W; ++r) {
    const auto mine = owned_chunks(own, r, N);
    std::size_t j = 0;
    while (j < mine.size() && j < k.cut[r] && k.present[mine[j]]) loaded[mine[j++]] = true;
    loaded_owned[r] = j;
  }
  std::size_t expect = 0;
  while (expect < N && loaded[expect]) ++expect;

  // Buffers: owners' sources hold the real bytes for loaded chunks and junk past them.
  std::vector<std::vector<std::byte>> src(W, std::vector<std::byte>(N * CB));
  std::vector<std::vector<std::byte>> dst(W, std::vector<std::byte>(N * CB));
  for (rank_t r = 0; r < W; ++r)
    for (std::size_t c = 0; c < N; ++c)
      for (std::size_t i = 0; i < CB; ++i) {
        const bool real = static_cast<rank_t>(own.owner(c)) == r && loaded[c];
        src[r][c * CB + i] = real ? pattern(k.seed, c, i) : pattern(~k.seed + r, c, i);
        dst[r][c * CB + i] = pattern(k.seed * 31 + 7 + r, c, i);  // per-rank initial bytes
      }
  if (k.in_place)
    for (rank_t r = 0; r < W; ++r)
      for (std::size_t c = 0; c < N; ++c)
        if (static_cast<rank_t>(own.owner(c)) == r) std::copy_n(&src[r][c * CB], CB, &dst[r][c * CB]);
  const auto initial = dst;
  std::vector<std::vector<std::byte>> staging(W, std::vector<std::byte>(gathered_staging_bytes(own, N, CB)));

  comm::inproc_world world(W);
  std::vector<broadcast_result> results(W);
  std::vector<std::vector<comm::collective_call>> calls(W);
  std::vector<std::size_t> steps(W, 0);
  using twist = case_params::twist;
  const std::size_t issued = expected_collectives(k.mode, own, expect);
  bool went_back = false;  // written by rank k.odd only
  pool().run(W, [&](unsigned r) {
    test::fault_plan plan;
    if (k.tw == twist::fault && r == k.odd) plan.at = (k.fault_frac * issued) >> 32;
    comm::recording<test::faulty<comm::inproc_communicator>> c(
        test::faulty<comm::inproc_communicator>(world.communicator_for(r), plan));
    chunk_span_buffers b;
    for (std::size_t ch = 0; ch < N; ++ch) {
      auto d = std::span<std::byte>(dst[r]).subspan(ch * CB, CB);
      b.destinations.push_back(d);
      b.sources.push_back(k.in_place ? std::span<const std::byte>(d)
                                     : std::span<const std::byte>(src[r]).subspan(ch * CB, CB));
    }
    broadcast_params p{.n_chunks = N,
                       .chunk_tokens = k.chunk_tokens,
                       .chunk_bytes = CB,
                       .mode = k.mode,
                       .staging = staging[r],
                       .request_id = 1};
    if (k.tw == twist::differ && r == k.odd) test::make_parameters_differ(p, k.differ_what);
    const auto dl = deadline_after(std::chrono::seconds(30));
    if (!k.pipelined) {
      const auto loaded_tokens = rank_answer_loaded(own, r, N, k.chunk_tokens, loaded_owned[r]);
      results[r] = chunk_broadcast(c, own, loaded_tokens, b, p, dl);
    } else {
      // Rank r's fetch advances by its own random schedule; all ranks step in lockstep.
      pipelined_broadcast pb(c, own, b, p);
      const auto& prog = k.progress[r];
      std::size_t max_steps = 0;
      for (const auto& pr : k.progress) max_steps = std::max(max_steps, pr.size());
      for (std::size_t s = 0; !pb.done() && s < max_steps + 2; ++s) {  // same bound on every rank
        const std::size_t have = std::min(s < prog.size() ? prog[s] : loaded_owned[r], loaded_owned[r]);
        std::uint64_t now = rank_answer_loaded(own, r, N, k.chunk_tokens, have);
        if (k.tw == twist::backwards && r == k.odd && s == k.back_step && pb.agreed_chunks() > 0)
          now = 0, went_back = true;  // below the prefix every rank already holds
        pb.step(now, s + 1 >= prog.size(), dl);
        steps[r] = s + 1;
      }
      results[r] = pb.result();
      if (!pb.done()) results[r].ec = errc::timeout;  // must not happen: flagged below
    }
    calls[r] = c.calls();
  });

  // What every rank must end with: success on `expect`, or the same error everywhere.
  const bool must_fail = k.tw == twist::fault || k.tw == twist::differ || went_back;
  for (rank_t r = 0; r < W; ++r) {
    RC_ASSERT(calls[r] == calls[0]);
    RC_ASSERT(steps[r] == steps[0]);
    RC_ASSERT(results[r].collectives == comm::collective_count(calls[r]));
    if (must_fail) {
      RC_ASSERT(results[r].ec == errc::invalid_argument);
      RC_ASSERT(results[r].agreed_tokens == 0u);
      RC_ASSERT(results[r].agreed_chunks == 0u);
    } else {
      RC_ASSERT(!results[r].ec);
      RC_ASSERT(results[r].agreed_chunks == expect);
      RC_ASSERT(results[r].agreed_tokens == expect * k.chunk_tokens);
      if (!k.pipelined)
        RC_ASSERT(comm::collective_count(calls[r]) == expected_collectives(k.mode, own, expect));
    }
    if (k.tw == twist::differ) RC_ASSERT(comm::collective_count(calls[r]) == 1u);  // the agreement only
    // Below the agreed prefix the real bytes; past what could be agreed, or after a
    // failed agreement, untouched; in between after a failure, each byte untouched or real.
    const std::size_t agreed = results[r].agreed_chunks;
    const std::size_t touchable = k.tw == twist::differ ? 0 : expect;
    for (std::size_t c = 0; c < N; ++c)
      for (std::size_t i = 0; i < CB; ++i) {
        const std::byte got = dst[r][c * CB + i], real = pattern(k.seed, c, i), init = initial[r][c * CB + i];
        if (c < agreed)
          RC_ASSERT(got == real);
        else if (c >= touchable || !must_fail)
          RC_ASSERT(got == init);
        else
          RC_ASSERT((got == init || got == real));
      }
  }
  RC_ASSERT(world.pending_rounds() == 0u);
}

case_params gen_case(bool pipelined) {
  case_params k;
  k.w = *rc::gen::inRange<rank_t>(1, 17);
  k.n_chunks = *rc::gen::inRange<std::size_t>(0, 41);
  k.chunk_bytes = *rc::gen::inRange<std::size_t>(1, 25);
  k.chunk_tokens = *rc::gen::inRange<std::uint64_t>(1, 9);
  k.mode = static_cast<broadcast_mode>(*rc::gen::inRange(0, 3));
  const int miss_pct = *rc::gen::element(0, 0, 2, 5, 20, 50);
  k.present.resize(k.n_chunks);
  for (std::size_t c = 0; c < k.n_chunks; ++c) k.present[c] = *rc::gen::inRange(0, 100) >= miss_pct;
  // Most ranks load everything they have; some are cut short (eviction, timeout, error).
  k.cut.resize(k.w);
  for (rank_t r = 0; r < k.w; ++r)
    k.cut[r] = *rc::gen::inRange(0, 4) == 0 ? *rc::gen::inRange<std::size_t>(0, k.n_chunks + 1) : k.n_chunks;
  k.in_place = *rc::gen::arbitrary<bool>();
  k.seed = *rc::gen::arbitrary<std::uint64_t>();
  k.pipelined = pipelined;
  // One case in ten fails on purpose: a fault or other parameters (one-shot), a
  // prefix going back (pipelined).
  using twist = case_params::twist;
  const int t = *rc::gen::inRange(0, 20);
  k.odd = *rc::gen::inRange<rank_t>(0, k.w);
  k.fault_frac = *rc::gen::arbitrary<std::uint32_t>();
  k.differ_what = *rc::gen::inRange(0, test::differing_parameters);
  k.back_step = *rc::gen::inRange<std::size_t>(1, 5);
  if (!pipelined && t == 0) k.tw = twist::fault;
  if (!pipelined && t == 1 && k.w >= 2) k.tw = twist::differ;
  if (pipelined && t <= 1) k.tw = twist::backwards;
  if (pipelined) {
    // Per rank: a non-decreasing count of loaded owned chunks per step, over 1..6 steps
    // (clipped to what the rank really loads); its fetch is done after its last step.
    k.progress.resize(k.w);
    for (rank_t r = 0; r < k.w; ++r) {
      const std::size_t steps = *rc::gen::inRange<std::size_t>(1, 7);
      std::size_t have = 0;
      for (std::size_t s = 0; s < steps; ++s) {
        have += *rc::gen::inRange<std::size_t>(0, 4);
        k.progress[r].push_back(s + 1 == steps ? k.n_chunks : have);
      }
    }
  }
  return k;
}

void run_generated(bool pipelined) {
  case_params k = gen_case(pipelined);
  switch (*rc::gen::inRange(0, 3)) {
    case 0:
      check_case(modulo_ownership(k.w), k);
      break;
    case 1:
      check_case(block_interleave_ownership(k.w, *rc::gen::inRange<std::size_t>(1, 5)), k);
      break;
    default:
      check_case(rendezvous_ownership(k.w, *rc::gen::arbitrary<std::uint64_t>()), k);
      break;
  }
}

}  // namespace

TEST_CASE("chunk_broadcast: symmetric collectives, agreed prefix, exact bytes", "[property]") {
  kvtier::test::prop("chunk_broadcast symmetry and bytes", [] { run_generated(false); });
}

TEST_CASE("pipelined_broadcast: stages stay symmetric and end on the same agreed prefix", "[property]") {
  kvtier::test::prop("pipelined_broadcast symmetry and bytes", [] { run_generated(true); });
}
