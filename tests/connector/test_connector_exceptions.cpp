// Exceptions out of the parts a connector calls (issue 26, items 3 and 4): a store whose get,
// exists or put throws, and a data communicator that throws in the mover's thread. None may end
// the process; each ends its own request's part the way a returned error does: a load or lookup
// agreed short on every rank, a save failed and counted, and the rank that saw the exception
// names the chunk and the exception's words in errors(id). And cancel_load (whose fetch the
// queue completes as cancelled) still records no error.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "connector/connector_rig.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/locked_checks.hpp"

using namespace kvtier;
using namespace kvtier::test;

namespace {

constexpr std::size_t T = rig_chunk_tokens;
constexpr auto long_wait = std::chrono::seconds(60);  // never reached unless something hangs

enum class thrown { runtime_error, bad_alloc };

// The memory store, with calls that throw once armed: exists() always, get() from its
// `get_from`-th call on (0-based, counted once armed), put() always (after waiting at `put_hold`
// when `hold_puts`). The exception is std::runtime_error("injected: <call> threw") or
// std::bad_alloc.
struct throwing_store {
  memory_store& inner;
  std::atomic<bool> exists_throws{false}, get_throws{false}, put_throws{false}, hold_puts{false};
  int get_from = 0;
  thrown what = thrown::runtime_error;
  std::atomic<int> gets{0};
  hold_point put_hold;

  [[noreturn]] void raise(const char* call) const {
    if (what == thrown::bad_alloc) throw std::bad_alloc();
    throw std::runtime_error(std::string("injected: ") + call + " threw");
  }
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
    if (exists_throws) raise("exists");
    return inner.exists(k, st, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> st, deadline dl) {
    if (get_throws && gets++ >= get_from) raise("get");
    return inner.get(k, d, st, dl);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> s,
                      std::span<chunk_status> st, deadline dl) {
    if (hold_puts) put_hold.arrive(dl);
    if (put_throws) raise("put");
    return inner.put(k, s, st, dl);
  }
};

// The words a thrown exception is named by in a reason.
std::string words_of(thrown what, const char* call) {
  return what == thrown::bad_alloc ? std::string("std::bad_alloc")
                                   : std::string("injected: ") + call + " threw";
}

// The one reason of the rank whose store threw: its stage, request, chunk, errc::store_threw and
// "rank R: <stage> of chunk C: the store threw: <words>". Called from rank threads too: no INFO
// (Catch's message stack is not thread-safe), the message shows in the expansion instead.
void check_thrown_reason(const std::vector<request_error>& reasons, request_error::stage stage, request_id id,
                         rank_t rank, std::size_t chunk, const std::string& words) {
  LOCKED_REQUIRE(reasons.size() == 1);
  const request_error& e = reasons.front();
  LOCKED_CHECK(e.what == stage);
  LOCKED_CHECK(e.id == id);
  LOCKED_CHECK(e.chunk == chunk);
  LOCKED_CHECK(e.ec == errc::store_threw);
  const std::string head = "rank " + std::to_string(rank) + ": " + std::string(to_string(stage)) +
                           " of chunk " + std::to_string(chunk) + ": the store threw: " + words;
  LOCKED_CHECK(e.message.substr(0, head.size()) == head);
}

// run_load (connector_rig.hpp) with a throwing_store per rank; `arm(store)` runs on rank `bad`
// after request 1 was computed and saved, before request 2 is looked up.
template <class Arm>
std::vector<rank_load_report> run_armed(load_scenario sc, rank_t bad, Arm arm) {
  std::vector<throwing_store*> stores(sc.world, nullptr);
  sc.after_save = [&, bad](rank_t r) {
    if (r == bad) arm(*stores[r]);
  };
  return run_load(sc, [&](rank_t r, memory_store& m) {
    auto s = std::make_unique<throwing_store>(m);
    stores[r] = s.get();
    return s;
  });
}

}  // namespace

TEST_CASE("connector: a store whose get throws ends the load short on every rank, and says why",
          "[connector]") {
  constexpr rank_t W = 2;
  for (bool two : {false, true}) {
    for (int from : {0, 1}) {  // the first get of the load throws, or the second (one chunk landed)
      for (rank_t bad = 0; bad < W; ++bad) {
        INFO("two communicators = " << two << ", get number " << from << " throws on rank " << bad);
        load_scenario sc{.world = W, .two_comms = two};
        const auto reps = run_armed(sc, bad, [from](throwing_store& s) {
          s.get_from = from;
          s.get_throws = true;
        });
        // The rank's owned chunks are bad, bad + W, ...: the throwing call's chunk fails.
        const std::size_t failed_chunk = bad + static_cast<std::size_t>(from) * W;
        for (const rank_load_report& rep : reps) {
          LOCKED_REQUIRE(rep.plan);
          LOCKED_CHECK(rep.plan->cached_tokens == 6 * T);
          LOCKED_REQUIRE(rep.outcome);
          LOCKED_CHECK(rep.outcome->loaded_end_token == failed_chunk * T);
          LOCKED_REQUIRE(rep.errors.size() == 6 - failed_chunk);
          LOCKED_CHECK(rep.errors.front() == failed_chunk);
          LOCKED_CHECK(rep.wrong == 0);
          LOCKED_CHECK(rep.calls == reps[0].calls);
        }
        for (rank_t r = 0; r < W; ++r)
          if (r != bad) LOCKED_CHECK(reps[r].reasons.empty());
        check_thrown_reason(reps[bad].reasons, request_error::stage::load, 2, bad, failed_chunk,
                            words_of(thrown::runtime_error, "get"));
      }
    }
  }
}

TEST_CASE("connector: a store whose exists throws answers nothing cached, and says why", "[connector]") {
  constexpr rank_t W = 2;
  for (rank_t bad = 0; bad < W; ++bad) {
    INFO("exists throws on rank " << bad);
    const auto reps = run_armed({.world = W}, bad, [](throwing_store& s) { s.exists_throws = true; });
    for (const rank_load_report& rep : reps) {
      LOCKED_REQUIRE(rep.plan);
      LOCKED_CHECK(rep.plan->cached_tokens == bad * T);        // the bad rank's first owned chunk
      if (rep.outcome) LOCKED_CHECK(rep.outcome->complete());  // what was cached loads whole
    }
    for (rank_t r = 0; r < W; ++r)
      if (r != bad) LOCKED_CHECK(reps[r].reasons.empty());
    check_thrown_reason(reps[bad].reasons, request_error::stage::lookup, 2, bad, bad,
                        words_of(thrown::runtime_error, "exists"));
  }
}

TEST_CASE("connector cancel_load: the cancelled fetch records no error", "[connector]") {
  constexpr rank_t W = 2;
  for (rank_t canceller = 0; canceller < W; ++canceller) {
    INFO("rank " << canceller << " cancels while its get runs");
    comm::inproc_world world(W);
    const std::vector<token_id> prompt = rig_prompt(6 * T + 7);
    comm::run_ranks(world, [&](comm::inproc_communicator& c) {
      const rank_t r = c.rank();
      memory_store mem(64 << 20);
      // A get that waits until the test lets it go, so the fetch is still running at cancel.
      struct held_get {
        memory_store& inner;
        std::atomic<bool> hold{false};
        hold_point at;
        std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
          return inner.exists(k, st, dl);
        }
        std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                            std::span<chunk_status> st, deadline dl) {
          if (hold.exchange(false)) at.arrive(dl);
          return inner.get(k, d, st, dl);
        }
        std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> s,
                            std::span<chunk_status> st, deadline dl) {
          return inner.put(k, s, st, dl);
        }
      } store{mem};
      host_kv_cache cache(rig_layout());
      connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, c, cache.view(), rig_options());
      const bool saved = compute_and_save(conn, cache, 1, prompt);
      LOCKED_REQUIRE(saved);
      const auto plan = lookup_agreed(conn, 2, prompt);
      LOCKED_REQUIRE(plan);
      LOCKED_REQUIRE(plan->tokens_to_load() == 6 * T);
      host_kv_cache::sequence seq;
      LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
      if (r == canceller) store.hold = true;
      LOCKED_REQUIRE_FALSE(conn.load(2, slots_of(cache, seq, prompt.size())));
      if (r == canceller) {
        const bool running = store.at.wait_reached(long_wait);
        LOCKED_REQUIRE(running);
        LOCKED_CHECK_FALSE(conn.cancel_load(2));
        store.at.release();
        // The fetch completes (as cancelled) before the step that reads it.
        const auto fetched = conn.wait_local(2, deadline_after(long_wait));
        LOCKED_CHECK_FALSE(fetched);
      }
      const bool ended = step_until(conn, [&] { return conn.load_result(2).has_value(); });
      LOCKED_REQUIRE(ended);
      LOCKED_CHECK(conn.load_result(2)->loaded_end_token == 0);
      LOCKED_CHECK(conn.load_errors(2).size() == 6);
      const std::vector<request_error> why = conn.errors(2);
      LOCKED_CHECK((why.empty() ? std::string() : why.front().message) == std::string());
      conn.finish(2);
      cache.release(seq);
    });
  }
}

TEST_CASE("connector: a store whose put throws fails the save, and the process and the saver live on",
          "[connector]") {
  constexpr rank_t W = 2;
  for (bool by_layer : {false, true}) {
    for (thrown what : {thrown::runtime_error, thrown::bad_alloc}) {
      INFO((by_layer ? "by layer" : "whole")
           << ", put throws " << (what == thrown::bad_alloc ? "std::bad_alloc" : "runtime_error"));
      comm::inproc_world world(W);
      const std::vector<token_id> prompt = rig_prompt(6 * T + 7);
      comm::run_ranks(world, [&](comm::inproc_communicator& c) {
        const rank_t r = c.rank();
        memory_store mem(64 << 20);
        throwing_store store{mem};
        store.what = what;
        host_kv_cache cache(rig_layout());
        connector_options opt = rig_options();
        opt.layers_per_group = 2;  // two groups: a save by layer gathers twice, then puts
        connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, c, cache.view(), opt);
        const auto plan = lookup_agreed(conn, 1, prompt);
        LOCKED_REQUIRE(plan);
        host_kv_cache::sequence seq;
        LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
        compute_into(cache, seq, 0, prompt.size());
        const auto slots = slots_of(cache, seq, prompt.size());
        store.put_throws = true;
        store.hold_puts = true;  // the put waits until finish() below has seen the save pending
        if (by_layer) {
          LOCKED_REQUIRE_FALSE(conn.begin_save(1, slots, 0, prompt.size()));
          for (std::uint32_t l = 0; l < rig_layers; ++l) LOCKED_REQUIRE_FALSE(conn.save_layer(1, l));
        } else {
          LOCKED_REQUIRE_FALSE(conn.save(1, slots, 0, prompt.size()));
        }
        const bool putting = store.put_hold.wait_reached(long_wait);
        LOCKED_REQUIRE(putting);
        LOCKED_CHECK_FALSE(conn.finish(1).free_pages_now);  // the save still reads the pages
        LOCKED_CHECK(conn.finished().saves.empty());
        store.put_hold.release();
        LOCKED_CHECK_FALSE(conn.wait_for_save(1, deadline_after(long_wait)));
        const std::vector<request_error> why = conn.errors(1);
        check_thrown_reason(why, request_error::stage::save, 1, r, r, words_of(what, "put"));
        LOCKED_CHECK(conn.counters().save_failures.value() == 1);
        LOCKED_CHECK(conn.counters().chunks_saved.value() == 0);
        finished_requests f = conn.finished();
        for (int i = 0; i < 2000 && f.saves.empty(); ++i) {  // wait_for_save returned: at once
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          f = conn.finished();
        }
        LOCKED_CHECK(f.saves == std::vector<request_id>{1});
        LOCKED_REQUIRE(f.save_errors.size() == 1);
        LOCKED_CHECK(f.save_errors.front().message == why.front().message);
        // The saver thread lives on: the next save stores.
        store.put_throws = false;
        store.hold_puts = false;
        LOCKED_REQUIRE_FALSE(conn.save(3, prompt, slots, 0, prompt.size()));
        LOCKED_CHECK_FALSE(conn.wait_for_save(3, deadline_after(long_wait)));
        LOCKED_CHECK(conn.errors(3).empty());
        LOCKED_CHECK(conn.counters().chunks_saved.value() == 3);  // chunks r, r + 2, r + 4
        LOCKED_CHECK(conn.counters().save_failures.value() == 1);
        LOCKED_CHECK(conn.finish(3).free_pages_now);
        cache.release(seq);
      });
    }
  }
}

namespace {

// A data communicator whose group_end number `throws_at` (0-based) completes, then throws (on
// every rank alike, so the ranks stay in step): the mover's thread meets an exception.
struct throwing_group {
  comm::inproc_communicator inner;
  int throws_at = -1;
  int ends = 0;

  static constexpr bool rounds_fail_together = true;
  rank_t rank() const { return inner.rank(); }
  rank_t size() const { return inner.size(); }
  std::string last_error() const { return std::string(inner.last_error()); }
  std::error_code broadcast(std::span<const std::byte> s, std::span<std::byte> r, rank_t root, deadline dl) {
    return inner.broadcast(s, r, root, dl);
  }
  std::error_code all_gather(std::span<const std::byte> s, std::span<std::byte> r, deadline dl) {
    return inner.all_gather(s, r, dl);
  }
  std::error_code all_reduce(std::span<const std::byte> s, std::span<std::byte> r, comm::dtype t,
                             comm::reduce_op op, deadline dl) {
    return inner.all_reduce(s, r, t, op, dl);
  }
  std::error_code group_start() { return inner.group_start(); }
  std::error_code group_end(deadline dl) {
    const std::error_code ec = inner.group_end(dl);
    if (ends++ == throws_at) throw std::runtime_error("injected: group_end threw");
    return ec;
  }
  std::error_code local_copy(std::span<std::byte> d, std::span<const std::byte> s, deadline dl) {
    return inner.local_copy(d, s, dl);
  }
};

}  // namespace

TEST_CASE("connector: a data communicator that throws in the mover's thread fails the move, not the process",
          "[connector]") {
  constexpr rank_t W = 2;
  comm::inproc_world ctrl_world(W), data_world(W);
  const std::vector<token_id> prompt = rig_prompt(6 * T + 7);
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c) {
    throwing_group data{data_world.communicator_for(c.rank())};
    memory_store store(64 << 20);
    host_kv_cache cache(rig_layout());
    connector_options opt = rig_options();
    opt.layers_per_group = 1;
    opt.fetch_batch_chunks = 0;  // one store call: the whole load is agreed, and moved, at once
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, c, data, cache.view(), opt);
    const bool saved = compute_and_save(conn, cache, 1, prompt);
    LOCKED_REQUIRE(saved);
    data.throws_at = data.ends + 1;  // the load's second layer group throws
    const auto plan = lookup_agreed(conn, 2, prompt);
    LOCKED_REQUIRE(plan);
    LOCKED_REQUIRE(plan->tokens_to_load() == 6 * T);
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
    LOCKED_REQUIRE_FALSE(conn.load(2, slots_of(cache, seq, prompt.size())));
    const auto fetched = conn.wait_local(2, deadline_after(long_wait));
    LOCKED_REQUIRE_FALSE(fetched);
    const bool agreed = step_until(conn, [&] { return conn.load_result(2).has_value(); });
    LOCKED_REQUIRE(agreed);
    LOCKED_CHECK(conn.load_result(2)->loaded_end_token == 0);  // group 1 never landed, on any rank
    LOCKED_CHECK(conn.load_errors(2).size() == 6);
    // The mover lives on: a second load lands whole (and after it, request 2's reason is final).
    const auto plan3 = lookup_agreed(conn, 3, prompt);
    LOCKED_REQUIRE(plan3);
    host_kv_cache::sequence seq3;
    LOCKED_REQUIRE(cache.reserve(seq3, prompt.size()));
    LOCKED_REQUIRE_FALSE(conn.load(3, slots_of(cache, seq3, prompt.size())));
    const bool agreed3 = step_until(conn, [&] { return conn.load_result(3).has_value(); });
    LOCKED_REQUIRE(agreed3);
    LOCKED_CHECK(conn.load_result(3)->complete());
    LOCKED_CHECK(wrong_bytes(cache, seq3, 0, 6 * T) == 0);
    const std::vector<request_error> why = conn.errors(2);
    LOCKED_REQUIRE(why.size() == 1);
    LOCKED_CHECK(why[0].what == request_error::stage::load);
    KVTIER_LOCKED(
        CHECK_THAT(why[0].message,
                   Catch::Contains("of chunk 0: move of layer group 1: threw: injected: group_end threw")));
    conn.finish(2);
    conn.finish(3);
    cache.release(seq);
    cache.release(seq3);
  });
}
