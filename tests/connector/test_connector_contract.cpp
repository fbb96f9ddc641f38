// The connector's contract where an outside review found it broken (issue 26), each case a
// failure seen against the old code:
//  - a reach once agreed is final: a store hit that lands after the load's deadline never
//    extends a load, and the layer wait says which tokens of a layer are in the pages;
//  - slots that do not give a page to every token (a -1, a short block table) are refused
//    before anything is stored or agreed;
//  - settings that shape a collective (layers_per_group, stream_groups, the key namespace, the
//    number of step words) are agreed: ranks that differ get a clear error, never collectives
//    of different sizes.
// W rank threads over the in-process communicator; the recorded collectives are compared.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "comm/faulty.hpp"
#include "connector/connector_rig.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/locked_checks.hpp"

using namespace kvtier;
using namespace kvtier::test;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t T = rig_chunk_tokens;
using recorded = comm::recording<comm::inproc_communicator&>;

/// A memory store whose get of one key (`late`) waits at a hold point, past any deadline, and
/// then answers a hit: the chunk_store contract allows a result after the deadline.
struct late_hit_store {
  memory_store& mem;
  chunk_key late{};
  bool armed = false;
  hold_point hold;

  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
    return mem.exists(k, st, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> st, deadline dl) {
    if (armed && std::find(k.begin(), k.end(), late) != k.end()) (void)hold.arrive(no_deadline);
    return mem.get(k, dst, st, no_deadline);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> st, deadline dl) {
    return mem.put(k, src, st, dl);
  }
};

std::vector<std::vector<comm::collective_call>> calls_of(rank_t W) { return std::vector<std::vector<comm::collective_call>>(W); }

}  // namespace

TEST_CASE("connector: a hit that lands after the load deadline never extends the agreed reach",
          "[connector]") {
  // The store answers chunk 1 only after the load's deadline. The step after the deadline agrees
  // the reach at chunk 1; the layer waits list layer l of [0, T) as in the pages, and it is; the
  // late hit then lands, and the outcome stays [0, T). The old code said "ok" to every layer
  // wait (chunk 1 was not in the pages) and then agreed the whole load "complete". At W = 1, as
  // the review saw it; at W = 2 chunk 0 moves from rank 0 after the load's deadline: agreed moves
  // get connector_options::move_timeout (before, they took the load's deadline and failed at
  // once, the load ending [0, 0), and over MPI poisoned the data communicator for good).
  const rank_t W = GENERATE(rank_t{1}, rank_t{2});
  INFO("W = " << W);
  const std::vector<token_id> prompt = rig_prompt(4 * T + 3, 11);
  const modulo_ownership own(W);
  comm::inproc_world world(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const bool holds_late = own.owner(1) == c.rank();  // the rank whose store answers chunk 1 late
    recorded ctrl(c);
    memory_store mem(64 << 20);
    late_hit_store store{mem};
    host_kv_cache cache(rig_layout());
    connector_options opt = rig_options();
    opt.load_deadline = {300ms, 0ms, 300ms};
    opt.fetch_batch_chunks = 1;  // one store call per key: chunk 0 lands, chunk 1 waits
    connector conn(chunker<>(rig_ns(own.geometry())), own, store, ctrl, cache.view(), opt);
    const bool saved = compute_and_save(conn, cache, 1, prompt);
    LOCKED_REQUIRE(saved);
    store.late = chunker<>(rig_ns(own.geometry())).keys(prompt)[1];
    store.armed = holds_late;
    const auto plan = lookup_agreed(conn, 2, prompt);
    LOCKED_REQUIRE(plan);
    LOCKED_REQUIRE(plan->load_end_token == 4 * T);
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
    LOCKED_REQUIRE_FALSE(conn.load(2, slots_of(cache, seq, prompt.size())));
    const bool reached = !holds_late || store.hold.wait_reached(20s);
    LOCKED_REQUIRE(reached);
    std::this_thread::sleep_for(450ms);  // past the 300 ms load deadline on every rank
    const std::error_code stepped = conn.step(deadline_after(rig_step_timeout));  // outside the lock
    LOCKED_REQUIRE_FALSE(stepped);
    for (std::uint32_t l = 0; l < rig_layers; ++l) {
      const layer_wait w = conn.wait_for_layer(l, deadline_after(rig_step_timeout));
      LOCKED_CHECK_FALSE(w.ec);
      LOCKED_REQUIRE(w.loads.size() == 1);
      LOCKED_CHECK(w.loads[0].id == 2);
      LOCKED_CHECK(w.loads[0].first_token == 0);
      LOCKED_CHECK(w.loads[0].ready_end_token == T);  // the old code: "ok" for all of [0, 4T)
      LOCKED_CHECK(w.loads[0].requested_end_token == 4 * T);
      LOCKED_CHECK_FALSE(w.complete());
      LOCKED_CHECK(wrong_bytes(cache, seq, 0, T, l + 1) == 0);
    }
    if (holds_late) store.hold.release();  // the late hit lands now
    const std::error_code fetched = conn.wait_local(2, deadline_after(20s));
    LOCKED_CHECK_FALSE(fetched);
    const bool done = step_until(conn, [&] { return conn.load_result(2).has_value(); });
    LOCKED_REQUIRE(done);
    LOCKED_CHECK(conn.load_result(2)->loaded_end_token == T);  // the old code: 4T, "complete"
    LOCKED_CHECK(conn.load_errors(2) == std::vector<std::size_t>{1, 2, 3});
    LOCKED_CHECK(wrong_bytes(cache, seq, 0, T) == 0);
    const layer_wait after = conn.wait_for_layer(0, deadline_after(rig_step_timeout));
    LOCKED_CHECK(after.find(2) != nullptr);
    LOCKED_CHECK((after.find(2) && after.find(2)->ready_end_token == T));
    const auto why = conn.errors(2);
    if (holds_late) {
      LOCKED_REQUIRE(why.size() == 1);
      LOCKED_CHECK(why[0].message.find("load deadline") != std::string::npos);
    }
    conn.finish(2);
  });
}

TEST_CASE("connector: slots without a page for every token are refused before anything is stored or agreed",
          "[connector]") {
  constexpr rank_t W = 2;
  const std::vector<token_id> prompt = rig_prompt(4 * T + 3, 12);
  comm::inproc_world world(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    recorded ctrl(c);
    memory_store mem(64 << 20);
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), mem, ctrl, cache.view(), rig_options());
    const auto keys = chunker<>(rig_ns("mod:2")).keys(prompt);
    const auto stored = [&](std::size_t chunk) {
      chunk_status st{};
      (void)mem.exists(std::span(&keys[chunk], 1), std::span(&st, 1), no_deadline);
      return st == chunk_status::hit;
    };
    // A save whose slots hold -1 for a chunk: refused, nothing of it stored (the old code stored
    // the chunk's zero-filled staging under its real key with a valid checksum).
    const auto plan = lookup_agreed(conn, 1, prompt);
    LOCKED_REQUIRE(plan);
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
    compute_into(cache, seq, 0, prompt.size());
    std::vector<std::int64_t> slots = slots_of(cache, seq, prompt.size());
    std::vector<std::int64_t> holed = slots;
    holed[2 * T + 5] = -1;  // chunk 2, owned by rank 0
    LOCKED_CHECK(conn.save(1, holed, 0, prompt.size()) == errc::invalid_argument);
    LOCKED_CHECK(conn.begin_save(1, holed, 0, prompt.size()) == errc::invalid_argument);
    std::vector<std::int64_t> outside = slots;
    outside[3 * T] = static_cast<std::int64_t>(cache.layout().num_slots());
    LOCKED_CHECK(conn.save(1, outside, 0, prompt.size()) == errc::invalid_argument);
    // A -1 outside the chunks a save covers (the partial tail) is no page it reads: accepted.
    std::vector<std::int64_t> tail = slots;
    tail[4 * T + 1] = -1;
    const std::error_code none = conn.wait_for_save(1, deadline_after(20s));
    LOCKED_CHECK_FALSE(none);
    for (std::size_t k = 0; k < keys.size(); ++k) LOCKED_CHECK_FALSE(stored(k));
    LOCKED_CHECK_FALSE(conn.save(1, tail, 0, prompt.size()));
    const std::error_code saved = conn.wait_for_save(1, deadline_after(20s));
    LOCKED_CHECK_FALSE(saved);
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (modulo_ownership(W).owner(k) == r) LOCKED_CHECK(stored(k));
    conn.finish(1);
    cache.release(seq);
    // A load whose block table is shorter than the plan (rank 1 only): refused on that rank, and
    // every rank agrees nothing loaded (the old code agreed the whole load "complete").
    const auto plan2 = lookup_agreed(conn, 2, prompt);
    LOCKED_REQUIRE(plan2);
    LOCKED_REQUIRE(plan2->load_end_token == 4 * T);
    host_kv_cache::sequence seq2;
    LOCKED_REQUIRE(cache.reserve(seq2, prompt.size()));
    std::vector<std::int32_t> table(seq2.blocks.begin(), seq2.blocks.end());
    if (r == 1) table.resize((3 * T) / cache.layout().block_size);  // no page past position 3T
    const std::error_code ec = conn.load(2, table);
    LOCKED_CHECK(ec == (r == 1 ? std::error_code(errc::invalid_argument) : std::error_code{}));
    const bool done = step_until(conn, [&] { return conn.load_result(2).has_value(); });
    LOCKED_REQUIRE(done);
    LOCKED_CHECK(conn.load_result(2)->loaded_end_token == 0);
    if (r == 1) {
      const auto why = conn.errors(2);
      LOCKED_REQUIRE_FALSE(why.empty());
      LOCKED_CHECK(why[0].message.find("position " + std::to_string(3 * T) + " has slot -1") != std::string::npos);
    }
    conn.finish(2);
  });
}

TEST_CASE("connector: ranks whose settings shape collectives differently fail with a clear error, never abort",
          "[connector]") {
  constexpr rank_t W = 2;
  const std::vector<token_id> prompt = rig_prompt(4 * T + 3, 13);
  const std::string what = GENERATE(std::string("layers_per_group"), std::string("namespace"));
  INFO(what);
  comm::inproc_world world(W);
  auto calls = calls_of(W);
  std::mutex calls_mu;
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    recorded ctrl(c);
    memory_store mem(64 << 20);
    host_kv_cache cache(rig_layout());
    connector_options opt = rig_options();
    key_namespace ns = rig_ns("mod:2");
    if (r == 1 && what == "layers_per_group") opt.layers_per_group = 1;
    if (r == 1 && what == "namespace") ns.model = "another-model";
    connector conn(chunker<>(ns), modulo_ownership(W), mem, ctrl, cache.view(), opt);
    const deployment_check_result check = conn.check_deployment(deadline_after(rig_step_timeout));
    LOCKED_CHECK(check.ec == errc::invalid_argument);
    LOCKED_CHECK(check.field == (what == "namespace" ? "namespace_fingerprint" : "layers_per_group"));
    // Without heeding the check: every step fails on every rank, with words that say why; a
    // lookup agrees nothing cached (the old code ran on, with moves of different shapes).
    LOCKED_REQUIRE_FALSE(conn.begin_lookup(1, prompt));
    const std::error_code ec = conn.step(deadline_after(rig_step_timeout));
    LOCKED_CHECK(ec == errc::invalid_argument);
    LOCKED_CHECK(conn.last_step_error().find("ranks differ in their deployment") != std::string::npos);
    LOCKED_REQUIRE(conn.lookup(1).has_value());
    LOCKED_CHECK(conn.lookup(1)->cached_tokens == 0);
    const auto why = conn.errors(1);
    LOCKED_REQUIRE(why.size() == 1);
    LOCKED_CHECK(why[0].message.find("ranks differ in their deployment") != std::string::npos);
    conn.finish(1);
    std::lock_guard lock(calls_mu);
    calls[r] = ctrl.calls();
  });
  CHECK(calls[0] == calls[1]);
}

TEST_CASE("connector step: a different number of words fails on every rank with collectives of one size",
          "[connector]") {
  constexpr rank_t W = 3;
  comm::inproc_world world(W);
  auto calls = calls_of(W);
  std::mutex calls_mu;
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    recorded ctrl(c);
    memory_store mem(1 << 20);
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:3")), modulo_ownership(W), mem, ctrl, cache.view(), rig_options());
    std::vector<std::uint64_t> words(r == 2 ? 3 : 2, 7);
    const std::error_code mismatch = conn.step(deadline_after(rig_step_timeout), words);
    LOCKED_CHECK(mismatch == errc::collective_mismatch);
    LOCKED_CHECK(std::all_of(words.begin(), words.end(), [](std::uint64_t w) { return w == 0; }));
    LOCKED_CHECK(conn.last_step_error().find("different numbers") != std::string::npos);
    // The same count again: agreed.
    std::vector<std::uint64_t> same{5, 1000 + r};
    const std::error_code agreed = conn.step(deadline_after(rig_step_timeout), same);
    LOCKED_CHECK_FALSE(agreed);
    LOCKED_CHECK(same == std::vector<std::uint64_t>{5, 1000});
    LOCKED_CHECK(conn.last_step_error().empty());
    std::lock_guard lock(calls_mu);
    calls[r] = ctrl.calls();
  });
  CHECK(calls[0] == calls[1]);
  CHECK(calls[0] == calls[2]);
  REQUIRE(calls[0].size() == 2);  // one all-reduce per step, of one size on every rank
}

TEST_CASE("connector step: more requests than the first round holds agree in a second round of an agreed size",
          "[connector]") {
  constexpr rank_t W = 2;
  constexpr request_id lookups = 12;  // 12 x 5 words > the first round's 48
  comm::inproc_world world(W);
  auto calls = calls_of(W);
  std::mutex calls_mu;
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    recorded ctrl(c);
    memory_store mem(64 << 20);
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), mem, ctrl, cache.view(), rig_options());
    const std::vector<token_id> saved = rig_prompt(3 * T, 14);
    const bool stored = compute_and_save(conn, cache, 100, saved);
    LOCKED_REQUIRE(stored);
    std::vector<std::vector<token_id>> prompts;
    for (request_id id = 1; id <= lookups; ++id) {
      prompts.push_back(id % 2 ? saved : rig_prompt(3 * T, 100 + id));
      LOCKED_REQUIRE_FALSE(conn.begin_lookup(id, prompts.back()));
    }
    const std::size_t before = ctrl.calls().size();
    const bool agreed = step_until(conn, [&] {
      for (request_id id = 1; id <= lookups; ++id)
        if (!conn.lookup(id)) return false;
      return true;
    });
    LOCKED_REQUIRE(agreed);
    LOCKED_CHECK(ctrl.calls().size() > before);
    for (request_id id = 1; id <= lookups; ++id) LOCKED_CHECK(conn.lookup(id)->cached_tokens == (id % 2 ? 3 * T : 0));
    for (request_id id = 1; id <= lookups; ++id) conn.finish(id);
    std::lock_guard lock(calls_mu);
    calls[r] = ctrl.calls();
  });
  CHECK(calls[0] == calls[1]);
}

TEST_CASE("connector: a key namespace folded under another ownership is refused at construction",
          "[connector]") {
  // Two ranks sharing keys with a deployment of another geometry would load chunks that rank
  // layout placed elsewhere; the Python binding refused this, the C++ constructor now does too.
  constexpr rank_t W = 2;
  comm::inproc_world world(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    memory_store mem(1 << 20);
    host_kv_cache cache(rig_layout());
    bool refused = false;
    try {
      connector conn(chunker<>(rig_ns("mod:1")), modulo_ownership(W), mem, c, cache.view(), rig_options());
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("ownership 'mod:1' differs from the ownership policy's geometry 'mod:2'") !=
                std::string::npos;
    }
    LOCKED_CHECK(refused);
    // The matching namespace is accepted.
    connector ok(chunker<>(rig_ns("mod:2")), modulo_ownership(W), mem, c, cache.view(), rig_options());
    LOCKED_CHECK(ok.rank() == c.rank());
  });
}

TEST_CASE("connector: a poisoned data communicator fails the moves with its first error, never a misused group",
          "[connector]") {
  // The mover and chunk_broadcast share one move primitive (comm::broadcast_group): a refused
  // group_start queues nothing and calls no group_end (the old mover queued the broadcasts and
  // closed the unopened group anyway, one misuse a broadcast and a group).
  constexpr rank_t W = 2;
  const std::vector<token_id> prompt = rig_prompt(4 * T + 3, 14);
  comm::inproc_world world(W), data_world(W);
  std::vector<int> misuses(W, -1);
  std::atomic<int> reasons{0};
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    test::poisoned<comm::inproc_communicator> data(data_world.communicator_for(r), "timeout in request 9");
    memory_store mem(64 << 20);
    host_kv_cache cache(rig_layout());
    {
      connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), mem, c, data, cache.view(), rig_options());
      const bool saved = compute_and_save(conn, cache, 1, prompt);
      LOCKED_REQUIRE(saved);
      const auto plan = lookup_agreed(conn, 2, prompt);
      LOCKED_REQUIRE(plan);
      LOCKED_REQUIRE(plan->load_end_token == 4 * T);
      host_kv_cache::sequence seq;
      LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
      const std::error_code ec = conn.load(2, slots_of(cache, seq, prompt.size()));
      LOCKED_CHECK_FALSE(ec);
      const bool done = step_until(conn, [&] { return conn.load_result(2).has_value(); });
      LOCKED_REQUIRE(done);
      LOCKED_CHECK(conn.load_result(2)->loaded_end_token == 0);
      // The outcome is agreed once any rank's move failed: a rank whose mover thread has not
      // yet run its batch has no reason of its own yet. Every reason there is names the first
      // error (the old mover's said "group_end without group_start").
      const auto why = conn.errors(2);
      if (!why.empty()) {
        LOCKED_CHECK(why[0].message.find("poisoned by an earlier failure: timeout in request 9") != std::string::npos);
        reasons.fetch_add(1);
      }
      conn.finish(2);
      cache.release(seq);
    }
    misuses[r] = data.misuses();  // the connector is gone: every batch ran
  });
  CHECK(reasons.load() >= 1);
  CHECK(misuses == std::vector<int>(W, 0));
}
