// tests/connector/connector_rig.hpp: W ranks on threads, each with its own store, paged host
// cache (vLLM MLA layout) and connector, driving the lifecycle at the same points on every
// rank. Steps loop until an agreed condition holds, so every rank runs the same steps.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/store/memory_store.hpp"

namespace kvtier::test {

inline constexpr std::size_t rig_chunk_tokens = 32;
inline constexpr std::uint32_t rig_layers = 4;

inline key_namespace rig_ns(const std::string& ownership) {
  return {.model = "connector-test",
          .kv_format = "mla-bf16",
          .chunk_tokens = rig_chunk_tokens,
          .ownership = ownership};
}

inline kv_layout rig_layout() {
  return kv_layout::vllm_mla(rig_layers, /*num_blocks=*/128, /*block_size=*/16);
}

/// Options for tests that check outcomes, not deadlines: the defaults (a 50 ms lookup, a 200 ms
/// load) expire on a loaded machine under a sanitizer, which turns a complete load into a short
/// one. A test of a timeout sets its own short deadline.
inline connector_options rig_options() {
  connector_options opt;
  opt.lookup_timeout = std::chrono::seconds(20);
  opt.load_deadline = {std::chrono::seconds(30), std::chrono::milliseconds(0), std::chrono::seconds(30)};
  opt.save_timeout = std::chrono::seconds(30);
  return opt;
}

/// "The model": byte b of layer l of the KV at prompt position p (the same on every rank).
inline std::byte model_byte(std::uint64_t pos, std::uint32_t layer, std::size_t b, std::uint64_t salt = 0) {
  std::uint64_t x =
      (pos * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t{layer} << 48) ^ (b * 0xBF58476D1CE4E5B9ull) ^ salt;
  x ^= x >> 29;
  return static_cast<std::byte>(x * 0x94D049BB133111EBull >> 56);
}

/// Writes the model's KV for positions [first, end) of `seq` into the pages.
inline void compute_into(host_kv_cache& cache, const host_kv_cache::sequence& seq, std::uint64_t first,
                         std::uint64_t end) {
  const kv_layout& lay = cache.layout();
  const std::size_t row = lay.layer_bytes_per_token();
  std::vector<std::byte> value(row * lay.num_layers);
  for (std::uint64_t p = first; p < end; ++p) {
    for (std::uint32_t l = 0; l < lay.num_layers; ++l)
      for (std::size_t b = 0; b < row; ++b) value[l * row + b] = model_byte(p, l, b);
    cache.scatter(seq, p, 1, value);
  }
}

/// Bytes of positions [first, end) in the pages that differ from the model's.
inline std::size_t wrong_bytes(const host_kv_cache& cache, const host_kv_cache::sequence& seq,
                               std::uint64_t first, std::uint64_t end,
                               std::uint32_t layers_end = UINT32_MAX) {
  const kv_layout& lay = cache.layout();
  const std::size_t row = lay.layer_bytes_per_token();
  std::vector<std::byte> value(row * lay.num_layers);
  std::size_t wrong = 0;
  const std::uint32_t le = std::min(layers_end, lay.num_layers);
  // Only the layers checked are read: later ones may still be scattered by the mover meanwhile.
  const std::span<std::byte> checked = std::span(value).first(row * le);
  for (std::uint64_t p = first; p < end; ++p) {
    cache.gather(seq, p, 1, checked, {0, le});
    for (std::uint32_t l = 0; l < le; ++l)
      for (std::size_t b = 0; b < row; ++b) wrong += value[l * row + b] != model_byte(p, l, b);
  }
  return wrong;
}

inline std::vector<std::int64_t> slots_of(const host_kv_cache& cache, const host_kv_cache::sequence& seq,
                                          std::uint64_t tokens) {
  return slots_from_block_table({seq.blocks, 0, tokens}, cache.layout().block_size);
}

inline std::vector<token_id> rig_prompt(std::size_t tokens, std::uint64_t seed = 1) {
  std::vector<token_id> t(tokens);
  for (std::size_t i = 0; i < tokens; ++i) t[i] = static_cast<token_id>((i * 7919 + seed * 104729) % 151552);
  return t;
}

/// The deadline of a test's steps: generous, since a step's all-reduce waits for the slowest
/// rank thread, which under a sanitizer on a loaded machine can lag by seconds (a 2 s one
/// expired under TSan with 3 copies at load 15: "recompute", cached 0). The step returns as
/// soon as every rank is in, so this costs nothing; a fault under test sets its own short one.
inline constexpr std::chrono::milliseconds rig_step_timeout{20'000};

/// Steps (on every rank alike) until `agreed()` holds or `max_steps` ran; true if it held.
template <class Conn, class Pred>
bool step_until(Conn& conn, Pred agreed, int max_steps = 20000,
                std::chrono::milliseconds step_timeout = rig_step_timeout) {
  for (int i = 0; i < max_steps; ++i) {
    if (agreed()) return true;
    conn.step(deadline_after(step_timeout));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return agreed();
}

/// Looks a prompt up and, when it has nothing cached, computes and saves it; returns the plan.
template <class Conn>
std::optional<load_plan> lookup_agreed(Conn& conn, request_id id, std::span<const token_id> prompt) {
  conn.begin_lookup(id, prompt);
  if (!step_until(conn, [&] { return conn.lookup(id).has_value(); })) return std::nullopt;
  return conn.lookup(id);
}

/// Computes the prompt into fresh pages and saves it; waits (bounded) until the saves ended.
/// The save failures finished() reports go to `save_errors` when given.
template <class Conn>
bool compute_and_save(Conn& conn, host_kv_cache& cache, request_id id, std::span<const token_id> prompt,
                      std::vector<request_error>* save_errors = nullptr) {
  if (!lookup_agreed(conn, id, prompt)) return false;
  host_kv_cache::sequence seq;
  if (!cache.reserve(seq, prompt.size())) return false;
  compute_into(cache, seq, 0, prompt.size());
  const auto slots = slots_of(cache, seq, prompt.size());
  conn.save(id, slots, 0, prompt.size());
  bool freed = conn.finish(id).free_pages_now;
  const auto keep = [&](finished_requests f) {
    if (save_errors) save_errors->insert(save_errors->end(), f.save_errors.begin(), f.save_errors.end());
    return f;
  };
  if (freed) keep(conn.finished());  // saves that ended before finish(): their failures
  for (int i = 0; i < 20000 && !freed; ++i) {
    for (request_id s : keep(conn.finished()).saves) freed = freed || s == id;
    if (!freed) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  cache.release(seq);
  return freed;
}

/// What one rank saw of a load.
struct rank_load_report {
  std::optional<load_plan> plan;
  std::optional<load_outcome> outcome;
  std::vector<std::size_t> errors;
  std::size_t wrong = 0;  // bytes inside the agreed loaded prefix that differ from the model
  std::vector<comm::collective_call> calls;
  std::uint64_t agreement_failures = 0, save_failures = 0;
  std::vector<request_error> reasons;  // this rank's own: request 1's save failures, request 2's errors()
};

/// A load of a computed and saved prompt on W ranks (request 1 computes and saves, request 2
/// looks up and loads); `after_load(rank)` runs on each rank right after load().
struct load_scenario {
  rank_t world = 2;
  bool two_comms = false;  // a separate data world: the moves run on the mover thread
  connector_options opt = rig_options();
  std::size_t prompt_tokens = 6 * rig_chunk_tokens + 7;
  // The deadline of each step that waits for request 2's load (the lookups' steps keep 2 s: a
  // short one there, on a loaded machine, agrees "recompute" and the load under test never runs).
  std::chrono::milliseconds load_step_timeout = rig_step_timeout;
  std::function<void(rank_t)> after_load;
  std::function<void(rank_t)> after_save;  // after request 1's saves ended, before request 2
};

/// Runs `s`; store_for(rank, memory_store&) gives each rank's store (a std::unique_ptr to any
/// chunk_store, e.g. a fault-injecting wrapper of the memory store).
template <class StoreFor>
std::vector<rank_load_report> run_load(const load_scenario& s, StoreFor store_for) {
  using rec = comm::recording<comm::inproc_communicator&>;
  comm::inproc_world ctrl_world(s.world), data_world(s.world);
  std::vector<rank_load_report> reports(s.world);
  const std::vector<token_id> prompt = rig_prompt(s.prompt_tokens);
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    comm::inproc_communicator d = data_world.communicator_for(r);
    rec ctrl(c);
    memory_store mem(64 << 20);
    auto store = store_for(r, mem);
    host_kv_cache cache(rig_layout());
    const modulo_ownership own(s.world);
    const auto step_to = [&](auto& conn, auto pred) { return step_until(conn, pred); };
    const auto step_load_to = [&](auto& conn, auto pred) {
      return step_until(conn, pred, 20000, s.load_step_timeout);
    };
    auto run = [&](auto& conn) {
      rank_load_report& rep = reports[r];
      if (!compute_and_save(conn, cache, 1, prompt, &rep.reasons)) return;
      if (s.after_save) s.after_save(r);
      conn.begin_lookup(2, prompt);
      if (!step_to(conn, [&] { return conn.lookup(2).has_value(); })) return;
      rep.plan = conn.lookup(2);
      host_kv_cache::sequence seq;
      if (!cache.reserve(seq, prompt.size())) return;
      const auto slots = slots_of(cache, seq, prompt.size());
      if (rep.plan->tokens_to_load()) {
        conn.load(2, slots);
        if (s.after_load) s.after_load(r);
        if (!step_load_to(conn, [&] { return conn.load_result(2).has_value(); })) return;
        rep.outcome = conn.load_result(2);
        rep.errors = conn.load_errors(2);
        rep.wrong = wrong_bytes(cache, seq, rep.outcome->load_first_token, rep.outcome->loaded_end_token);
      }
      const std::vector<request_error> own = conn.errors(2);
      rep.reasons.insert(rep.reasons.end(), own.begin(), own.end());
      conn.finish(2);
      rep.calls = ctrl.calls();
      rep.agreement_failures = conn.counters().agreement_failures.value();
      rep.save_failures = conn.counters().save_failures.value();
    };
    chunker<> chunk(rig_ns(own.geometry()));
    if (s.two_comms) {
      connector conn(chunk, own, *store, ctrl, d, cache.view(), s.opt);
      run(conn);
    } else {
      connector conn(chunk, own, *store, ctrl, cache.view(), s.opt);
      run(conn);
    }
  });
  return reports;
}

/// A point where a test's fake (a store, a communicator) waits until the test lets it go:
/// arrive(dl) marks the point reached and waits for release(), `dl` or 20 s, whichever is first
/// (true: released); the test waits for the arrival with wait_reached().
class hold_point {
 public:
  bool arrive(deadline dl) {
    std::unique_lock lock(mu_);
    reached_ = true;
    cv_.notify_all();
    return cv_.wait_until(lock, std::min(dl, clock::now() + std::chrono::seconds(20)),
                          [&] { return released_; });
  }
  bool wait_reached(std::chrono::seconds limit) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return reached_; });
  }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, released_ = false;
};

/// The plain memory store of run_load (each rank's own).
struct plain_store_for {
  std::unique_ptr<memory_store> operator()(rank_t, memory_store&) const {
    return std::make_unique<memory_store>(64 << 20);
  }
};

}  // namespace kvtier::test
