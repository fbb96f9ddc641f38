// The connector's lifecycle end to end on threads: W ranks over the in-process communicator,
// each with its own memory_store and paged host cache (vLLM MLA); a prompt computed and saved,
// then looked up, loaded layer group by layer group and checked byte for byte.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "connector/connector_rig.hpp"
#include "connector/pages_save.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/locked_checks.hpp"

using namespace kvtier;
using namespace kvtier::test;

namespace {

constexpr std::size_t prompt_chunks = 6;
const std::size_t prompt_tokens = prompt_chunks * rig_chunk_tokens + 7;  // and a tail

void check_full_load(const std::vector<rank_load_report>& reps) {
  for (const rank_load_report& rep : reps) {
    LOCKED_REQUIRE(rep.plan);
    LOCKED_CHECK(rep.plan->cached_tokens == prompt_chunks * rig_chunk_tokens);
    LOCKED_REQUIRE(rep.outcome);
    LOCKED_CHECK(rep.outcome->complete());
    LOCKED_CHECK(rep.outcome->loaded_end_token == prompt_chunks * rig_chunk_tokens);
    LOCKED_CHECK(rep.errors.empty());
    LOCKED_CHECK(rep.wrong == 0);
    LOCKED_CHECK(rep.calls == reps[0].calls);  // the same collectives in the same order on every rank
  }
}

}  // namespace

TEST_CASE("connector: a saved prompt is looked up, loaded and in every rank's pages byte for byte",
          "[connector]") {
  for (rank_t W : {1u, 2u, 3u}) {
    for (bool two : {false, true}) {
      for (std::uint32_t per_group : {0u, 1u, 3u}) {
        INFO("W = " << W << ", two communicators = " << two << ", layers per group = " << per_group);
        load_scenario sc{.world = W, .two_comms = two};
        sc.opt.layers_per_group = per_group;
        check_full_load(run_load(sc, plain_store_for{}));
      }
    }
  }
}

TEST_CASE("connector: the first request finds nothing and its pages stay the engine's", "[connector]") {
  comm::inproc_world world(2);
  const std::vector<token_id> prompt = rig_prompt(prompt_tokens, 9);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    memory_store store(16 << 20);
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(2), store, c, cache.view(), rig_options());
    const auto plan = lookup_agreed(conn, 7, prompt);
    LOCKED_REQUIRE(plan);
    LOCKED_CHECK(plan->cached_tokens == 0);
    LOCKED_CHECK(plan->tokens_to_load() == 0);
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
    LOCKED_CHECK(conn.load(7, slots_of(cache, seq, prompt.size())) ==
                 errc::invalid_argument);                                  // nothing to load
    LOCKED_CHECK(conn.begin_lookup(7, prompt) == errc::invalid_argument);  // id in use
    LOCKED_CHECK(conn.finish(7).free_pages_now);
  });
}

TEST_CASE("connector: saves emit stored events, finish waits for saves, metrics print", "[connector]") {
  comm::inproc_world world(2);
  const std::vector<token_id> prompt = rig_prompt(prompt_tokens, 3);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    memory_store store(16 << 20);
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(2), store, c, cache.view(), rig_options());
    const auto got1 = compute_and_save(conn, cache, 1, prompt);  // outside the lock: it may wait for a peer
    LOCKED_REQUIRE(got1);
    std::size_t stored = 0;
    for (const kv_event& e : conn.drain_events()) {
      LOCKED_CHECK(e.what == kv_event::kind::stored);
      LOCKED_CHECK(e.rank == c.rank());
      stored += e.keys.size();
    }
    LOCKED_CHECK(stored == 3);  // 6 chunks, 3 owned by each rank
    LOCKED_CHECK(conn.counters().chunks_saved.value() == 3);
    std::string text;
    write_prometheus(text, conn.counters(), "kvtier_connector", "rank=\"0\"");
    LOCKED_CHECK(text.find("kvtier_connector_chunks_saved_total{rank=\"0\"} 3") != std::string::npos);
    // Latency histograms: one lookup agreed, one save ended, the lookup's steps each observed.
    LOCKED_CHECK(text.find("# TYPE kvtier_connector_lookup_seconds histogram") != std::string::npos);
    LOCKED_CHECK(text.find("kvtier_connector_lookup_seconds_count{rank=\"0\"} 1\n") != std::string::npos);
    LOCKED_CHECK(text.find("kvtier_connector_save_seconds_count{rank=\"0\"} 1\n") != std::string::npos);
    LOCKED_CHECK(text.find("kvtier_connector_load_seconds_count{rank=\"0\"} 0\n") != std::string::npos);
    LOCKED_CHECK(conn.counters().step_latency.count() >= 1);
    LOCKED_CHECK(text.find("kvtier_connector_save_seconds_bucket{rank=\"0\",le=\"+Inf\"} 1\n") !=
                 std::string::npos);
  });
}

TEST_CASE("connector: a save by layer gathers each layer group once the forward reported it final",
          "[connector]") {
  // The forward writes layer l of the pages just before save_layer(l), over pages that held
  // garbage: a group gathered before all its layers were reported would store garbage, which the
  // load of the prompt then finds (checksums are of what was stored). Groups of 2 layers. A
  // finish() before the last layer stores nothing and says which group was missing.
  constexpr rank_t W = 2;
  comm::inproc_world world(W);
  const std::vector<token_id> prompt = rig_prompt(prompt_tokens, 5);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    memory_store store(16 << 20);
    host_kv_cache cache(rig_layout());
    connector_options opt = rig_options();
    opt.layers_per_group = 2;
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(W), store, c, cache.view(), opt);
    const kv_layout& lay = cache.layout();
    const auto forward = [&](request_id id, std::uint32_t layers) {  // layers [0, layers), each reported
      host_kv_cache::sequence seq;
      LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
      const std::vector<std::byte> garbage(lay.bytes_per_token(), std::byte{0xAB});
      for (std::uint64_t p = 0; p < prompt.size(); ++p) cache.scatter(seq, p, 1, garbage);
      const auto slots = slots_of(cache, seq, prompt.size());
      LOCKED_REQUIRE_FALSE(conn.begin_save(id, slots, 0, prompt.size()));
      LOCKED_CHECK(conn.begin_save(id, slots, 0, prompt.size()) == errc::invalid_argument);  // one open
      std::vector<std::byte> row(lay.layer_bytes_per_token());
      for (std::uint32_t l = 0; l < layers; ++l) {
        for (std::uint64_t p = 0; p < prompt.size(); ++p) {
          for (std::size_t b = 0; b < row.size(); ++b) row[b] = model_byte(p, l, b);
          LOCKED_REQUIRE_FALSE(kv_scatter(cache.view(), std::span(slots).subspan(p, 1), row, {l, l + 1}));
        }
        LOCKED_REQUIRE_FALSE(conn.save_layer(id, l));
        LOCKED_CHECK(conn.save_layer(id, l) == errc::invalid_argument);  // reported already
      }
      return seq;
    };
    const auto plan1 = lookup_agreed(conn, 1, prompt);
    LOCKED_REQUIRE(plan1);
    LOCKED_CHECK(plan1->cached_tokens == 0);
    LOCKED_CHECK(conn.save_layer(1, 0) == errc::invalid_argument);  // no save by layer begun
    host_kv_cache::sequence seq1 = forward(1, lay.num_layers);
    LOCKED_CHECK(conn.save_layer(1, lay.num_layers) == errc::invalid_argument);  // out of range
    LOCKED_REQUIRE_FALSE(conn.wait_for_save(1, deadline_after(std::chrono::seconds(30))));
    LOCKED_CHECK(conn.errors(1).empty());
    LOCKED_CHECK(conn.counters().chunks_saved.value() == prompt_chunks / W);
    LOCKED_CHECK(conn.finish(1).free_pages_now);
    cache.release(seq1);
    // Request 2: the same prompt, found whole; it loads and its pages are the model's.
    const auto plan2 = lookup_agreed(conn, 2, prompt);
    LOCKED_REQUIRE(plan2);
    LOCKED_REQUIRE(plan2->cached_tokens == prompt_chunks * rig_chunk_tokens);
    host_kv_cache::sequence seq2;
    LOCKED_REQUIRE(cache.reserve(seq2, prompt.size()));
    LOCKED_REQUIRE_FALSE(conn.load(2, slots_of(cache, seq2, prompt.size())));
    const auto loaded =
        step_until(conn, [&] { return conn.load_result(2).has_value(); });  // outside the lock
    LOCKED_REQUIRE(loaded);
    LOCKED_CHECK(conn.load_result(2)->complete());
    LOCKED_CHECK(conn.counters().load_latency.count() == 1);
    LOCKED_CHECK(wrong_bytes(cache, seq2, 0, prompt_chunks * rig_chunk_tokens) == 0);
    conn.finish(2);
    cache.release(seq2);
    // Request 3 (another prompt's keys): finished after 3 of 4 layers (group 1 of 2 not complete):
    // nothing stored, one failure, and finished() lists it once the saver let go of its pages.
    const std::vector<token_id> other = rig_prompt(prompt_tokens, 6);
    const auto plan3 = lookup_agreed(conn, 3, other);
    LOCKED_REQUIRE(plan3);
    const std::uint64_t saved_before = conn.counters().chunks_saved.value();
    host_kv_cache::sequence seq3 = forward(3, 3);
    bool listed = conn.finish(3).free_pages_now;  // or once finished() lists it
    std::vector<request_error> why;
    for (int i = 0; i < 20000 && !(listed && !why.empty()); ++i) {
      finished_requests f = conn.finished();
      why.insert(why.end(), f.save_errors.begin(), f.save_errors.end());
      for (request_id s : f.saves) listed = listed || s == 3;
      if (!listed || why.empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    LOCKED_CHECK(listed);
    LOCKED_REQUIRE(why.size() == 1);
    LOCKED_CHECK(why[0].message.find("layer group 1 of 2") != std::string::npos);
    LOCKED_CHECK(conn.counters().chunks_saved.value() == saved_before);
    LOCKED_CHECK(conn.counters().save_failures.value() == 1);
    cache.release(seq3);
  });
}

TEST_CASE("connector: a save of a request never looked up is keyed as a lookup is, with no collective",
          "[connector]") {
  comm::inproc_world world(2);
  const std::vector<token_id> prompt = rig_prompt(prompt_tokens, 4);
  std::vector<std::vector<comm::collective_call>> calls(2);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    comm::recording<comm::inproc_communicator&> rec(c);
    memory_store store(16 << 20);
    host_kv_cache cache(rig_layout());
    connector conn(chunker<>(rig_ns("mod:2")), modulo_ownership(2), store, rec, cache.view(), rig_options());
    host_kv_cache::sequence seq;
    LOCKED_REQUIRE(cache.reserve(seq, prompt.size()));
    compute_into(cache, seq, 0, prompt.size());
    const auto slots = slots_of(cache, seq, prompt.size());
    LOCKED_REQUIRE_FALSE(conn.save(7, prompt, slots, 0, prompt.size()));                    // never looked up
    LOCKED_CHECK(conn.save(7, prompt, slots, 0, prompt.size()) == errc::invalid_argument);  // known now
    LOCKED_CHECK_FALSE(conn.lookup(7).has_value());  // known only to save
    LOCKED_CHECK(conn.step(deadline_after(std::chrono::seconds(20))) ==
                 std::error_code{});  // nothing to agree
    LOCKED_CHECK(rec.calls().empty());
    LOCKED_REQUIRE_FALSE(conn.wait_for_save(7, deadline_after(std::chrono::seconds(30))));
    LOCKED_CHECK(conn.errors(7).empty());
    LOCKED_CHECK(conn.finish(7).free_pages_now);
    cache.release(seq);
    const auto plan = lookup_agreed(conn, 8, prompt);  // the keys the save wrote are the lookup's
    LOCKED_REQUIRE(plan);
    LOCKED_CHECK(plan->cached_tokens == prompt_chunks * rig_chunk_tokens);
    conn.finish(8);
    calls[c.rank()] = rec.calls();  // each rank its own entry
  });
  CHECK(calls[0] == calls[1]);
}

TEST_CASE(
    "connector: a save puts chunks from the pages where they lie and gathers a chunk in small pieces; "
    "it loads back byte for byte",
    "[connector]") {
  memory_store store(16 << 20);  // piecewise, no checksums: the saver hands it no digests
  require_save_from_pages_loads_back(store, /*expect_digests=*/false);
}

TEST_CASE("connector: selective writes save a chunk only after it was looked up N times", "[connector]") {
  comm::inproc_world world(1);
  const std::vector<token_id> prompt = rig_prompt(prompt_tokens, 5);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    memory_store store(16 << 20);
    host_kv_cache cache(rig_layout());
    connector_options opt = rig_options();
    opt.saves = save_policy::selective;
    opt.save_after_lookups = 2;
    connector conn(chunker<>(rig_ns("mod:1")), modulo_ownership(1), store, c, cache.view(), opt);
    const auto got2 = compute_and_save(
        conn, cache, 1, prompt);  // outside the lock: it may wait for a peer  // first lookup: not admitted
    LOCKED_REQUIRE(got2);
    LOCKED_CHECK(conn.counters().chunks_saved.value() == 0);
    const auto got3 = compute_and_save(
        conn, cache, 2, prompt);  // outside the lock: it may wait for a peer  // second: admitted
    LOCKED_REQUIRE(got3);
    LOCKED_CHECK(conn.counters().chunks_saved.value() == prompt_chunks);
    const auto plan = lookup_agreed(conn, 3, prompt);
    LOCKED_REQUIRE(plan);
    LOCKED_CHECK(plan->cached_tokens == prompt_chunks * rig_chunk_tokens);
  });
}

TEST_CASE("connector: evicted chunks are reported once a lookup misses them", "[connector]") {
  comm::inproc_world world(1);
  const std::vector<token_id> prompt = rig_prompt(prompt_tokens, 11);
  const std::vector<token_id> other = rig_prompt(prompt_tokens, 12);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    host_kv_cache cache(rig_layout());
    const std::size_t chunk = rig_layout().bytes_per_token() * rig_chunk_tokens;
    memory_store store(prompt_chunks * chunk);  // room for one prompt only
    connector conn(chunker<>(rig_ns("mod:1")), modulo_ownership(1), store, c, cache.view(), rig_options());
    const auto got4 = compute_and_save(conn, cache, 1, prompt);  // outside the lock: it may wait for a peer
    LOCKED_REQUIRE(got4);
    const auto got5 = compute_and_save(
        conn, cache, 2,
        other);  // outside the lock: it may wait for a peer  // evicts the first prompt's chunks
    LOCKED_REQUIRE(got5);
    conn.drain_events();
    const auto got6 = lookup_agreed(conn, 3, prompt);  // outside the lock: it may wait for a peer
    LOCKED_REQUIRE(got6);
    std::size_t evicted = 0;
    for (const kv_event& e : conn.drain_events())
      evicted += e.what == kv_event::kind::evicted ? e.keys.size() : 0;
    LOCKED_CHECK(evicted > 0);
    conn.finish(3);
  });
}

TEST_CASE("connector: bad construction arguments are refused with a reason", "[connector]") {
  comm::inproc_world world(2);
  auto c = world.communicator_for(0);
  memory_store store(1 << 20);
  host_kv_cache cache(rig_layout());
  using conn_t = connector<memory_store, comm::inproc_communicator>;
  CHECK_THROWS_WITH(conn_t(chunker<>(rig_ns("mod:3")), modulo_ownership(3), store, c, cache.view()),
                    Catch::Contains("ownership world size 3 != communicator size 2"));
  connector_options opt;
  opt.policy = load_policy::cost;
  CHECK_THROWS_WITH(conn_t(chunker<>(rig_ns("mod:2")), modulo_ownership(2), store, c, cache.view(), opt),
                    Catch::Contains("need node figures"));
}

TEST_CASE("connector: check_deployment agrees at setup and names a rank configured differently",
          "[connector]") {
  comm::inproc_world world(3);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    memory_store store(1 << 20);
    host_kv_cache cache(rig_layout());
    connector same(chunker<>(rig_ns("mod:3")), modulo_ownership(3), store, c, cache.view(), rig_options());
    const auto got7 = same.check_deployment(deadline_after(std::chrono::seconds(5)))
                          .ec;  // outside the lock: it may wait for a peer
    LOCKED_CHECK_FALSE(got7);
    // Rank 2 runs another model: its key namespace differs.
    key_namespace ns = rig_ns("mod:3");
    if (c.rank() == 2) ns.model = "another-model";
    connector odd(chunker<>(ns), modulo_ownership(3), store, c, cache.view(), rig_options());
    const deployment_check_result r = odd.check_deployment(deadline_after(std::chrono::seconds(5)));
    LOCKED_CHECK(r.ec == errc::invalid_argument);
    LOCKED_CHECK(r.field == "namespace_fingerprint");
    LOCKED_CHECK(r.rank == 2);
  });
}

TEST_CASE("connector policies: cost skips a load slower than recomputing; split loads [k, hit)",
          "[connector]") {
  const std::uint64_t hit = prompt_chunks * rig_chunk_tokens;
  {  // recomputing at 1e9 tokens/s beats loading 1 MB per token at 1 GB/s: nothing to load
    load_scenario sc{.world = 2};
    sc.opt.policy = load_policy::cost;
    sc.opt.node = {.kv_bytes_per_token = 1e6, .prefill_tokens_per_s = 1e9};
    sc.opt.prior = {.fixed_cost_s = 0, .bandwidth_gb_per_s = 1.0};
    for (const rank_load_report& rep : run_load(sc, plain_store_for{})) {
      LOCKED_REQUIRE(rep.plan);
      LOCKED_CHECK(rep.plan->cached_tokens == hit);
      LOCKED_CHECK(rep.plan->tokens_to_load() == 0);
      LOCKED_CHECK_FALSE(rep.outcome);
    }
  }
  {  // 1 ms per token either way: compute [0, 64) while loading [64, 192) (split_point at 2 x 32)
    load_scenario sc{.world = 2, .two_comms = true};
    sc.opt.policy = load_policy::split;
    sc.opt.node = {.kv_bytes_per_token = 1e6, .prefill_tokens_per_s = 1e3};
    sc.opt.race_recompute = false;  // made-up figures: a TSan build on a busy host may lose a 128 ms race
    sc.opt.prior = {.fixed_cost_s = 0, .bandwidth_gb_per_s = 1.0};
    const auto reps = run_load(sc, plain_store_for{});
    for (const rank_load_report& rep : reps) {
      LOCKED_REQUIRE(rep.plan);
      LOCKED_CHECK(rep.plan->cached_tokens == hit);
      LOCKED_CHECK(rep.plan->load_first_token == 64);
      LOCKED_CHECK(rep.plan->load_end_token == hit);
      LOCKED_REQUIRE(rep.outcome);
      LOCKED_CHECK(rep.outcome->complete());
      LOCKED_CHECK(rep.wrong == 0);  // the loaded range [64, 192) is the model's, byte for byte
      LOCKED_CHECK(rep.calls == reps[0].calls);
    }
  }
}
