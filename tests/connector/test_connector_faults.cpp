// A fault at every lifecycle point, one rank at a time: every rank ends with the same agreed
// prefix and the same load errors, and 0 wrong bytes in its pages. And layer by layer: with
// layer group g held back, waiting for a layer below g returns before g lands.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "connector/connector_rig.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/locked_checks.hpp"

using namespace kvtier;
using namespace kvtier::test;

namespace {

enum class fault { none, lookup_timeout, store_error_mid_load, corrupt_value, save_fails, peer_stalls };

const char* name(fault f) {
  switch (f) {
    case fault::none:
      return "none";
    case fault::lookup_timeout:
      return "lookup timeout";
    case fault::store_error_mid_load:
      return "store error mid-load";
    case fault::corrupt_value:
      return "corrupt value (checksum mismatch)";
    case fault::save_fails:
      return "save fails";
    case fault::peer_stalls:
      return "peer stalls past the deadline";
  }
  return "?";
}

// The memory store with one fault: exists() that answers only at its deadline, the n-th get()
// failing or reporting its value corrupt (what remote_store's checksums report for a flipped
// byte), or every put() failing. Once a fault fired, last_error() says so in "its own words".
struct faulty_store {
  memory_store& inner;
  fault f = fault::none;
  std::atomic<int> gets{0};
  std::atomic<bool> fired{false};

  std::string last_error() const { return fired ? std::string("injected: ") + name(f) : std::string(); }

  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
    if (f != fault::lookup_timeout) return inner.exists(k, st, dl);
    std::this_thread::sleep_until(std::min(dl, clock::now() + std::chrono::seconds(5)));
    fired = true;
    std::fill(st.begin(), st.end(), chunk_status::timeout);
    return make_error_code(errc::timeout);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> st, deadline dl) {
    const int call = gets++;
    if (f == fault::store_error_mid_load && call == 1) {
      fired = true;
      std::fill(st.begin(), st.end(), chunk_status::error);
      return make_error_code(errc::backend_error);
    }
    const std::error_code ec = inner.get(k, d, st, dl);
    if (f == fault::corrupt_value && call == 0 && !st.empty()) fired = true, st[0] = chunk_status::corrupt;
    return ec;
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> s,
                      std::span<chunk_status> st, deadline dl) {
    if (f != fault::save_fails) return inner.put(k, s, st, dl);
    fired = true;
    std::fill(st.begin(), st.end(), chunk_status::error);
    return make_error_code(errc::backend_error);
  }
};

constexpr std::size_t T = rig_chunk_tokens;

// The failed rank's one reason for fault f: its stage, the chunk, an error code and the store's
// own words in a message that names the rank and the chunk.
void check_reason(const std::vector<request_error>& reasons, fault f, rank_t rank, std::size_t chunk) {
  LOCKED_REQUIRE(reasons.size() == 1);
  const request_error& e = reasons.front();
  INFO(e.message);
  const auto stage = f == fault::lookup_timeout ? request_error::stage::lookup
                     : f == fault::save_fails   ? request_error::stage::save
                                                : request_error::stage::load;
  LOCKED_CHECK(e.what == stage);
  LOCKED_CHECK(e.id == (f == fault::save_fails ? 1u : 2u));
  LOCKED_CHECK(e.chunk == chunk);
  LOCKED_CHECK(e.ec == (f == fault::lookup_timeout  ? make_error_code(errc::timeout)
                        : f == fault::corrupt_value ? make_error_code(errc::corrupt_value)
                                                    : make_error_code(errc::backend_error)));
  const std::string head = "rank " + std::to_string(rank) + ": " + std::string(to_string(stage)) +
                           " of chunk " + std::to_string(chunk);
  LOCKED_CHECK(e.message.rfind(head, 0) == 0);
  if (f != fault::lookup_timeout)  // a lookup cut at its deadline may end before the store spoke
    LOCKED_CHECK(e.message.find(std::string("(store: injected: ") + name(f) + ")") != std::string::npos);
}

}  // namespace

TEST_CASE("connector faults: one rank at a time, every rank agrees and no byte is wrong", "[connector]") {
  for (rank_t W : {2u, 3u}) {
    for (bool two : {false, true}) {
      for (fault f : {fault::lookup_timeout, fault::store_error_mid_load, fault::corrupt_value,
                      fault::save_fails, fault::peer_stalls}) {
        for (rank_t bad = 0; bad < W; ++bad) {
          INFO("W = " << W << ", two communicators = " << two << ", fault: " << name(f) << " on rank "
                      << bad);
          load_scenario sc{.world = W, .two_comms = two};
          sc.opt.layers_per_group = 2;
          if (f == fault::lookup_timeout) sc.opt.lookup_timeout = std::chrono::milliseconds(200);
          if (f == fault::peer_stalls) {
            sc.load_step_timeout = std::chrono::milliseconds(100);
            sc.after_load = [bad](rank_t r) {
              if (r == bad) std::this_thread::sleep_for(std::chrono::milliseconds(400));
            };
          }
          const auto reps = run_load(sc, [&](rank_t r, memory_store& m) {
            auto s = std::make_unique<faulty_store>(m);
            if (r == bad && f != fault::peer_stalls) s->f = f;
            return s;
          });
          for (const rank_load_report& rep : reps) {
            LOCKED_REQUIRE(rep.plan);
            LOCKED_CHECK(rep.plan->cached_tokens == reps[0].plan->cached_tokens);
            LOCKED_CHECK(rep.outcome.has_value() == reps[0].outcome.has_value());
            if (rep.outcome && reps[0].outcome)
              LOCKED_CHECK(rep.outcome->loaded_end_token == reps[0].outcome->loaded_end_token);
            LOCKED_CHECK(rep.errors == reps[0].errors);
            LOCKED_CHECK(rep.wrong == 0);
            LOCKED_CHECK(rep.calls == reps[0].calls);
          }
          // What each fault must have cost (the first rank's view; the others equal it).
          const rank_load_report& a = reps[0];
          const std::uint64_t first_owned = bad * T, second_owned = (bad + W) * T;
          // Why, in words, on the failed rank only (local reasons: no collective carries them).
          if (f != fault::peer_stalls) {
            for (rank_t r = 0; r < W; ++r)
              if (r != bad) LOCKED_CHECK(reps[r].reasons.empty());
            check_reason(reps[bad].reasons, f, bad, f == fault::store_error_mid_load ? bad + W : bad);
          }
          switch (f) {
            case fault::lookup_timeout:
              LOCKED_CHECK(a.plan->cached_tokens <= first_owned);
              break;
            case fault::save_fails:
              LOCKED_CHECK(a.plan->cached_tokens == first_owned);
              LOCKED_CHECK(reps[bad].save_failures > 0);
              break;
            case fault::store_error_mid_load:
            case fault::corrupt_value: {
              const std::uint64_t expect = f == fault::corrupt_value ? first_owned : second_owned;
              LOCKED_CHECK(a.plan->cached_tokens == 6 * T);
              if (expect == 0) {
                LOCKED_CHECK(a.outcome->loaded_end_token == 0);
              } else {
                LOCKED_REQUIRE(a.outcome);
                LOCKED_CHECK(a.outcome->loaded_end_token == expect);
                LOCKED_CHECK(a.errors.front() == expect / T);
                LOCKED_CHECK(a.errors.size() == 6 - expect / T);
              }
              break;
            }
            case fault::peer_stalls:
              LOCKED_REQUIRE(a.outcome);
              LOCKED_CHECK(a.outcome->loaded_end_token <= 6 * T);
              break;
            case fault::none:
              break;
          }
        }
      }
    }
  }
}

namespace {

// A data communicator whose group_end number `held` (0-based) waits until released: the moves
// of one layer group arrive late; and whose group_end number `failed` completes, then reports a
// transport error (on every rank alike, so the ranks stay in step).
struct held_group {
  comm::inproc_communicator inner;
  int held = -1, failed = -1;
  int ends = 0;
  hold_point hold;

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
    if (ends == failed) {
      ++ends;
      const std::error_code ec = inner.group_end(dl);
      return ec ? ec : make_error_code(errc::backend_error);
    }
    if (ends++ == held) hold.arrive(dl);
    return inner.group_end(dl);
  }
  std::error_code local_copy(std::span<std::byte> d, std::span<const std::byte> s, deadline dl) {
    return inner.local_copy(d, s, dl);
  }
};

}  // namespace

TEST_CASE("connector layer by layer: a layer below a late layer group is ready before that group lands",
          "[connector]") {
  constexpr rank_t W = 2;
  constexpr int late_group = 2;  // layers_per_group = 1: layer 2 arrives late
  comm::inproc_world ctrl_world(W), data_world(W);
  const std::vector<token_id> prompt = rig_prompt(6 * T + 7);
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c) {
    held_group data{data_world.communicator_for(c.rank())};
    data.held = late_group;
    memory_store store(64 << 20);
    host_kv_cache cache(rig_layout());
    connector_options opt = rig_options();
    opt.layers_per_group = 1;
    opt.fetch_batch_chunks = 0;  // one store call: the whole load is agreed, and moved, at once
    opt.load_deadline.base = std::chrono::seconds(30);
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, c, data, cache.view(), opt);
    const auto got1 = compute_and_save(conn, cache, 1, prompt);  // outside the lock: it may wait for a peer
    LOCKED_REQUIRE(got1);
    const auto plan = lookup_agreed(conn, 2, prompt);
    LOCKED_REQUIRE(plan);
    LOCKED_REQUIRE(plan->tokens_to_load() == 6 * T);
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
    LOCKED_REQUIRE_FALSE(conn.load(2, slots_of(cache, seq, prompt.size())));
    // Every rank's fetch ends before the one step: that step agrees all 6 chunks at once (a
    // step taken earlier may agree a shorter prefix, whose later chunks then queue behind the
    // held group). Exactly one step on every rank: a loop that stops on a local condition
    // would leave one rank stepping alone.
    const auto fetched = conn.wait_local(2, deadline_after(std::chrono::seconds(10)));
    LOCKED_REQUIRE_FALSE(fetched);
    const auto agreed = conn.step(deadline_after(std::chrono::seconds(10)));  // outside the lock
    LOCKED_REQUIRE_FALSE(agreed);
    const bool reached = data.hold.wait_reached(std::chrono::seconds(10));  // outside the lock: it waits
    LOCKED_REQUIRE(reached);
    for (std::uint32_t l = 0; l < late_group; ++l) {
      const auto got2 = conn.wait_for_layer(
          l, deadline_after(std::chrono::seconds(10))).ec;  // outside the lock: it may wait for a peer
      LOCKED_CHECK_FALSE(got2);
      LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T, l + 1) == 0);  // layers up to l are right already
    }
    const auto got3 = conn.wait_for_layer(late_group, deadline_after(std::chrono::milliseconds(20))).ec ==
                      errc::timeout;  // outside the lock: it may wait for a peer
    LOCKED_CHECK(got3);
    LOCKED_CHECK_FALSE(conn.load_result(2).has_value());
    data.hold.release();
    const auto got4 = step_until(
        conn, [&] { return conn.load_result(2).has_value(); });  // outside the lock: it may wait for a peer
    LOCKED_REQUIRE(got4);
    LOCKED_CHECK(conn.load_result(2)->complete());
    for (std::uint32_t l = 0; l < rig_layers; ++l) {
      const auto got5 = conn.wait_for_layer(
          l, deadline_after(std::chrono::seconds(10))).ec;  // outside the lock: it may wait for a peer
      LOCKED_CHECK_FALSE(got5);
    }
    LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T) == 0);
    conn.finish(2);
  });
}

TEST_CASE(
    "connector: a failed move's staging block is kept out of use when the data communicator may write late",
    "[connector]") {
  constexpr rank_t W = 2;
  for (bool writes_late : {false, true}) {
    INFO("data_writes_after_failure = " << writes_late);
    comm::inproc_world ctrl_world(W), data_world(W);
    const std::vector<token_id> prompt = rig_prompt(6 * T + 7);
    comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c) {
      held_group data{data_world.communicator_for(c.rank())};
      memory_store store(64 << 20);
      host_kv_cache cache(rig_layout());
      connector_options opt;
      opt.layers_per_group = 1;
      opt.fetch_batch_chunks = 0;  // one store call: the whole load is agreed, and moved, at once
      opt.load_deadline.base = std::chrono::seconds(30);
      opt.data_writes_after_failure = writes_late;
      opt.lookup_timeout = std::chrono::seconds(10);  // a memory store answers at once; TSan may be slow
      connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, c, data, cache.view(), opt);
      const auto saved = compute_and_save(conn, cache, 1, prompt);  // outside the lock: it may wait
      LOCKED_REQUIRE(saved);
      data.failed = data.ends + 1;  // the load's second layer group fails to move
      const auto plan = lookup_agreed(conn, 2, prompt);
      LOCKED_REQUIRE(plan);
      LOCKED_REQUIRE(plan->tokens_to_load() == 6 * T);
      host_kv_cache::sequence seq;
      LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
      LOCKED_REQUIRE_FALSE(conn.load(2, slots_of(cache, seq, prompt.size())));
      const auto fetched = conn.wait_local(2, deadline_after(std::chrono::seconds(10)));
      LOCKED_REQUIRE_FALSE(fetched);
      const auto agreed = step_until(conn, [&] { return conn.load_result(2).has_value(); });  // may wait
      LOCKED_REQUIRE(agreed);
      // Group 1 never landed: nothing is in every rank's pages, on every rank alike.
      LOCKED_CHECK(conn.load_result(2)->loaded_end_token == 0);
      LOCKED_CHECK(conn.load_errors(2).size() == 6);
      // A second load, moved by the same mover thread after the failed batch was handled (so
      // the count and the reason below are final), lands whole: the data communicator keeps
      // working. Request 2 stays unfinished until then (its outcome, agreed short, keeps the
      // mover out of its pages), so its reason can still be read.
      const auto plan3 = lookup_agreed(conn, 3, prompt);
      LOCKED_REQUIRE(plan3);
      host_kv_cache::sequence seq3;
      LOCKED_REQUIRE(cache.reserve(seq3, prompt.size()));
      LOCKED_REQUIRE_FALSE(conn.load(3, slots_of(cache, seq3, prompt.size())));
      const auto agreed3 = step_until(conn, [&] { return conn.load_result(3).has_value(); });  // may wait
      LOCKED_REQUIRE(agreed3);
      LOCKED_CHECK(conn.load_result(3)->complete());
      LOCKED_CHECK(wrong_bytes(cache, seq3, 0, 6 * T) == 0);
      // This rank's reason for request 2: its own move of group 1 failed (the agreement that
      // ended the load may have come before this rank's mover got there; load 3 came after).
      const std::vector<request_error> why = conn.errors(2);
      LOCKED_REQUIRE(why.size() == 1);
      LOCKED_CHECK(why[0].what == request_error::stage::load);
      LOCKED_CHECK(why[0].ec == errc::backend_error);
      LOCKED_CHECK(why[0].message.find("of chunk 0: move of layer group 1: ") != std::string::npos);
      conn.finish(2);  // the fetch completed: finish quarantines nothing of its own
      conn.finish(3);
      LOCKED_CHECK(conn.counters().quarantined_blocks.value() == (writes_late ? 1u : 0u));
      cache.release(seq);
      cache.release(seq3);
    });
  }
}
