// Issue 26: the connector's model-based property (connector_model.hpp) with ranks that are MPI
// processes: `mpiexec -n W` runs W copies of this program, each one rank with its own connector
// over MPI communicators (a fresh control and data pair per case), its own pages, and its own
// store and adversary, scripted identically from the same generated case.
//
// Lock-step: rank 0 broadcasts rapidcheck's seed, so every process generates the same cases; after
// every command each process sends its report (rank_obs, serialized) and what its store holds
// (per key of the case: now, ever) to every other over the harness's own communicator (never
// the connector's), and every process runs the same checks (detail::checker) on the same reports:
// the same verdict everywhere, and shrinking takes the same path (an MPI_Allreduce of the failure
// flag at the end of every case makes sure).
//
// What MPI cannot survive (gen_options::mpi): a collective that times out poisons the
// communicator of the rank that timed out while its peers' may complete, and the connector has
// no way to replace a communicator (kvtier::comm::recover needs a new connector). So an MPI case
// has no communicator fault that stalls or fails a round, no short deadline on step or
// wait_for_layer, and short load deadlines only with two communicators, where a move that times
// out poisons only the data communicator and its failure is agreed on the control one. After
// a failed data call the ranks' data collective records may differ (checker, rounds_fail_together
// false); everything agreed must still be equal on every rank.
//
// KVTIER_MPI_PROPERTY_CASES=N: the number of cases (default below); the knobs of
// connector_model.hpp (KVTIER_MODEL_WITHOUT, KVTIER_MODEL_TRACE) hold here too.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "comm/mpi_world.hpp"
#include "connector/connector_model.hpp"
#include "connector/connector_model_gen.hpp"
#include "kvtier/comm/mpi.hpp"

using namespace kvtier;
using namespace kvtier::test::model;

namespace {

MPI_Comm harness_comm = MPI_COMM_NULL;  // the harness's gathers: never a communicator under test
int me = 0, world = 1;
std::uint64_t poisoned_cases = 0;  // cases that ended with a data communicator poisoned on some rank

// ---- reports as bytes ---------------------------------------------------------------------------

struct writer {
  std::vector<std::byte> b;
  void u64(std::uint64_t v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void str(const std::string& s) {
    u64(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    b.insert(b.end(), p, p + s.size());
  }
  // Categories by number: kvtier's, generic, system (the ones the connector returns).
  void ec(std::error_code e) {
    const std::error_category& c = e.category();
    u64(!e ? 0 : &c == &kvtier::error_category() ? 1 : &c == &std::generic_category() ? 2 : 3);
    u64(static_cast<std::uint64_t>(static_cast<std::int64_t>(e.value())));
  }
  template <class V, class F>
  void list(const V& v, F each) {
    u64(v.size());
    for (const auto& x : v) each(x);
  }
};

struct reader {
  const std::byte* p;
  const std::byte* end;
  std::uint64_t u64() {
    std::uint64_t v = 0;
    if (end - p < 8) throw std::runtime_error("harness: a report ended early");
    std::memcpy(&v, p, 8);
    p += 8;
    return v;
  }
  std::string str() {
    const std::uint64_t n = u64();
    if (static_cast<std::uint64_t>(end - p) < n) throw std::runtime_error("harness: a report ended early");
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  std::error_code ec() {
    const std::uint64_t c = u64();
    const int v = static_cast<int>(static_cast<std::int64_t>(u64()));
    if (c == 0) return {};
    return {v, c == 1 ? kvtier::error_category() : c == 2 ? std::generic_category() : std::system_category()};
  }
  template <class V, class F>
  void list(V& v, F each) {
    v.resize(u64());
    for (auto& x : v) each(x);
  }
};

void put_calls(writer& w, const std::vector<comm::collective_call>& calls) {
  w.list(calls, [&](const comm::collective_call& c) {
    for (std::uint64_t x : {std::uint64_t(c.op), std::uint64_t(c.root), c.bytes, std::uint64_t(c.type),
                            std::uint64_t(c.reduce), std::uint64_t(c.group_depth)})
      w.u64(x);
  });
}
void get_calls(reader& r, std::vector<comm::collective_call>& calls) {
  r.list(calls, [&](comm::collective_call& c) {
    c.op = static_cast<comm::op_kind>(r.u64());
    c.root = static_cast<rank_t>(r.u64());
    c.bytes = r.u64();
    c.type = static_cast<comm::dtype>(r.u64());
    c.reduce = static_cast<comm::reduce_op>(r.u64());
    c.group_depth = static_cast<std::uint32_t>(r.u64());
  });
}

void put_obs(writer& w, const rank_obs& o) {
  w.list(o.reqs, [&](const req_obs& q) {
    for (bool b : {q.known, q.finished, q.load_reason, q.loading, q.load_called, q.load_slots_ok}) w.u64(b);
    w.u64(q.plan.has_value());
    if (q.plan)
      for (std::uint64_t x :
           {q.plan->cached_tokens, q.plan->load_first_token, q.plan->load_end_token, q.plan->prompt_tokens})
        w.u64(x);
    w.u64(q.outcome.has_value());
    if (q.outcome)
      for (std::uint64_t x :
           {q.outcome->load_first_token, q.outcome->loaded_end_token, q.outcome->requested_end_token})
        w.u64(x);
    w.list(q.load_errors, [&](std::size_t x) { w.u64(x); });
    w.ec(q.load_ec);
  });
  w.list(o.agreed, [&](std::error_code e) { w.ec(e); });
  w.u64(o.layer_wait);
  w.ec(o.layer_ec);
  w.list(o.ready, [&](const ready_obs& x) {
    for (std::uint64_t v : {x.id, x.first, x.ready_end, x.requested_end}) w.u64(v);
  });
  w.list(o.finished_loads, [&](request_id x) { w.u64(x); });
  w.u64(o.agreement_failures);
  put_calls(w, o.ctrl_calls);
  put_calls(w, o.data_calls);
  w.u64(o.ctrl_failed);
  w.u64(o.data_failed);
  w.list(o.violations, [&](const std::string& s) { w.str(s); });
  w.list(o.notes, [&](const std::string& s) { w.str(s); });
}

rank_obs get_obs(reader& r) {
  rank_obs o;
  r.list(o.reqs, [&](req_obs& q) {
    for (bool* b : {&q.known, &q.finished, &q.load_reason, &q.loading, &q.load_called, &q.load_slots_ok})
      *b = r.u64() != 0;
    if (r.u64()) {
      load_plan p;
      p.cached_tokens = r.u64(), p.load_first_token = r.u64(), p.load_end_token = r.u64();
      p.prompt_tokens = r.u64();
      q.plan = p;
    }
    if (r.u64()) {
      load_outcome x;
      x.load_first_token = r.u64(), x.loaded_end_token = r.u64(), x.requested_end_token = r.u64();
      q.outcome = x;
    }
    r.list(q.load_errors, [&](std::size_t& x) { x = r.u64(); });
    q.load_ec = r.ec();
  });
  r.list(o.agreed, [&](std::error_code& e) { e = r.ec(); });
  o.layer_wait = r.u64() != 0;
  o.layer_ec = r.ec();
  r.list(o.ready, [&](ready_obs& x) {
    x.id = r.u64(), x.first = r.u64(), x.ready_end = r.u64(), x.requested_end = r.u64();
  });
  r.list(o.finished_loads, [&](request_id& x) { x = r.u64(); });
  o.agreement_failures = r.u64();
  get_calls(r, o.ctrl_calls);
  get_calls(r, o.data_calls);
  o.ctrl_failed = r.u64() != 0;
  o.data_failed = r.u64() != 0;
  r.list(o.violations, [&](std::string& s) { s = r.str(); });
  r.list(o.notes, [&](std::string& s) { s = r.str(); });
  return o;
}

// ---- the harness's collectives ------------------------------------------------------------------

// Bounded: a process whose command never returns would leave its peers in the gather forever.
constexpr std::chrono::seconds gather_limit{120};

void wait_or_abort(MPI_Request& req, const char* what) {
  const deadline limit = deadline_after(gather_limit);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (expired(limit)) {
      std::fprintf(stderr,
                   "rank %d: the harness's %s did not complete within %lld s: a rank did not finish its "
                   "command (a blocking call that never returned)\n",
                   me, what, static_cast<long long>(gather_limit.count()));
      MPI_Abort(MPI_COMM_WORLD, 4);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Every process's bytes, in rank order, on every process.
std::vector<std::vector<std::byte>> all_gather(const std::vector<std::byte>& mine) {
  std::uint64_t n = mine.size();
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(world));
  MPI_Request req;
  MPI_Iallgather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, harness_comm, &req);
  wait_or_abort(req, "gather of report sizes");
  std::vector<int> counts(sizes.size()), offsets(sizes.size());
  int total = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r)
    counts[r] = static_cast<int>(sizes[r]), offsets[r] = total, total += counts[r];
  std::vector<std::byte> all(static_cast<std::size_t>(total));
  MPI_Iallgatherv(mine.data(), static_cast<int>(n), MPI_BYTE, all.data(), counts.data(), offsets.data(),
                  MPI_BYTE, harness_comm, &req);
  wait_or_abort(req, "gather of reports");
  std::vector<std::vector<std::byte>> out(sizes.size());
  for (std::size_t r = 0; r < sizes.size(); ++r)
    out[r].assign(all.begin() + offsets[r], all.begin() + offsets[r] + counts[r]);
  return out;
}

// ---- one case -----------------------------------------------------------------------------------

using mpi_runner = basic_rank_runner<comm::mpi_communicator>;

/// The keys of a case in one order (every process builds the same), and per rank what its store
/// holds of each (bit 0: now, bit 1: ever), as of the last gather.
struct store_facts {
  std::unordered_map<chunk_key, std::size_t, chunk_key_hash> index;
  std::vector<chunk_key> keys;
  std::vector<std::vector<std::uint8_t>> held;  // [rank][key]

  explicit store_facts(const case_state& s) : held(static_cast<std::size_t>(world)) {
    for (const prompt_ref& p : s.prompts)
      for (const chunk_key& k : p.keys)
        if (index.emplace(k, keys.size()).second) keys.push_back(k);
  }
  void put_mine(writer& w, case_state& s) const {
    w.list(keys, [&](const chunk_key& k) {
      w.u64((s.inner[me]->contains(k) ? 1 : 0) | (s.stores[me]->ever_held(k) ? 2 : 0));
    });
  }
  bool operator()(rank_t r, const chunk_key& k, bool ever) const {
    const auto it = index.find(k);
    return it != index.end() && (held[r][it->second] & (ever ? 2 : 1));
  }
};

/// Every process's report of the command just run (and its store's keys) on every process.
std::vector<rank_obs> exchange(const rank_obs& mine, case_state& s, store_facts& facts) {
  writer w;
  put_obs(w, mine);
  facts.put_mine(w, s);
  const auto all = all_gather(w.b);
  std::vector<rank_obs> obs;
  for (std::size_t r = 0; r < all.size(); ++r) {
    reader rd{all[r].data(), all[r].data() + all[r].size()};
    obs.push_back(get_obs(rd));
    rd.list(facts.held[r], [&](std::uint8_t& b) { b = static_cast<std::uint8_t>(rd.u64()); });
  }
  return obs;
}

/// Runs case c with this process as rank `me`: empty when every invariant held on every rank.
std::string run_mpi_case(const model_case& c) {
  case_state s(c);  // every rank's stores are built; this process's connector uses stores[me]
  // A fresh pair per case (collective on MPI_COMM_WORLD, the same order on every process): a
  // case's abandoned requests never pair with the next case's calls.
  comm::mpi_communicator ctrl = kvtier::test::mpi_world(MPI_COMM_WORLD, {});
  comm::mpi_communicator data = kvtier::test::mpi_world(MPI_COMM_WORLD, {});
  std::unique_ptr<mpi_runner> runner;
  rank_obs setup;
  try {
    runner = std::make_unique<mpi_runner>(s, static_cast<rank_t>(me), std::move(ctrl), std::move(data));
  } catch (const std::exception& e) {
    setup.violations.push_back(std::string("rank setup failed: ") + e.what());
  }
  store_facts facts(s);
  std::vector<rank_obs> obs = exchange(setup, s, facts);
  for (const rank_obs& o : obs)
    if (!o.violations.empty()) return o.violations.front();
  kvtier::test::model::detail::checker check(s, std::ref(facts), /*rounds_fail_together=*/false);
  const bool generous = c.generous();
  stats().cases++;
  if (c.adversarial()) stats().adversarial++;
  std::string verdict;
  for (std::size_t n = 0; n <= c.commands.size() && verdict.empty(); ++n) {
    const bool end = n == c.commands.size();
    const command k = end ? command{} : c.commands[n];
    const std::string where = kvtier::test::model::detail::where_of(n, end, k);
    check.before(k, end, generous);
    obs = exchange(runner->report(k, end), s, facts);
    stats().commands++;
    if (trace() && me == 0) kvtier::test::model::detail::print_trace(where, obs);
    if (std::string v = check.check(k, end, generous, obs); !v.empty()) verdict = where + ": " + v;
  }
  runner.reset();  // its threads end here (bounded by the loads' deadlines), on every process alike
  if (std::any_of(obs.begin(), obs.end(), [](const rank_obs& o) { return o.data_failed; })) ++poisoned_cases;
  return verdict;
}

/// Whether any process's verdict is a failure (every process checks the same reports, so they
/// agree; this makes sure, since rapidcheck's shrinking must take the same path everywhere).
bool any_failed(bool failed) {
  int mine = failed ? 1 : 0, any = 0;
  MPI_Request req;
  MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, harness_comm, &req);
  wait_or_abort(req, "agreement on a verdict");
  return any != 0;
}

int mpi_property_cases() {
  int cases = 500;
  if (const char* env = std::getenv("KVTIER_MPI_PROPERTY_CASES")) cases = std::max(1, std::atoi(env));
  return cases;
}

}  // namespace

TEST_CASE("connector model over MPI processes: random engine call sequences keep every invariant",
          "[property][connector][mpi]") {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  std::uint64_t seed = params.seed;  // rank 0's: every process generates the same cases
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, harness_comm);
  params.seed = seed;
  params.maxSuccess = mpi_property_cases();
  const std::string description = "connector model, W = " + std::to_string(world) + " MPI processes";
  std::string passed;
  const std::string failure = check_model_property(
      description, params, {.world = static_cast<std::uint8_t>(world), .mpi = true},
      [](const model_case& c) {
        std::string v = run_mpi_case(c);
        if (!any_failed(!v.empty())) return std::string();
        return v.empty() ? std::string("another process saw a violation this one did not (a harness bug)")
                         : v;
      },
      &passed);
  if (!failure.empty()) {
    INFO("rank " << me << ", seed " << seed << ":\n" << failure);
    FAIL();
  }
  std::uint64_t layer_ok = stats().layer_ok;  // counted by rank 0 only
  MPI_Allreduce(MPI_IN_PLACE, &layer_ok, 1, MPI_UINT64_T, MPI_SUM, harness_comm);
  const model_stats& s = stats();
  if (me == 0)
    std::cout << "property '" << description << "' (seed " << seed << "): " << passed << "\n"
              << "connector model over MPI: " << s.cases << " cases (" << s.adversarial << " adversarial), "
              << s.commands << " commands; " << s.loads << " load outcomes (" << s.complete << " complete, "
              << s.short_loads << " short; " << s.sane_loads << " checked complete by the sanity rule), "
              << layer_ok << " layer waits answered ok; " << poisoned_cases
              << " cases ended with the data communicator poisoned (a move past its load's deadline)\n";
  CHECK(s.complete > 0);    // the suite loads something
  CHECK(s.sane_loads > 0);  // and checks that a stored prefix loads whole
  CHECK(layer_ok > 0);      // and that layer waits answer
}

int main(int argc, char** argv) {
  // Multiple: the harness gathers on this thread while a connector's mover thread broadcasts on
  // the data communicator.
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 2;
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "test_connector_model_mpi: MPI provides no MPI_THREAD_MULTIPLE\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_dup(MPI_COMM_WORLD, &harness_comm);
  // A late answer comes 20 ms past its deadline (threads: 2 ms): every process still steps in
  // between on a loaded machine, so a late hit lands after a reach was agreed.
  late_by() = std::chrono::milliseconds(20);
  if (world > static_cast<int>(max_ranks)) {
    std::fprintf(stderr, "test_connector_model_mpi: at most %zu processes\n", max_ranks);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int rc = Catch::Session().run(argc, argv);
  MPI_Comm_free(&harness_comm);
  MPI_Finalize();
  return rc;
}
