// The connector calls an engine with its own schedule needs (pcp_prefill's port): a load range
// it chooses, the prompt length apart from the keyed tokens, a per-rank cap and cancel,
// estimator samples in the engine's time, extra words in the step's one agreement,
// wait_for_save and wait_local. Each on W rank threads over the in-process communicator, with
// the recorded collective sequences compared across ranks.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "connector/connector_rig.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/locked_checks.hpp"

using namespace kvtier;
using namespace kvtier::test;

namespace {

constexpr std::size_t T = rig_chunk_tokens;
constexpr std::size_t prompt_chunks = 6;
const std::vector<token_id> the_prompt = rig_prompt(prompt_chunks * T + 7, 5);

using recorded = comm::recording<comm::inproc_communicator&>;

/// One rank's world for a test body: its connector (over a recorded control communicator and
/// `Store`), its cache, and the prompt computed and saved as request 1 (when `saved`).
template <class Store = memory_store>
struct rank_env {
  recorded& ctrl;
  Store& store;
  host_kv_cache cache{rig_layout()};
  connector<Store, recorded, recorded, modulo_ownership> conn;

  rank_env(recorded& c, Store& s, rank_t world, connector_options opt)
      : ctrl(c),
        store(s),
        conn(chunker<>(rig_ns(modulo_ownership(world).geometry())), modulo_ownership(world), s, c,
             cache.view(), opt) {}
};

/// Runs body(env) on W rank threads; each rank's store is made by make_store(rank, memory_store&).
template <class Body, class MakeStore>
void on_ranks(rank_t W, const connector_options& opt, bool saved, MakeStore make_store, Body body) {
  comm::inproc_world world(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    recorded ctrl(c);
    memory_store mem(64 << 20);
    auto store = make_store(c.rank(), mem);
    using store_t = std::remove_reference_t<decltype(*store)>;
    rank_env<store_t> env(ctrl, *store, W, opt);
    if (saved) {
      const bool ok = compute_and_save(env.conn, env.cache, 1, the_prompt);
      LOCKED_REQUIRE(ok);
    }
    body(env, c.rank());
  });
}
template <class Body>
void on_ranks(rank_t W, const connector_options& opt, bool saved, Body body) {
  on_ranks(
      W, opt, saved, [](rank_t, memory_store& m) { return &m; }, body);
}

/// All calls each rank recorded, to compare across ranks after the run.
struct call_log {
  std::mutex mu;
  std::vector<std::vector<comm::collective_call>> calls;
  explicit call_log(rank_t W) : calls(W) {}
  void keep(rank_t r, const recorded& c) {
    std::lock_guard lock(mu);
    calls[r] = c.calls();
  }
  bool same() const {
    for (const auto& c : calls)
      if (c != calls[0]) return false;
    return true;
  }
};

/// Zeroes the pages of positions [0, end) (fresh pages may hold an earlier request's bytes).
inline void poison(host_kv_cache& cache, const host_kv_cache::sequence& seq, std::uint64_t end) {
  std::vector<std::byte> zero(cache.layout().layer_bytes_per_token() * cache.layout().num_layers);
  for (std::uint64_t p = 0; p < end; ++p) cache.scatter(seq, p, 1, zero);
}

/// Looks up request 2 (the saved prompt) and loads [first, end) of it; steps until its outcome
/// is agreed (an agreed condition: every rank steps alike).
template <class Env>
std::optional<load_outcome> load_range(Env& env, host_kv_cache::sequence& seq, std::uint64_t first,
                                       std::uint64_t end) {
  if (!lookup_agreed(env.conn, 2, the_prompt)) return std::nullopt;
  if (!env.cache.reserve(seq, the_prompt.size())) return std::nullopt;
  poison(env.cache, seq, the_prompt.size());
  env.conn.load(2, slots_of(env.cache, seq, the_prompt.size()), first, end);
  if (!step_until(env.conn, [&] { return env.conn.load_result(2).has_value(); })) return std::nullopt;
  return env.conn.load_result(2);
}

}  // namespace

TEST_CASE("connector load range: the engine's range of whole chunks inside the plan is what loads",
          "[connector]") {
  for (rank_t W : {1u, 2u, 3u}) {
    INFO("W = " << W);
    call_log log(W);
    on_ranks(W, {}, true, [&](auto& env, rank_t r) {
      host_kv_cache::sequence seq;
      const auto out = load_range(env, seq, 2 * T, 5 * T);
      LOCKED_REQUIRE(out);
      LOCKED_CHECK(out->load_first_token == 2 * T);
      LOCKED_CHECK(out->loaded_end_token == 5 * T);
      LOCKED_CHECK(out->complete());
      LOCKED_CHECK(env.conn.load_errors(2).empty());
      LOCKED_CHECK(wrong_bytes(env.cache, seq, 2 * T, 5 * T) == 0);
      // Outside the range the pages were never written: chunk 1 and chunk 5 still differ.
      LOCKED_CHECK(wrong_bytes(env.cache, seq, T, 2 * T) > 0);
      LOCKED_CHECK(wrong_bytes(env.cache, seq, 5 * T, 6 * T) > 0);
      env.conn.finish(2);
      log.keep(r, env.ctrl);
    });
    CHECK(log.same());
  }
}

TEST_CASE("connector load range: a range that is not whole chunks inside the plan is refused by name",
          "[connector]") {
  on_ranks(1, {}, true, [&](auto& env, rank_t) {
    const auto plan = lookup_agreed(env.conn, 2, the_prompt);
    LOCKED_REQUIRE(plan);
    LOCKED_REQUIRE(plan->load_end_token == 6 * T);
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(env.cache.reserve(seq, the_prompt.size()));
    const auto slots = slots_of(env.cache, seq, the_prompt.size());
    const auto refused = [&](std::uint64_t a, std::uint64_t b) {
      try {
        env.conn.load(2, slots, a, b);
      } catch (const std::invalid_argument& e) {
        return std::string(e.what()).find("not whole chunks") != std::string::npos;
      }
      return false;
    };
    LOCKED_CHECK(refused(T + 1, 3 * T));  // not a chunk boundary
    LOCKED_CHECK(refused(T, 3 * T - 1));
    LOCKED_CHECK(refused(3 * T, 3 * T));                                    // empty
    LOCKED_CHECK(refused(4 * T, 2 * T));                                    // reversed
    LOCKED_CHECK(refused(0, 7 * T));                                        // past the plan
    LOCKED_CHECK(env.conn.load(3, slots, 0, T) == errc::invalid_argument);  // unknown id
    LOCKED_CHECK_FALSE(env.conn.load(2, slots, 0, T));                      // a refused range started nothing
    LOCKED_CHECK(env.conn.load(2, slots, 0, T) == errc::invalid_argument);  // already loading
    const bool ended = step_until(env.conn, [&] { return env.conn.load_result(2).has_value(); });
    LOCKED_REQUIRE(ended);
    LOCKED_CHECK(env.conn.load_result(2)->loaded_end_token == T);
    env.conn.finish(2);
  });
}

TEST_CASE("connector load range: ranks that load different ranges fail together, nothing loaded",
          "[connector]") {
  call_log log(2);
  on_ranks(2, {}, true, [&](auto& env, rank_t r) {
    host_kv_cache::sequence seq;
    const auto out = load_range(env, seq, r == 0 ? 0 : T, 4 * T);
    LOCKED_REQUIRE(out);
    LOCKED_CHECK(out->loaded_end_token == out->load_first_token);  // nothing loaded, on both ranks
    LOCKED_CHECK(env.conn.counters().agreement_failures.value() > 0);
    env.conn.finish(2);
    log.keep(r, env.ctrl);
  });
  CHECK(log.same());
}
