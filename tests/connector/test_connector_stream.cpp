// connector_options::stream_groups: loads stream by layer group. The owners read group-major
// (a group_streaming_store; here a memory store wrapper that serves one layer group of every key
// per round and can hold a round back or land a group corrupt), each step agrees the layer
// groups every owner has verified, and the mover moves them before later groups are fetched.
// Layer by layer: with layer group g held back in every rank's store, the layers below g are in
// the pages before g is fetched. Faults (a corrupt group, a deadline mid-stream, at one rank at a
// time): every rank ends with the same agreed prefix, the same load errors and recorded calls,
// and 0 wrong bytes.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
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

constexpr std::uint64_t T = rig_chunk_tokens;
const std::size_t group_bytes = layer_group_bytes(rig_layout(), rig_chunk_tokens, 1);  // one layer

// The memory store, read group-major: round g copies layer group g of every key still good, then
// reports the round. Faults: key `bad_key` of a call lands corrupt in round `bad_round`; at round
// `hold_round`, key `hold_key`, the call reports what landed so far, then waits until release()
// or its deadline (then every key not yet whole is a timeout).
struct streaming_store {
  memory_store& inner;
  std::size_t bad_round = SIZE_MAX, bad_key = 0, hold_round = SIZE_MAX, hold_key = 0;
  hold_point hold;

  value_format format() const { return value_format::v2(group_bytes); }
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> s, deadline dl) {
    return inner.exists(k, s, dl);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> v,
                      std::span<chunk_status> s, deadline dl) {
    return inner.put(k, v, s, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    return inner.get(k, d, s, dl);
  }
  std::error_code get_by_group(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                               std::span<chunk_status> st, deadline dl,
                               const std::function<void(std::span<const std::size_t>)>& on_round) {
    const std::size_t n = keys.size();
    std::vector<std::vector<std::byte>> whole(n);
    std::vector<std::span<std::byte>> spans(n);
    for (std::size_t i = 0; i < n; ++i) whole[i].resize(dst[i].size()), spans[i] = whole[i];
    std::vector<chunk_status> in(n);
    if (auto ec = inner.get(keys, spans, in, dl)) return ec;
    std::vector<std::size_t> landed(n, 0);
    std::vector<bool> dead(n, false);
    const value_format f = format();
    const std::size_t rounds = n ? f.groups(dst[0].size()) : 0;
    for (std::size_t g = 0; g < rounds; ++g) {
      for (std::size_t i = 0; i < n; ++i) {
        if (dead[i]) continue;
        if (in[i] != chunk_status::hit) {
          st[i] = in[i], dead[i] = true;
          continue;
        }
        if (g == hold_round && i == hold_key) on_round(landed);  // what landed before it waits
        if (g == hold_round && i == hold_key && !hold.arrive(dl)) {
          for (std::size_t j = 0; j < n; ++j)
            if (!dead[j] && landed[j] < rounds) st[j] = chunk_status::timeout;
          on_round(landed);
          return make_error_code(errc::timeout);
        }
        const auto part = f.group(dst[i], g);
        std::memcpy(part.data(), whole[i].data() + g * group_bytes, part.size());
        if (g == bad_round && i == bad_key) {
          std::memset(part.data(), 0xEE, part.size());
          st[i] = chunk_status::corrupt, dead[i] = true;
          continue;
        }
        landed[i] = g + 1;
        st[i] = landed[i] == rounds ? chunk_status::hit : chunk_status::error;
      }
      on_round(landed);
    }
    return {};
  }
};
static_assert(group_streaming_store<streaming_store>);

connector_options stream_options() {
  connector_options opt = rig_options();
  opt.stream_groups = true;
  opt.layers_per_group = 1;
  opt.fetch_batch_chunks = 0;  // one group-major call for all of a rank's chunks
  return opt;
}

// Request 1 computes and saves `prompt`; request 2 looks it up (all 6 chunks cached) and starts
// its load into zeroed pages (pages may be reused) of `seq`.
template <class Conn>
void start_second_load(Conn& conn, host_kv_cache& cache, host_kv_cache::sequence& seq,
                       const std::vector<token_id>& prompt) {
  const auto saved = compute_and_save(conn, cache, 1, prompt);  // outside the lock: it may wait for a peer
  LOCKED_REQUIRE(saved);
  const auto plan = lookup_agreed(conn, 2, prompt);
  LOCKED_REQUIRE(plan);
  LOCKED_REQUIRE(plan->tokens_to_load() == 6 * T);
  LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
  const std::vector<std::byte> zero(cache.layout().bytes_per_token());
  for (std::uint64_t p = 0; p < prompt.size(); ++p) cache.scatter(seq, p, 1, zero);
  LOCKED_REQUIRE_FALSE(conn.load(2, slots_of(cache, seq, prompt.size())));
}

}  // namespace

TEST_CASE("connector stream_groups: layers below a group the stores hold back land before it is fetched",
          "[connector]") {
  constexpr rank_t W = 2;
  constexpr std::uint32_t late = 2;  // one layer per group: layer 2 is fetched late
  comm::inproc_world ctrl_world(W), data_world(W);
  const std::vector<token_id> prompt = rig_prompt(6 * T + 7);
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c) {
    comm::inproc_communicator data = data_world.communicator_for(c.rank());
    memory_store mem(64 << 20);
    streaming_store store{mem};
    store.hold_round = late;
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, c, data, cache.view(),
                   stream_options());
    host_kv_cache::sequence seq;
    start_second_load(conn, cache, seq, prompt);
    // Every rank's fetch has verified groups [0, late) of its chunks and waits before group
    // `late`; then exactly one step on every rank agrees those groups of all 6 chunks.
    const bool reached = store.hold.wait_reached(std::chrono::seconds(10));
    LOCKED_REQUIRE(reached);
    const auto agreed = conn.step(deadline_after(std::chrono::seconds(10)));  // outside the lock
    LOCKED_REQUIRE_FALSE(agreed);
    for (std::uint32_t l = 0; l < late; ++l) {
      const auto got =
          conn.wait_for_layer(l, deadline_after(std::chrono::seconds(10))).ec;  // may wait for a peer
      LOCKED_CHECK_FALSE(got);
      LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T, l + 1) == 0);  // layers up to l are right already
    }
    LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T, late + 1) > 0);  // layer `late` is not fetched yet
    LOCKED_CHECK_FALSE(conn.load_result(2).has_value());
    store.hold.release();
    const auto done = step_until(conn, [&] { return conn.load_result(2).has_value(); });  // outside the lock
    LOCKED_REQUIRE(done);
    LOCKED_CHECK(conn.load_result(2)->complete());
    for (std::uint32_t l = 0; l < rig_layers; ++l) {
      const auto got =
          conn.wait_for_layer(l, deadline_after(std::chrono::seconds(10))).ec;  // may wait for a peer
      LOCKED_CHECK_FALSE(got);
    }
    LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T) == 0);
    conn.finish(2);
  });
}

TEST_CASE("connector stream_groups: wait_for_layer agrees the groups itself, with no step() after load()",
          "[connector]") {
  // The engine's forward: load(), then wait_for_layer(l) before each layer. While the stores
  // hold group `late` back, the layers below it are agreed, moved and right in the pages
  // (every rank), a wait for `late` times out on every rank with the load going on, and once
  // released every layer lands and the outcome is the whole load. The ranks' recorded control
  // calls are the same.
  constexpr rank_t W = 2;
  constexpr std::uint32_t late = 2;
  using rec = comm::recording<comm::inproc_communicator&>;
  // Also with fetch_batch_chunks = 1: a streamed load's fetch stays one group-major call (in
  // batches, the held group of the first batch would hold group 0 of every later one).
  const std::size_t batch = GENERATE(0u, 1u);
  INFO("fetch_batch_chunks = " << batch);
  connector_options opt = stream_options();
  opt.fetch_batch_chunks = batch;
  comm::inproc_world ctrl_world(W), data_world(W);
  const std::vector<token_id> prompt = rig_prompt(6 * T + 7);
  std::vector<std::vector<comm::collective_call>> calls(W);
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c) {
    comm::inproc_communicator data = data_world.communicator_for(c.rank());
    rec ctrl(c);
    memory_store mem(64 << 20);
    streaming_store store{mem};
    store.hold_round = late;
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, ctrl, data, cache.view(), opt);
    host_kv_cache::sequence seq;
    start_second_load(conn, cache, seq, prompt);
    for (std::uint32_t l = 0; l < late; ++l) {
      const auto got = conn.wait_for_layer(l, deadline_after(std::chrono::seconds(10))).ec;  // a collective
      LOCKED_CHECK_FALSE(got);
      LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T, l + 1) == 0);  // layers up to l of all 6 chunks
    }
    LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T, late + 1) > 0);
    const auto held = conn.wait_for_layer(late, deadline_after(std::chrono::milliseconds(400))).ec;
    LOCKED_CHECK(held == errc::timeout);  // on every rank: the agreed word said so
    LOCKED_CHECK_FALSE(conn.load_result(2).has_value());
    store.hold.release();
    for (std::uint32_t l = 0; l < rig_layers; ++l) {
      const auto got = conn.wait_for_layer(l, deadline_after(std::chrono::seconds(10))).ec;
      LOCKED_CHECK_FALSE(got);
    }
    LOCKED_CHECK(wrong_bytes(cache, seq, 0, 6 * T) == 0);  // before the outcome: every layer is in
    const auto done = step_until(conn, [&] { return conn.load_result(2).has_value(); });  // outside the lock
    LOCKED_REQUIRE(done);
    LOCKED_CHECK(conn.load_result(2)->complete());
    LOCKED_CHECK(conn.counters().agreement_failures.value() == 0);
    conn.finish(2);
    calls[c.rank()] = ctrl.calls();
  });
  CHECK(calls[0] == calls[1]);
  CHECK(calls[0].size() > 4);
}

TEST_CASE("connector stream_groups faults: a corrupt group or a deadline mid-stream at one rank",
          "[connector]") {
  enum class fault { none, corrupt_group, deadline_mid_stream };
  for (rank_t W : {2u, 3u}) {
    for (bool two : {false, true}) {
      for (fault f : {fault::none, fault::corrupt_group, fault::deadline_mid_stream}) {
        for (rank_t bad = 0; bad < (f == fault::none ? 1u : W); ++bad) {
          INFO("W = " << W << ", two communicators = " << two << ", fault " << int(f) << " on rank " << bad);
          load_scenario sc{.world = W, .two_comms = two, .opt = stream_options()};
          if (f == fault::deadline_mid_stream)  // the held call waits for it: the fault's own deadline
            sc.opt.load_deadline = {std::chrono::seconds(3), std::chrono::milliseconds(0),
                                    std::chrono::seconds(3)};
          const auto reps = run_load(sc, [&](rank_t r, memory_store& m) {
            auto s = std::make_unique<streaming_store>(m);
            if (r != bad) return s;
            // Key 1 of the bad rank's call is its second owned chunk, bad + W: group 1 corrupt, or
            // its last group held until the deadline (key 0 has landed whole by then).
            if (f == fault::corrupt_group) s->bad_round = 1, s->bad_key = 1;
            if (f == fault::deadline_mid_stream) s->hold_round = rig_layers - 1, s->hold_key = 1;
            return s;
          });
          for (const rank_load_report& rep : reps) {
            LOCKED_REQUIRE(rep.plan);
            LOCKED_REQUIRE(rep.outcome);
            LOCKED_CHECK(rep.outcome->loaded_end_token == reps[0].outcome->loaded_end_token);
            LOCKED_CHECK(rep.errors == reps[0].errors);
            LOCKED_CHECK(rep.wrong == 0);
            LOCKED_CHECK(rep.calls == reps[0].calls);
          }
          const rank_load_report& a = reps[0];
          LOCKED_CHECK(a.plan->cached_tokens == 6 * T);
          if (f == fault::none) {
            LOCKED_CHECK(a.outcome->complete());
            LOCKED_CHECK(a.errors.empty());
          } else {
            const std::uint64_t expect = (bad + W) * T;
            LOCKED_CHECK(a.outcome->loaded_end_token == expect);
            LOCKED_REQUIRE_FALSE(a.errors.empty());
            LOCKED_CHECK(a.errors.front() == expect / T);
          }
        }
      }
    }
  }
}
