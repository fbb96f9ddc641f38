// The connector calls an engine with its own schedule needs (pcp_prefill's port): a load range
// it chooses, the prompt length apart from the keyed tokens, a per-rank cap and cancel,
// estimator samples in the engine's time, extra words in the step's one agreement,
// wait_for_save and wait_local. Each on W rank threads over the in-process communicator, with
// the recorded collective sequences compared across ranks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
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
    on_ranks(W, rig_options(), true, [&](auto& env, rank_t r) {
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
  on_ranks(1, rig_options(), true, [&](auto& env, rank_t) {
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
  on_ranks(2, rig_options(), true, [&](auto& env, rank_t r) {
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

TEST_CASE("connector prompt length: a prompt keyed only in part plans with its whole length", "[connector]") {
  call_log log(2);
  const std::uint64_t keyed = 4 * T + 5;
  on_ranks(2, rig_options(), true, [&](auto& env, rank_t r) {
    env.conn.begin_lookup(2, std::span(the_prompt).first(keyed), the_prompt.size());
    const bool agreed = step_until(env.conn, [&] { return env.conn.lookup(2).has_value(); });
    LOCKED_REQUIRE(agreed);
    const load_plan plan = *env.conn.lookup(2);
    LOCKED_CHECK(plan.cached_tokens == 4 * T);  // only keyed chunks are looked up
    LOCKED_CHECK(plan.load_end_token == 4 * T);
    LOCKED_CHECK(plan.prompt_tokens == the_prompt.size());
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(env.cache.reserve(seq, the_prompt.size()));
    LOCKED_REQUIRE_FALSE(env.conn.load(2, slots_of(env.cache, seq, the_prompt.size())));
    const bool ended = step_until(env.conn, [&] { return env.conn.load_result(2).has_value(); });
    LOCKED_REQUIRE(ended);
    LOCKED_CHECK(env.conn.load_result(2)->loaded_end_token == 4 * T);
    LOCKED_CHECK(wrong_bytes(env.cache, seq, 0, 4 * T) == 0);
    env.conn.finish(2);
    // The plain form: the prompt is the keyed tokens.
    const auto plain = lookup_agreed(env.conn, 3, std::span(the_prompt).first(keyed));
    LOCKED_REQUIRE(plain);
    LOCKED_CHECK(plain->prompt_tokens == keyed);
    env.conn.finish(3);
    bool refused = false;
    try {
      env.conn.begin_lookup(4, the_prompt, the_prompt.size() - 1);
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("prompt_tokens") != std::string::npos;
    }
    LOCKED_CHECK(refused);
    log.keep(r, env.ctrl);
  });
  CHECK(log.same());
}

TEST_CASE("connector prompt length: ranks with different prompt lengths fail the lookup together",
          "[connector]") {
  call_log log(2);
  on_ranks(2, rig_options(), true, [&](auto& env, rank_t r) {
    env.conn.begin_lookup(2, the_prompt, the_prompt.size() + r);
    const bool agreed = step_until(env.conn, [&] { return env.conn.lookup(2).has_value(); });
    LOCKED_REQUIRE(agreed);
    LOCKED_CHECK(env.conn.lookup(2)->cached_tokens == 0);
    LOCKED_CHECK(env.conn.counters().agreement_failures.value() > 0);
    env.conn.finish(2);
    log.keep(r, env.ctrl);
  });
  CHECK(log.same());
}

namespace {

/// Loads the whole plan of request 2 on W ranks; `after_load(conn, rank)` right after load().
template <class After>
std::vector<std::optional<load_outcome>> capped_load(rank_t W, After after_load) {
  std::vector<std::optional<load_outcome>> out(W);
  call_log log(W);
  const connector_options opt = rig_options();  // only the caps end the loads short
  on_ranks(W, opt, true, [&](auto& env, rank_t r) {
    const bool looked = lookup_agreed(env.conn, 2, the_prompt).has_value();
    LOCKED_REQUIRE(looked);
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(env.cache.reserve(seq, the_prompt.size()));
    LOCKED_REQUIRE_FALSE(env.conn.load(2, slots_of(env.cache, seq, the_prompt.size())));
    after_load(env.conn, r);
    const bool ended = step_until(env.conn, [&] { return env.conn.load_result(2).has_value(); });
    LOCKED_REQUIRE(ended);
    const load_outcome o = *env.conn.load_result(2);
    LOCKED_CHECK(wrong_bytes(env.cache, seq, 0, o.loaded_end_token) == 0);
    LOCKED_CHECK(env.conn.limit_load(2, 1) == errc::invalid_argument);  // its outcome is agreed
    env.conn.finish(2);
    log.keep(r, env.ctrl);
    std::lock_guard lock(log.mu);
    out[r] = o;
  });
  CHECK(log.same());
  return out;
}

}  // namespace

TEST_CASE("connector limit_load: one rank's cap ends every rank's load at the same prefix", "[connector]") {
  for (rank_t W : {2u, 3u}) {
    for (rank_t capped = 0; capped < W; ++capped) {
      INFO("W = " << W << ", capped rank " << capped);
      const auto out = capped_load(W, [&](auto& conn, rank_t r) {
        if (r != capped) return;
        LOCKED_CHECK_FALSE(conn.limit_load(2, 3));
        LOCKED_CHECK_FALSE(conn.limit_load(2, 5));  // only lowers: 3 stays
      });
      for (const auto& o : out) {
        REQUIRE(o);
        CHECK(o->loaded_end_token == 3 * T);
        CHECK(o->requested_end_token == 6 * T);
      }
    }
  }
  on_ranks(1, rig_options(), false, [&](auto& env, rank_t) {
    LOCKED_CHECK(env.conn.limit_load(9, 1) == errc::invalid_argument);  // unknown id
    LOCKED_CHECK(env.conn.cancel_load(9) == errc::invalid_argument);
  });
}

TEST_CASE("connector cancel_load: one rank cancels and no rank loads anything", "[connector]") {
  for (rank_t W : {1u, 2u, 3u}) {
    INFO("W = " << W);
    const auto out = capped_load(W, [&](auto& conn, rank_t r) {
      if (r == W - 1) LOCKED_CHECK_FALSE(conn.cancel_load(2));
    });
    for (const auto& o : out) {
      REQUIRE(o);
      CHECK(o->loaded_end_token == 0);
      CHECK_FALSE(o->complete());
    }
  }
}

TEST_CASE("connector record_load_sample: the engine's samples only, with wall-clock samples off",
          "[connector]") {
  for (bool wall : {true, false}) {
    INFO("wall_clock_samples = " << wall);
    connector_options opt = rig_options();
    opt.wall_clock_samples = wall;
    on_ranks(2, opt, true, [&](auto& env, rank_t) {
      host_kv_cache::sequence seq;
      const auto out = load_range(env, seq, 0, 6 * T);
      LOCKED_REQUIRE(out);
      LOCKED_CHECK(out->complete());
      LOCKED_CHECK(env.conn.estimator().samples() == (wall ? 1u : 0u));
      const load_path before = env.conn.estimator().estimate();
      if (!wall) LOCKED_CHECK(before.bandwidth_gb_per_s == opt.prior.bandwidth_gb_per_s);
      LOCKED_CHECK_FALSE(env.conn.record_load_sample(64 << 20, 0.5));  // 0.13 GB/s: far from the prior
      LOCKED_CHECK(env.conn.estimator().samples() == (wall ? 2u : 1u));
      const load_path after = env.conn.estimator().estimate();  // one size: T0 refits, B stays
      LOCKED_CHECK(after.fixed_cost_s != before.fixed_cost_s);
      const double nan = std::numeric_limits<double>::quiet_NaN(),
                   inf = std::numeric_limits<double>::infinity();
      for (const auto& [bytes, s] :
           std::vector<std::pair<std::uint64_t, double>>{{0, 1.0}, {1, 0.0}, {1, -1.0}, {1, nan}, {1, inf}})
        LOCKED_CHECK(env.conn.record_load_sample(bytes, s) == errc::invalid_argument);
      LOCKED_CHECK(env.conn.estimator().samples() == (wall ? 2u : 1u));
      env.conn.finish(2);
    });
  }
}

TEST_CASE("connector record_load_sample: ranks whose estimates differ fail the cost policy's lookup together",
          "[connector]") {
  for (bool same : {true, false}) {
    INFO("the same samples on every rank: " << same);
    connector_options opt = rig_options();
    opt.policy = load_policy::cost;
    opt.node = {.kv_bytes_per_token = 1e3, .prefill_tokens_per_s = 100};  // recomputing is slow: load
    opt.wall_clock_samples = false;
    call_log log(2);
    on_ranks(2, opt, true, [&](auto& env, rank_t r) {
      if (same || r == 0) LOCKED_CHECK_FALSE(env.conn.record_load_sample(1 << 20, 0.01));
      const auto plan = lookup_agreed(env.conn, 2, the_prompt);
      LOCKED_REQUIRE(plan);
      LOCKED_CHECK(plan->cached_tokens == (same ? 6 * T : 0));
      LOCKED_CHECK(plan->tokens_to_load() == (same ? 6 * T : 0));
      LOCKED_CHECK(env.conn.counters().agreement_failures.value() == (same ? 0u : 1u));
      env.conn.finish(2);
      log.keep(r, env.ctrl);
    });
    CHECK(log.same());
  }
}

namespace {

std::size_t all_reduces(const recorded& c) {
  std::size_t n = 0;
  for (const comm::collective_call& k : c.calls()) n += k.op == comm::op_kind::all_reduce;
  return n;
}

}  // namespace

TEST_CASE("connector step words: the engine's words are agreed (min) in the step's one all-reduce",
          "[connector]") {
  for (rank_t W : {1u, 2u, 3u}) {
    INFO("W = " << W);
    call_log log(W);
    on_ranks(W, rig_options(), true, [&](auto& env, rank_t r) {
      const auto plan = lookup_agreed(env.conn, 2, the_prompt);
      LOCKED_REQUIRE(plan);
      host_kv_cache::sequence seq;
      LOCKED_REQUIRE(env.cache.reserve(seq, the_prompt.size()));
      LOCKED_REQUIRE_FALSE(env.conn.load(2, slots_of(env.cache, seq, the_prompt.size())));
      // Step with words until the load's outcome is agreed (an agreed condition).
      const std::size_t before = all_reduces(env.ctrl);
      std::size_t steps = 0;
      bool words_ok = true;
      while (!env.conn.load_result(2) && steps < 20000) {
        std::uint64_t w[3] = {10 + r, ~std::uint64_t{r}, 7};
        const auto ec = env.conn.step(deadline_after(std::chrono::seconds(2)), w);
        ++steps;
        words_ok = words_ok && !ec && w[0] == 10 && ~w[1] == W - 1 && w[2] == 7;
      }
      LOCKED_CHECK(words_ok);
      LOCKED_REQUIRE(env.conn.load_result(2));
      LOCKED_CHECK(env.conn.load_result(2)->complete());
      LOCKED_CHECK(all_reduces(env.ctrl) - before == steps);  // one collective per step, words included
      env.conn.finish(2);
      // Nothing waits: a step with words still agrees them; one without issues nothing.
      std::uint64_t w[1] = {100 + r};
      const auto ec = env.conn.step(deadline_after(std::chrono::seconds(2)), w);
      LOCKED_CHECK_FALSE(ec);
      LOCKED_CHECK(w[0] == 100);
      const std::size_t quiet = all_reduces(env.ctrl);
      LOCKED_CHECK_FALSE(env.conn.step(deadline_after(std::chrono::seconds(2))));
      LOCKED_CHECK(all_reduces(env.ctrl) == quiet);
      log.keep(r, env.ctrl);
    });
    CHECK(log.same());
  }
}

TEST_CASE("connector step words: a different word count fails the step on every rank, words zeroed",
          "[connector]") {
  on_ranks(2, rig_options(), false, [&](auto& env, rank_t r) {
    std::vector<std::uint64_t> w(2 + r, 5);
    const auto ec = env.conn.step(deadline_after(std::chrono::seconds(2)), w);
    LOCKED_CHECK(ec);
    LOCKED_CHECK(w == std::vector<std::uint64_t>(2 + r, 0));
  });
}

namespace {

// The memory store with a gate on put() (a save that cannot end until opened) and, when
// stall_gets, a get() that answers (timeout) only once gets_open or at its deadline: a
// stalled server, released by the test rather than by the clock.
struct gated_store {
  memory_store& inner;
  bool stall_gets = false;
  bool refuse_puts = false;  // a put refused as a server with a wrong password refuses it
  std::mutex mu;
  std::condition_variable cv;
  bool open = true, gets_open = false;

  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
    return inner.exists(k, st, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> st, deadline dl) {
    if (!stall_gets) return inner.get(k, d, st, dl);
    {
      std::unique_lock lock(mu);
      cv.wait_until(lock, std::min(dl, clock::now() + std::chrono::seconds(20)), [&] { return gets_open; });
    }
    std::fill(st.begin(), st.end(), chunk_status::timeout);
    return make_error_code(errc::timeout);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> s,
                      std::span<chunk_status> st, deadline dl) {
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::seconds(20), [&] { return open; });
    }
    if (!refuse_puts) return inner.put(k, s, st, dl);
    std::fill(st.begin(), st.end(), chunk_status::error);
    return make_error_code(errc::auth_failed);
  }
  std::string last_error() const { return refuse_puts ? "WRONGPASS invalid username-password pair" : ""; }
  void set_open(bool o) {
    std::lock_guard lock(mu);
    open = o;
    cv.notify_all();
  }
  void open_gets() {
    std::lock_guard lock(mu);
    gets_open = true;
    cv.notify_all();
  }
};

}  // namespace

TEST_CASE("connector wait_for_save: returns once the request's saves ended, before or after finish",
          "[connector]") {
  on_ranks(
      1, rig_options(), false, [](rank_t, memory_store& m) { return std::make_unique<gated_store>(m); },
      [&](auto& env, rank_t) {
        const auto plan = lookup_agreed(env.conn, 1, the_prompt);
        LOCKED_REQUIRE(plan);
        host_kv_cache::sequence seq;
        LOCKED_REQUIRE(env.cache.reserve(seq, the_prompt.size()));
        compute_into(env.cache, seq, 0, the_prompt.size());
        const auto slots = slots_of(env.cache, seq, the_prompt.size());
        const auto short_wait = [] { return deadline_after(std::chrono::milliseconds(30)); };
        const auto long_wait = [] { return deadline_after(std::chrono::seconds(20)); };
        env.store.set_open(false);
        LOCKED_REQUIRE_FALSE(env.conn.save(1, slots, 0, 3 * T));
        LOCKED_CHECK(env.conn.wait_for_save(1, short_wait()) == errc::timeout);  // the put cannot end yet
        env.store.set_open(true);
        LOCKED_CHECK_FALSE(env.conn.wait_for_save(1, long_wait()));
        LOCKED_CHECK(env.conn.counters().chunks_saved.value() == 3);
        env.store.set_open(false);  // and after finish()
        LOCKED_REQUIRE_FALSE(env.conn.save(1, slots, 3 * T, 6 * T));
        LOCKED_CHECK_FALSE(env.conn.finish(1).free_pages_now);
        LOCKED_CHECK(env.conn.wait_for_save(1, short_wait()) == errc::timeout);
        env.store.set_open(true);
        LOCKED_CHECK_FALSE(env.conn.wait_for_save(1, long_wait()));
        LOCKED_CHECK(env.conn.counters().chunks_saved.value() == 6);
        LOCKED_CHECK(env.conn.finished().saves == std::vector<request_id>{1});
        LOCKED_CHECK(env.conn.wait_for_save(1, short_wait()) == errc::invalid_argument);  // listed: gone
        LOCKED_CHECK(env.conn.wait_for_save(99, short_wait()) == errc::invalid_argument);
      });
}

TEST_CASE("connector save errors: the reason after wait_for_save, and in finished() before or after finish",
          "[connector]") {
  on_ranks(
      2, rig_options(), false,
      [](rank_t r, memory_store& m) {
        auto s = std::make_unique<gated_store>(m);
        s->refuse_puts = r == 1;
        return s;
      },
      [&](auto& env, rank_t r) {
        host_kv_cache::sequence seq;
        LOCKED_REQUIRE(env.cache.reserve(seq, the_prompt.size()));
        compute_into(env.cache, seq, 0, the_prompt.size());
        const auto slots = slots_of(env.cache, seq, the_prompt.size());
        const std::string why = "rank 1: save of chunk 1: " + make_error_code(errc::auth_failed).message() +
                                " (store: WRONGPASS invalid username-password pair)";
        // Its saves ended before finish(): errors() after wait_for_save, then the next finished().
        LOCKED_REQUIRE_FALSE(env.conn.save(7, the_prompt, slots, 0, 6 * T));
        LOCKED_REQUIRE_FALSE(env.conn.wait_for_save(7, deadline_after(std::chrono::seconds(30))));
        const std::vector<request_error> e = env.conn.errors(7);
        LOCKED_REQUIRE(e.size() == (r == 1 ? 1u : 0u));  // only the rank that failed has a reason
        if (r == 1) {
          LOCKED_CHECK(e[0].what == request_error::stage::save);
          LOCKED_CHECK(e[0].chunk == 1);  // rank 1's first chunk
          LOCKED_CHECK(e[0].ec == errc::auth_failed);
          LOCKED_CHECK(e[0].message == why);
        }
        LOCKED_CHECK(env.conn.finish(7).free_pages_now);
        finished_requests f = env.conn.finished();
        LOCKED_CHECK(f.saves.empty());
        LOCKED_REQUIRE(f.save_errors.size() == (r == 1 ? 1u : 0u));
        if (r == 1) LOCKED_CHECK((f.save_errors[0].id == 7 && f.save_errors[0].message == why));
        LOCKED_CHECK(env.conn.finished().save_errors.empty());  // reported once
        // Its saves end after finish(): the finished() that lists the request has its reason.
        env.store.set_open(false);
        LOCKED_REQUIRE_FALSE(env.conn.save(8, the_prompt, slots, 0, 6 * T));
        LOCKED_CHECK_FALSE(env.conn.finish(8).free_pages_now);  // the put cannot end yet
        env.store.set_open(true);
        std::vector<request_error> later;
        bool listed = false;
        for (int i = 0; i < 20000 && !listed; ++i) {
          f = env.conn.finished();
          later.insert(later.end(), f.save_errors.begin(), f.save_errors.end());
          listed = std::count(f.saves.begin(), f.saves.end(), request_id{8}) == 1;
          if (!listed) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        LOCKED_REQUIRE(listed);
        LOCKED_REQUIRE(later.size() == (r == 1 ? 1u : 0u));
        if (r == 1) LOCKED_CHECK((later[0].id == 8 && later[0].message == why));
        env.cache.release(seq);
      });
}

TEST_CASE("connector wait_local: a stalled store's rank times out by the caller's deadline", "[connector]") {
  const connector_options opt = rig_options();  // the stalled get ends when the test says
  call_log log(2);
  on_ranks(
      2, opt, true,
      [](rank_t r, memory_store& m) {
        auto s = std::make_unique<gated_store>(m);
        s->stall_gets = r == 1;
        return s;
      },
      [&](auto& env, rank_t r) {
        LOCKED_CHECK(env.conn.wait_local(2, deadline_after(std::chrono::milliseconds(10))) ==
                     errc::invalid_argument);  // unknown id
        const auto plan = lookup_agreed(env.conn, 2, the_prompt);
        LOCKED_REQUIRE(plan);
        LOCKED_CHECK(env.conn.wait_local(2, deadline_after(std::chrono::milliseconds(10))) ==
                     errc::invalid_argument);  // no load started
        host_kv_cache::sequence seq;
        LOCKED_REQUIRE(env.cache.reserve(seq, the_prompt.size()));
        LOCKED_REQUIRE_FALSE(env.conn.load(2, slots_of(env.cache, seq, the_prompt.size())));
        if (r == 1) {
          const auto waited = env.conn.wait_local(2, deadline_after(std::chrono::milliseconds(30)));
          LOCKED_CHECK(waited == errc::timeout);  // its get has not answered
          env.store.open_gets();                  // now it answers: timeout for every key
        } else {
          const auto waited = env.conn.wait_local(2, deadline_after(std::chrono::seconds(20)));
          LOCKED_CHECK_FALSE(waited);  // this rank's own fetch ended
        }
        const bool ended = step_until(env.conn, [&] { return env.conn.load_result(2).has_value(); });
        LOCKED_REQUIRE(ended);
        LOCKED_CHECK(env.conn.load_result(2)->loaded_end_token < 2 * T);  // rank 1 owns chunk 1
        LOCKED_CHECK(wrong_bytes(env.cache, seq, 0, env.conn.load_result(2)->loaded_end_token) == 0);
        env.conn.finish(2);
        log.keep(r, env.ctrl);
      });
  CHECK(log.same());
}
