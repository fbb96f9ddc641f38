// A tier slower than recomputing (issue 27, "slowed tenfold"): under the cost policy the
// connector cuts a load where recomputing would have finished, learns the tier's cost from
// those cuts, stops asking the slow store (lookups skipped, counted), probes it now and then,
// and loads again once a probe beats recomputing. W = 2 ranks on threads; rank 1's store turns
// slow (every reply late, as behind a throttling proxy), then fast again. Every rank plans and
// loads alike throughout, and every loaded byte is the model's. No timed assertion: the slow
// store is 10-20x slower than recomputing, and the checks count calls and plans.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
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

// The memory store behind a throttle: while `slow`, every exists() answers `exists_delay` late
// and every get() `get_delay` late (or at its deadline, with timeouts, when that comes first).
struct slow_store {
  memory_store inner{64 << 20};
  std::atomic<bool> slow{false};
  std::atomic<int> exists_calls{0}, get_calls{0};
  std::chrono::milliseconds exists_delay{100}, get_delay{1000}, put_delay{0};

  std::string last_error() const { return slow ? "throttled" : ""; }
  // False: the deadline came first (the statuses say timeout).
  bool wait(std::chrono::milliseconds delay, deadline dl, std::span<chunk_status> st) const {
    if (!slow) return true;
    const clock::time_point ready = clock::now() + delay;
    std::this_thread::sleep_until(std::min(ready, dl));
    if (ready <= dl) return true;
    std::fill(st.begin(), st.end(), chunk_status::timeout);
    return false;
  }
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
    ++exists_calls;
    return wait(exists_delay, dl, st) ? inner.exists(k, st, dl) : make_error_code(errc::timeout);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> st, deadline dl) {
    ++get_calls;
    return wait(get_delay, dl, st) ? inner.get(k, d, st, dl) : make_error_code(errc::timeout);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> s,
                      std::span<chunk_status> st, deadline dl) {
    return wait(put_delay, dl, st) ? inner.put(k, s, st, dl) : make_error_code(errc::timeout);
  }
};

// One request of the stream as one rank saw it.
struct seen {
  std::uint64_t to_load = 0, loaded_end = 0;
  bool has_outcome = false;
  std::size_t wrong = 0;
  bool operator==(const seen&) const = default;
};

struct rank_run {
  std::vector<seen> requests;
  int slow_lookups_asked = 0;  // lookups that called exists() on this rank's store while it was slow
  std::uint64_t lookups_skipped = 0;
  std::vector<comm::collective_call> calls;
};

constexpr std::size_t chunks = 6, T = rig_chunk_tokens;
constexpr int fast_before = 4, slow_requests = 24, fast_after = 24;

}  // namespace

TEST_CASE("connector slow tier: loads race recomputing, a slow store is skipped and probed, hits return",
          "[connector]") {
  constexpr rank_t W = 2;
  comm::inproc_world world(W);
  std::vector<rank_run> runs(W);
  const std::vector<token_id> prompt = rig_prompt(chunks * T + 5);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    comm::recording<comm::inproc_communicator&> ctrl(c);
    slow_store store;
    host_kv_cache cache(rig_layout());
    const modulo_ownership own(W);
    connector_options opt = rig_options();
    opt.policy = load_policy::cost;
    // Recomputing the 192-token hit takes 200 ms; a fast load takes about a millisecond here,
    // a slow one 1 s (cut by the race at 200 ms).
    opt.node = {.kv_bytes_per_token = static_cast<double>(cache.value_bytes(1)), .prefill_tokens_per_s = 960};
    opt.lookup_timeout = std::chrono::seconds(1);
    opt.probe_every = 8;
    connector conn(chunker<>(rig_ns(own.geometry())), own, store, ctrl, cache.view(), opt);
    rank_run& out = runs[r];
    if (!compute_and_save(conn, cache, 1, prompt)) return;
    for (int i = 0; i < fast_before + slow_requests + fast_after; ++i) {
      if (r == 1) store.slow = i >= fast_before && i < fast_before + slow_requests;
      const int asked_before = store.exists_calls;
      const request_id id = 2 + static_cast<request_id>(i);
      seen s;
      const auto plan = lookup_agreed(conn, id, prompt);
      if (!plan) return;
      s.to_load = plan->tokens_to_load();
      host_kv_cache::sequence seq;
      if (!cache.reserve(seq, prompt.size())) return;
      if (s.to_load) {
        conn.load(id, slots_of(cache, seq, prompt.size()));
        if (!step_until(conn, [&] { return conn.load_result(id).has_value(); })) return;
        const load_outcome o = *conn.load_result(id);
        s.has_outcome = true, s.loaded_end = o.loaded_end_token;
        s.wrong = wrong_bytes(cache, seq, o.load_first_token, o.loaded_end_token);
      }
      if (store.slow) out.slow_lookups_asked += store.exists_calls > asked_before;
      if (!conn.finish(id).free_pages_now)  // no saves here: pages are free at once
        return;
      cache.release(seq);
      out.requests.push_back(s);
    }
    out.lookups_skipped = conn.counters().lookups_skipped.value();
    out.calls = ctrl.calls();
  });

  const int total = fast_before + slow_requests + fast_after;
  for (const rank_run& run : runs) {
    REQUIRE(run.requests.size() == static_cast<std::size_t>(total));
    CHECK(run.requests == runs[0].requests);  // every rank planned and loaded alike
    CHECK(run.calls == runs[0].calls);
    for (const seen& s : run.requests) CHECK(s.wrong == 0);
  }
  const std::vector<seen>& reqs = runs[0].requests;
  const auto full = [&](int i) { return reqs[i].has_outcome && reqs[i].loaded_end == chunks * T; };
  // Before: the fast tier loads the hit.
  CHECK(full(fast_before - 1));
  // While slow: the slow store is asked by the lookups that learn it is slow (a few cut loads)
  // and by the probes (one in 8), not by every lookup; the others are skipped and counted.
  INFO("rank 1 asked its slow store in " << runs[1].slow_lookups_asked << " of " << slow_requests
                                         << " lookups");
  CHECK(runs[1].slow_lookups_asked <= slow_requests / 2);
  CHECK(runs[1].lookups_skipped >= static_cast<std::uint64_t>(slow_requests / 2));
  int slow_full = 0;
  for (int i = fast_before; i < fast_before + slow_requests; ++i) slow_full += full(i);
  CHECK(slow_full == 0);  // a load slower than recomputing is cut where recomputing would be done
  // After: a probe finds the tier fast again and hits load again.
  int back = 0;
  for (int i = total - 8; i < total; ++i) back += full(i);
  CHECK(back >= 1);
}

TEST_CASE("connector slow tier: saves that cannot keep up are skipped and counted, not queued",
          "[connector]") {
  // Each put takes 300 ms; a save may take 200 ms from its start and wait 200 ms in the queue.
  // Eight saves submitted at once: the first runs out its deadline, the ones queued behind it
  // past save_timeout are skipped at once, so every request is finished within a bounded time.
  comm::inproc_world world(1);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    slow_store store;
    store.slow = true, store.put_delay = std::chrono::milliseconds(300);
    host_kv_cache cache(rig_layout());
    connector_options opt = rig_options();
    opt.save_timeout = std::chrono::milliseconds(200);
    connector conn(chunker<>(rig_ns("mod:1")), modulo_ownership(1), store, c, cache.view(), opt);
    constexpr request_id saves = 8;
    std::vector<host_kv_cache::sequence> seqs(saves);
    for (request_id id = 1; id <= saves; ++id) {
      const std::vector<token_id> prompt = rig_prompt(chunks * T, id);
      LOCKED_REQUIRE(cache.reserve(seqs[id - 1], prompt.size()));
      compute_into(cache, seqs[id - 1], 0, prompt.size());
      LOCKED_REQUIRE_FALSE(
          conn.save(id, prompt, slots_of(cache, seqs[id - 1], prompt.size()), 0, prompt.size()));
    }
    std::size_t done = 0, failed = 0;
    for (request_id id = 1; id <= saves; ++id) done += conn.finish(id).free_pages_now;  // ended already
    for (int i = 0; i < 3000 && done < saves; ++i) {  // bounded: 30 s at most
      const finished_requests f = conn.finished();
      done += f.saves.size(), failed += f.save_errors.size();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    LOCKED_CHECK(done == saves);
    LOCKED_CHECK(conn.counters().saves_skipped.value() >= 1);
    LOCKED_CHECK(conn.counters().save_failures.value() == saves);  // a skipped save is a failed one
    LOCKED_CHECK(failed == saves);
    for (auto& seq : seqs) cache.release(seq);
  });
}
