// bench/connector/load_rig.hpp: the one prompt bench_connector (ranks as threads) and
// bench_connector_mpi (ranks as processes) load: 64 chunks x 2 MiB (vLLM MLA pages: 8 layers x
// 512 latent bf16 x 256 tokens), its chunks' bytes, the connector's load loop and the byte check.
//
//   kvtier_bench::load_rig rig(W);                       // keys, layout, namespace for W ranks
//   rig.put_owned(store, r);                             // rank r's chunks into its own store
//   auto got = kvtier_bench::connector_load(conn, id, rig.prompt, slots);   // loaded tokens
//   if (rig.wrong_chunks(cache.view(), slots)) ...       // pages hold every chunk's bytes?
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kvtier.hpp"

namespace kvtier_bench {

struct load_rig {
  static constexpr std::size_t T = 256, C = 64;
  static constexpr std::uint32_t page = 64, layers = 8, layers_per_group = 2;

  explicit load_rig(kvtier::rank_t world)
      : W(world),
        ns{.model = "bench",
           .kv_format = "mla",
           .chunk_tokens = T,
           .ownership = "mod:" + std::to_string(world)},
        chunk(ns),
        own(world) {
    prompt.resize(C * T);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = kvtier::token_id(i * 7919 % 151552);
    keys = chunk.keys(prompt);
  }

  static kvtier::kv_layout layout() {
    return kvtier::kv_layout::vllm_mla(layers, /*num_blocks=*/C * T / page + 8, page, 2, /*latent=*/512);
  }
  static std::size_t chunk_bytes() { return layout().bytes_per_token() * T; }
  static std::byte byte_of(std::size_t chunk, std::size_t i) { return std::byte(chunk * 131 + i); }

  /// Rank r's owned chunks into its store.
  template <class Store>
  void put_owned(Store& store, kvtier::rank_t r) const {
    std::vector<std::byte> v(chunk_bytes());
    for (std::size_t k = r; k < C; k += W) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = byte_of(k, i);
      kvtier::chunk_status st{};
      const std::span<const std::byte> src(v);
      store.put(std::span(&keys[k], 1), std::span(&src, 1), std::span(&st, 1),
                kvtier::deadline_after(std::chrono::seconds(10)));
    }
  }

  /// Chunks whose bytes in the pages at `slots` differ from what was stored.
  std::size_t wrong_chunks(const kvtier::kv_cache_view& cache, std::span<const std::int64_t> slots) const {
    std::vector<std::byte> v(chunk_bytes());
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < C; ++k) {
      bool same = !kvtier::kv_gather(cache, slots.subspan(k * T, T), v);
      for (std::size_t i = 0; same && i < v.size(); ++i) same = v[i] == byte_of(k, i);
      wrong += !same;
    }
    return wrong;
  }

  /// Zeroes the pages at `slots` (so a check after a load sees only what that load wrote).
  static void clear(const kvtier::kv_cache_view& cache, std::span<const std::int64_t> slots) {
    const std::vector<std::byte> zero(chunk_bytes());
    for (std::size_t k = 0; k < C; ++k) kvtier::kv_scatter(cache, slots.subspan(k * T, T), zero);
  }

  /// The connector's options for these loads: layer groups of 2, room for two loads, deadlines
  /// long enough that the figures are of loads that finish.
  static kvtier::connector_options connector_options() {
    kvtier::connector_options opt;
    opt.layers_per_group = layers_per_group;
    opt.max_bytes_in_flight = std::size_t{2} * C * chunk_bytes();
    opt.load_deadline.base = std::chrono::seconds(10);
    opt.load_deadline.cap = std::chrono::seconds(30);
    return opt;
  }

  kvtier::rank_t W;
  kvtier::key_namespace ns;
  kvtier::chunker<> chunk;
  kvtier::modulo_ownership own;
  std::vector<kvtier::token_id> prompt;
  std::vector<kvtier::chunk_key> keys;
};

/// One request through the connector: lookup, load into `slots`, steps until the outcome is
/// agreed (an engine steps once per forward pass; `between_steps` stands for one). Returns the
/// agreed loaded end token. `fetched` (optional) gets the time this rank's own fetch ended.
template <class Connector>
std::uint64_t connector_load(Connector& conn, kvtier::request_id id, std::span<const kvtier::token_id> prompt,
                             std::span<const std::int64_t> slots,
                             std::chrono::steady_clock::time_point* fetched = nullptr,
                             std::chrono::microseconds between_steps = std::chrono::microseconds(100)) {
  const auto dl = [] { return kvtier::deadline_after(std::chrono::seconds(30)); };
  const auto engine_step = [&] {
    conn.step(dl());
    if (fetched && *fetched == std::chrono::steady_clock::time_point{} &&
        !conn.wait_local(id, kvtier::deadline_after(std::chrono::seconds(0))))
      *fetched = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(between_steps);
  };
  // Bounded: a step past its deadline fails on every rank and ends the lookup or load there.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  const auto running = [&] { return std::chrono::steady_clock::now() < give_up; };
  conn.begin_lookup(id, prompt);
  while (!conn.lookup(id) && running()) engine_step();
  if (!conn.lookup(id) || !conn.lookup(id)->tokens_to_load()) {
    conn.finish(id);
    return 0;
  }
  conn.load(id, slots);
  while (!conn.load_result(id) && running()) engine_step();
  if (!conn.load_result(id)) {
    conn.finish(id);
    return 0;
  }
  if (fetched && *fetched == std::chrono::steady_clock::time_point{})
    *fetched = std::chrono::steady_clock::now();
  const std::uint64_t got = conn.load_result(id)->loaded_end_token;
  conn.finish(id);
  return got;
}

/// When an engine's forward over a loading request got each layer: load(), then per layer
/// wait_for_layer(l) and `compute` of that layer (a sleep: the engine's GPU, not this host's
/// cores), then steps until the outcome. Seconds from load(): layer 0 ready, the last layer
/// ready, the forward's end, the outcome agreed; and the agreed loaded end token.
struct forward_times {
  double first_layer = 0, last_layer = 0, forward_end = 0, outcome = 0;
  std::uint64_t loaded = 0;
};
template <class Connector>
forward_times connector_forward(Connector& conn, kvtier::request_id id,
                                std::span<const kvtier::token_id> prompt, std::span<const std::int64_t> slots,
                                std::uint32_t layers, std::chrono::microseconds compute) {
  using clk = std::chrono::steady_clock;
  const auto dl = [] { return kvtier::deadline_after(std::chrono::seconds(30)); };
  const auto give_up = clk::now() + std::chrono::seconds(120);  // bounded, as connector_load
  forward_times out;
  conn.begin_lookup(id, prompt);
  while (!conn.lookup(id) && clk::now() < give_up) {
    conn.step(dl());
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (!conn.lookup(id) || !conn.lookup(id)->tokens_to_load()) {
    conn.finish(id);
    return out;
  }
  const auto t0 = clk::now();
  const auto since = [&] { return std::chrono::duration<double>(clk::now() - t0).count(); };
  conn.load(id, slots);
  for (std::uint32_t l = 0; l < layers; ++l) {
    (void)conn.wait_for_layer(l, dl());  // agrees group(l) itself while it is not yet agreed
    out.last_layer = since();
    if (l == 0) out.first_layer = out.last_layer;
    std::this_thread::sleep_for(compute);
  }
  out.forward_end = since();
  while (!conn.load_result(id) && clk::now() < give_up) conn.step(dl());
  out.outcome = since();
  if (conn.load_result(id)) out.loaded = conn.load_result(id)->loaded_end_token;
  conn.finish(id);
  return out;
}

}  // namespace kvtier_bench
