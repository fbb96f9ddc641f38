// The MPI backend, one process per rank (ctest label `mpi`: run under
// `mpiexec -n 4`). Every process runs the same Catch2 test cases in the same order.
//  - the failure contract (conformance.hpp), staged and direct;
//  - the thread level is checked at construction;
//  - the chunk_broadcast symmetry property across processes: random worlds of 1..N
//    ranks, chunk counts, presence, per-rank cuts, ownership policies and modes;
//    the recorded call sequences and results of all ranks are compared on a
//    separate "referee" communicator. Some cases inject a failure into one
//    collective of one rank, or give one rank different parameters: then every
//    rank ends with an error (agreed 0), never with different prefixes.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <vector>

#include "comm/conformance.hpp"
#include "comm/faulty.hpp"
#include "comm/mpi_world.hpp"
#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/bootstrap.hpp"
#include "kvtier/comm/mpi.hpp"
#include "kvtier/comm/recording.hpp"

using namespace kvtier;
using namespace std::chrono_literals;
namespace conf = kvtier::test::conformance;
using kvtier::test::mpi_world;

static_assert(comm::communicator<comm::mpi_communicator>);
static_assert(!comm::rounds_fail_together<comm::mpi_communicator>);
static_assert(comm::communicator<comm::recording<test::faulty<comm::mpi_communicator&>>>);

namespace {
// Direct (unstaged) calls leave their buffers to MPI after a failure: a late peer
// may still write them. The direct run of the suite therefore uses buffers that are
// never freed, as mpi_options::stage = false requires of its callers.
struct leaky_host_memory {
  struct buffer {
    std::byte* p;
    std::size_t n;
  };
  static buffer make(std::size_t n) { return {new std::byte[n](), n}; }
  static std::span<std::byte> bytes(buffer& b) { return {b.p, b.n}; }
  static void write(buffer& b, std::span<const std::byte> from) {
    std::memcpy(b.p, from.data(), from.size());
  }
  static std::vector<std::byte> read(buffer& b) { return {b.p, b.p + b.n}; }
};

template <class Mem>
void run_conformance(bool stage) {
  for (const auto& k : conf::suite<Mem, comm::mpi_communicator>::cases) {
    comm::mpi_communicator c = mpi_world(MPI_COMM_WORLD, {.stage = stage});
    conf::sink s;
    k.run(c, s);
    INFO(k.name << (stage ? " (staged)" : " (direct)") << "\n" << s.text());
    CHECK(s.empty());
  }
}
}  // namespace

TEST_CASE("mpi: conformance to the failure contract (staged and direct)", "[mpi]") {
  run_conformance<conf::host_memory>(true);
  run_conformance<leaky_host_memory>(false);
}

TEST_CASE("mpi: create() checks the thread level and names both levels", "[mpi]") {
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided >= MPI_THREAD_MULTIPLE) {
    WARN("SKIPPED: MPI provides MPI_THREAD_MULTIPLE; no higher level to refuse");
    return;
  }
  comm::mpi_communicator c;
  const auto ec = comm::mpi_communicator::create(c, MPI_COMM_WORLD, deadline_after(10s),
                                                 {.thread_level = MPI_THREAD_MULTIPLE});
  CHECK(ec == errc::invalid_argument);
  INFO(c.last_error());
  CHECK(c.last_error().find("MPI_THREAD_MULTIPLE") != std::string::npos);
  CHECK(c.last_error().find(comm::mpi_communicator::thread_level_name(provided)) != std::string::npos);
  std::vector<std::byte> b(4);
  CHECK(c.broadcast(b, b, 0, deadline_after(1s)) == errc::backend_error);  // never created
}

TEST_CASE("mpi: bootstrap by broadcast: every rank fetches the published bytes; a wrong name is named",
          "[mpi]") {
  static_assert(comm::bootstrap<comm::mpi_bootstrap>);
  comm::mpi_communicator c = mpi_world(MPI_COMM_WORLD, {});
  comm::mpi_bootstrap boot(c, 0);
  std::array<std::byte, 128> id{};
  if (c.rank() == 0)
    for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(i * 37 + 1);
  const auto ec = c.rank() == 0 ? boot.publish("nccl-id", id, deadline_after(20s))
                                : boot.fetch("nccl-id", id, deadline_after(20s));
  INFO(boot.last_error());
  CHECK(!ec);
  for (std::size_t i = 0; i < id.size(); ++i) CHECK(id[i] == static_cast<std::byte>(i * 37 + 1));
  const auto ec2 = c.rank() == 0 ? boot.publish("id-a", id, deadline_after(20s))
                                 : boot.fetch("id-b", id, deadline_after(20s));
  if (c.rank() != 0) {
    CHECK(ec2 == errc::invalid_argument);
    CHECK(boot.last_error().find("id-b") != std::string::npos);
  }
  std::uint64_t v = 1;  // still in step
  CHECK(!comm::all_reduce_value(c, v, comm::reduce_op::sum, deadline_after(20s)));
  CHECK(v == c.size());
}

TEST_CASE("mpi: control/data form: a data failure on one rank fails every rank, control stays aligned",
          "[mpi]") {
  for (auto mode : {broadcast_mode::per_chunk, broadcast_mode::grouped, broadcast_mode::gathered}) {
    comm::mpi_communicator ctrl = mpi_world(MPI_COMM_WORLD, {}), data = mpi_world(MPI_COMM_WORLD, {});
    const rank_t r = ctrl.rank(), w = ctrl.size();
    const modulo_ownership own(w);
    const std::size_t n = 2 * w, cb = 64;
    std::vector<std::byte> src(n * cb, static_cast<std::byte>(0x40 + r)), dst(n * cb, std::byte{0xEE});
    std::vector<std::byte> staging(gathered_staging_bytes(own, n, cb));
    chunk_span_buffers b;
    for (std::size_t k = 0; k < n; ++k) {
      b.sources.push_back(std::span<const std::byte>(src).subspan(k * cb, cb));
      b.destinations.push_back(std::span<std::byte>(dst).subspan(k * cb, cb));
    }
    broadcast_params p{.n_chunks = n,
                       .chunk_tokens = 16,
                       .chunk_bytes = cb,
                       .mode = mode,
                       .staging = staging,
                       .request_id = 3};
    // A healthy load first: every rank holds every chunk from its owner.
    auto ok = chunk_broadcast(ctrl, data, own, n * 16, b, p, deadline_after(20s));
    INFO(to_string(mode) << ": " << ok.message);
    CHECK(!ok.ec);
    CHECK(ok.agreed_chunks == n);
    for (std::size_t k = 0; k < n; ++k) CHECK(dst[k * cb] == static_cast<std::byte>(0x40 + own.owner(k)));
    // Then rank 1's data communicator refuses its first move (poisoned; its peers time out).
    test::faulty<comm::mpi_communicator&> bad(data, {.at = r == 1 ? 0u : ~0ull, .how = test::fault::invalid});
    p.request_id = load_id{4};
    // The moves stop a quarter before dl (300 ms here): time for every rank to confirm even on a
    // loaded machine.
    auto res = chunk_broadcast(ctrl, bad, own, n * 16, b, p, deadline_after(1200ms));
    INFO(res.message);
    CHECK(res.ec);
    CHECK(res.agreed_tokens == 0u);
    std::uint64_t v = r;
    CHECK(!comm::all_reduce_value(ctrl, v, comm::reduce_op::max, deadline_after(20s)));  // still aligned
    CHECK(v == w - 1);
  }
}

namespace {

// ---- the chunk_broadcast property across processes -----------------------------

struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
  bool percent(unsigned p) { return below(100) < p; }
};

std::byte pattern(std::uint64_t seed, std::size_t chunk, std::size_t i) {
  std::uint64_t x = seed ^ (chunk * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 29;
  return static_cast<std::byte>(x * 0x94D049BB133111EBull >> 56);
}

enum class twist : std::uint8_t { none, fault, differ };

struct mpi_case {
  rank_t w = 1;
  std::size_t n = 0, cb = 1;
  std::uint64_t tokens = 1;
  broadcast_mode mode = broadcast_mode::per_chunk;
  int policy = 0;
  std::size_t block = 1;
  std::uint64_t rv_seed = 0, seed = 0;
  std::vector<bool> present;
  std::vector<std::size_t> cut;
  bool in_place = false, staged = true;
  twist tw = twist::none;
  rank_t odd = 0;  // the faulty rank, or the one with different parameters
  test::fault how = test::fault::invalid;
  std::uint64_t fault_frac = 0;  // where the fault lands, as a fraction of the collectives (x / 2^32)
  int differ_what = 0;
};

mpi_case generate(std::uint64_t case_seed, rank_t max_w) {
  rng g{case_seed};
  mpi_case k;
  k.w = static_cast<rank_t>(1 + g.below(max_w));
  k.n = g.below(33);
  k.cb = 1 + g.below(24);
  k.tokens = 1 + g.below(8);
  k.mode = static_cast<broadcast_mode>(g.below(3));
  k.policy = static_cast<int>(g.below(3));
  k.block = 1 + g.below(4);
  k.rv_seed = g.next();
  k.seed = g.next();
  const unsigned miss = std::vector<unsigned>{0, 0, 2, 5, 20, 50}[g.below(6)];
  for (std::size_t c = 0; c < k.n; ++c) k.present.push_back(!g.percent(miss));
  for (rank_t r = 0; r < k.w; ++r) k.cut.push_back(g.below(4) == 0 ? g.below(k.n + 1) : k.n);
  k.in_place = g.below(2);
  k.staged = g.below(4) != 0;
  const auto t = g.below(100);
  k.tw = t < 5 ? twist::fault : (t < 10 && k.w >= 2) ? twist::differ : twist::none;
  if (k.tw == twist::fault) k.staged = true;  // direct calls would leave this case's buffers to MPI
  k.odd = static_cast<rank_t>(g.below(k.w));
  k.how = g.below(2) ? test::fault::after : test::fault::invalid;
  k.fault_frac = g.next() >> 32;
  k.differ_what = static_cast<int>(g.below(test::differing_parameters));
  return k;
}

// Per-world state that survives cases: the sub-communicator of ranks [0, w) and
// kvtier's communicators over it (recreated after a case that poisons them, by
// create(), i.e. MPI_Comm_idup of the parent). The splits are made in main(),
// before any test abandons a request: OpenMPI 4.1's MPI_Comm_split (with
// MPI_UNDEFINED ranks) was seen to deadlock in its context-id agreement after
// the conformance cases had left abandoned requests; MPI_Comm_idup does not.
struct worlds {
  rank_t size = 0, me = 0;
  std::vector<MPI_Comm> parent;  // index w
  std::vector<std::unique_ptr<comm::mpi_communicator>> staged, direct;
  worlds() {
    int r = 0, s = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    me = static_cast<rank_t>(r);
    size = static_cast<rank_t>(s);
    parent.assign(size + 1, MPI_COMM_NULL);
    staged.resize(size + 1);
    direct.resize(size + 1);
    for (rank_t w = 1; w <= size; ++w) {
      MPI_Comm_split(MPI_COMM_WORLD, me < w ? 0 : MPI_UNDEFINED, r, &parent[w]);
      if (me < w) renew(w);
    }
  }
  ~worlds() {
    staged.clear();
    direct.clear();
    for (auto& p : parent)
      if (p != MPI_COMM_NULL) MPI_Comm_free(&p);
  }
  void renew(rank_t w) {
    staged[w] = std::make_unique<comm::mpi_communicator>(mpi_world(parent[w], {.stage = true}));
    direct[w] = std::make_unique<comm::mpi_communicator>(mpi_world(parent[w], {.stage = false}));
  }
};

// What one rank reports to the referee for one case.
struct report {
  std::uint64_t ran = 0, error = 0, agreed = 0, digest = 0, collectives = 0, bad_bytes = 0, racy = 0,
                followup_error = 0;
};
constexpr std::size_t report_words = sizeof(report) / 8;

std::uint64_t digest(const std::vector<comm::collective_call>& calls) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 0x100000001B3ull; };
  for (const auto& c : calls) {
    mix(static_cast<std::uint64_t>(c.op));
    mix(c.root);
    mix(c.bytes);
    mix(static_cast<std::uint64_t>(c.type) << 8 | static_cast<std::uint64_t>(c.reduce));
    mix(c.group_depth);
  }
  return h ^ calls.size();
}

template <ownership_policy P>
report run_case(const P& own, const mpi_case& k, comm::mpi_communicator& c, std::uint64_t case_no) {
  const rank_t W = k.w, r = c.rank();
  const std::size_t N = k.n, CB = k.cb;
  std::vector<bool> loaded(N, false);
  std::vector<std::size_t> loaded_owned(W);
  for (rank_t q = 0; q < W; ++q) {
    const auto mine = owned_chunks(own, q, N);
    std::size_t j = 0;
    while (j < mine.size() && j < k.cut[q] && k.present[mine[j]]) loaded[mine[j++]] = true;
    loaded_owned[q] = j;
  }
  std::size_t expect = 0;
  while (expect < N && loaded[expect]) ++expect;

  std::vector<std::byte> src(N * CB), dst(N * CB);
  for (std::size_t ch = 0; ch < N; ++ch)
    for (std::size_t i = 0; i < CB; ++i) {
      const bool real = static_cast<rank_t>(own.owner(ch)) == r && loaded[ch];
      src[ch * CB + i] = real ? pattern(k.seed, ch, i) : pattern(~k.seed + r, ch, i);
      dst[ch * CB + i] = pattern(k.seed * 31 + 7 + r, ch, i);
    }
  if (k.in_place)
    for (std::size_t ch = 0; ch < N; ++ch)
      if (static_cast<rank_t>(own.owner(ch)) == r) std::copy_n(&src[ch * CB], CB, &dst[ch * CB]);
  const auto initial = dst;
  std::vector<std::byte> staging(gathered_staging_bytes(own, N, CB));
  chunk_span_buffers b;
  for (std::size_t ch = 0; ch < N; ++ch) {
    auto d = std::span<std::byte>(dst).subspan(ch * CB, CB);
    b.destinations.push_back(d);
    b.sources.push_back(k.in_place ? std::span<const std::byte>(d)
                                   : std::span<const std::byte>(src).subspan(ch * CB, CB));
  }
  broadcast_params p{.n_chunks = N,
                     .chunk_tokens = k.tokens,
                     .chunk_bytes = CB,
                     .mode = k.mode,
                     .staging = staging,
                     .request_id = case_no + 1};
  if (k.tw == twist::differ && r == k.odd) test::make_parameters_differ(p, k.differ_what);
  const std::size_t total = expected_collectives(k.mode, own, expect, /*confirmed=*/true);
  test::fault_plan plan;
  if (k.tw == twist::fault && r == k.odd) plan = {.at = (k.fault_frac * total) >> 32, .how = k.how};
  const bool racy =
      k.tw == twist::fault && k.how == test::fault::after && ((k.fault_frac * total) >> 32) == total - 1;
  const deadline dl = k.tw == twist::fault ? deadline_after(conf::wait_budget) : deadline_after(20s);

  comm::recording<test::faulty<comm::mpi_communicator&>> rec(test::faulty<comm::mpi_communicator&>(c, plan));
  const auto res =
      chunk_broadcast(rec, own, rank_answer_loaded(own, r, N, k.tokens, loaded_owned[r]), b, p, dl);

  report out;
  out.ran = 1;
  out.error = res.ec ? 1 : 0;
  out.agreed = res.agreed_tokens;
  out.digest = digest(rec.calls());
  out.collectives = res.collectives;
  // Below the agreed prefix: the real bytes. At or past the prefix every rank would
  // have agreed on (`expect`), or anywhere after success: untouched. Between them
  // after an error: each byte either untouched or real, never anything else.
  const std::size_t agreed_chunks = static_cast<std::size_t>(res.agreed_tokens / k.tokens);
  for (std::size_t ch = 0; ch < N; ++ch)
    for (std::size_t i = 0; i < CB; ++i) {
      const std::byte real = pattern(k.seed, ch, i), init = initial[ch * CB + i], got = dst[ch * CB + i];
      if (ch < agreed_chunks)
        out.bad_bytes += got != real;
      else if (ch >= expect || !res.ec)
        out.bad_bytes += got != init;
      else
        out.bad_bytes += got != init && got != real;
    }
  if (comm::collective_count(rec.calls()) != res.collectives) out.bad_bytes += 1000000;
  if (!res.ec && (res.collectives != total || res.agreed_tokens != expect * k.tokens))
    out.bad_bytes += 1000000;
  out.racy = racy;
  if (racy) {  // the documented window: the next collective fails on every rank
    std::uint64_t v = 1;
    out.followup_error =
        comm::all_reduce_value(c, v, comm::reduce_op::min, deadline_after(conf::wait_budget)) ? 1 : 0;
  }
  return out;
}

}  // namespace

worlds* the_worlds = nullptr;

TEST_CASE("mpi: chunk_broadcast is symmetric across processes, and fails on every rank or none", "[mpi]") {
  worlds& ws = *the_worlds;
  comm::mpi_communicator referee = mpi_world(MPI_COMM_WORLD, {});
  std::uint64_t base = static_cast<std::uint64_t>(std::random_device{}()) << 32 | 0x5eed;
  if (const char* env = std::getenv("KVTIER_MPI_SEED")) base = std::strtoull(env, nullptr, 0);
  REQUIRE(!referee.broadcast(std::as_bytes(std::span(&base, 1)), std::as_writable_bytes(std::span(&base, 1)),
                             0, deadline_after(30s)));
  int cases = 1000;
  if (const char* env = std::getenv("KVTIER_MPI_PROPERTY_CASES")) cases = std::max(1, std::atoi(env));
  const bool verbose = std::getenv("KVTIER_MPI_VERBOSE") != nullptr;
  std::size_t by_twist[3] = {0, 0, 0}, racy_cases = 0, failures = 0;
  std::vector<std::uint64_t> mine(report_words), all(report_words * ws.size);
  for (int i = 0; i < cases && failures < 5; ++i) {
    const mpi_case k = generate(base ^ (static_cast<std::uint64_t>(i) << 32), ws.size);
    if (verbose)
      std::fprintf(stderr, "rank %u case %d: W=%u chunks=%zu mode=%s twist=%d odd=%u how=%d staged=%d\n",
                   ws.me, i, k.w, k.n, std::string(to_string(k.mode)).c_str(), static_cast<int>(k.tw), k.odd,
                   static_cast<int>(k.how), k.staged);
    report rep;
    if (ws.me < k.w) {
      auto& c = k.staged ? *ws.staged[k.w] : *ws.direct[k.w];
      switch (k.policy) {
        case 0:
          rep = run_case(modulo_ownership(k.w), k, c, i);
          break;
        case 1:
          rep = run_case(block_interleave_ownership(k.w, k.block), k, c, i);
          break;
        default:
          rep = run_case(rendezvous_ownership(k.w, k.rv_seed), k, c, i);
          break;
      }
      if (k.tw == twist::fault) ws.renew(k.w);  // every rank of the world, poisoned or not
    }
    std::memcpy(mine.data(), &rep, sizeof rep);
    REQUIRE(!referee.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                                deadline_after(60s)));
    std::vector<report> reps(k.w);
    for (rank_t q = 0; q < k.w; ++q) std::memcpy(&reps[q], all.data() + q * report_words, sizeof(report));
    const bool racy = reps[0].racy != 0;  // the fault lands on the confirmation itself
    ++by_twist[static_cast<int>(k.tw)];
    std::string why;
    for (rank_t q = 0; q < k.w && why.empty(); ++q) {
      const report& x = reps[q];
      if (x.bad_bytes) why = "rank " + std::to_string(q) + ": wrong bytes or collective count";
      if (k.tw == twist::none && (x.error || x.digest != reps[0].digest || x.agreed != reps[0].agreed))
        why = "rank " + std::to_string(q) + " differs from rank 0 (error, sequence or prefix)";
      if (k.tw == twist::differ && (!x.error || x.agreed || x.digest != reps[0].digest))
        why = "different parameters: rank " + std::to_string(q) + " did not fail like rank 0";
      if (k.tw == twist::fault && !racy && (!x.error || x.agreed))
        why = "injected fault: rank " + std::to_string(q) + " did not end with an error";
      if (racy && q == k.odd && !x.error) why = "racy fault: the faulty rank succeeded";
    }
    if (racy) {
      ++racy_cases;
      // Only the confirmation itself may race: the next collective then fails everywhere.
      for (rank_t q = 0; q < k.w && why.empty(); ++q)
        if (!reps[q].error && !reps[q].followup_error)
          why = "racy fault: rank " + std::to_string(q) + "'s next collective succeeded";
    }
    if (!why.empty()) {
      ++failures;
      FAIL_CHECK("case " << i << " (KVTIER_MPI_SEED=" << base << "): W=" << k.w << " chunks=" << k.n
                         << " mode=" << to_string(k.mode) << " policy=" << k.policy
                         << " twist=" << static_cast<int>(k.tw) << " odd=" << k.odd << ": " << why);
    }
  }
  if (ws.me == 0)
    std::cout << "mpi chunk_broadcast property: " << cases << " cases over " << ws.size << " processes ("
              << by_twist[0] << " plain, " << by_twist[1] << " with an injected fault (" << racy_cases
              << " in the confirmation race), " << by_twist[2] << " with different parameters)\n";
  CHECK(failures == 0u);
}

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return 2;
  int rc = 0;
  {
    worlds ws;
    the_worlds = &ws;
    rc = Catch::Session().run(argc, argv);
  }
  MPI_Finalize();
  return rc;
}
