// tests/connector/connector_model.hpp: a model-based harness for kvtier::connector (issue 26).
//
// A case (model_case) is a world (W = 1..4 rank threads, whole chunks or stream_groups, one
// communicator or two, 2-4 layers in groups of 1 or 2), a few prompts that share prefixes, what
// the stores hold at the start, scripted adversaries (per rank: what its store's n-th get, put or
// exists does; per case: a round of one rank's communicator that fails or stalls) and a list of
// engine calls (command). run_case() hands each command to every rank thread, waits (bounded) for
// all of them, and checks after every command, against a reference model of what every store and
// every rank's pages must hold (the bytes of connector_rig's model_byte, salted per chunk key):
//
//   1. agreed values are equal on every rank: plans, outcomes, load_errors, step results,
//      finished().loads, the layer wait's ready ends; at the end, every rank's recorded
//      collectives (control and data);
//   2. what an answer says is in the pages is, when it says so: an outcome's [first, loaded_end)
//      (all layers), a layer wait's [first_token, ready_end_token) of layer l; an outcome never
//      counts loaded a token past an agreed layer answer's ready end; and a page
//      that held its bytes keeps them, also once freed at finish and reused by a later request;
//      a free page block (never reserved, or freed) is never written;
//   3. every known key in every store holds exactly its reference bytes (or is absent);
//   4. step, wait_for_layer, wait_local and wait_for_save return by their deadline plus `margin`
//      (with one communicator, step and wait_for_layer move inside: by the loads' deadlines);
//   5. no exception escapes (std::invalid_argument only where documented: a load range that is
//      not whole chunks); begin_lookup of a known id, and load / save / begin_save with slots
//      that leave a token they cover without a page, are errc::invalid_argument (with good slots
//      they succeed);
//   6. an agreed plan, outcome or load_errors never changes once reported, nor a rank's first
//      reason of a stage (errors(id)); an agreed layer answer never lists more than an earlier
//      one for the same load and layer;
//   7. a load agreed short that the engine did not cut (limit_load / cancel_load) has a load
//      reason (errors(id)) on at least one rank; a put that failed counts as a save failure;
//      no plan counts a chunk its owner never held;
//   and the sanity checks of a case without adversaries and with generous deadlines: a plan
//   covers the prefix that was stored at begin_lookup, and a load of a fully stored range with
//   good slots, uncut and with no failed agreement, ends complete.
//
// The engine computes (writes the model's bytes into) exactly what it did not load (and layer l
// past an agreed layer answer's ready end), saves only what it computed, and frees a request's
// pages at finish (or once finished() lists its saves).
// The same rank (basic_rank_runner) and checks (detail::checker) run with ranks that are MPI
// processes in test_connector_model_mpi, which exchanges the reports (rank_obs) over MPI.
// A counterexample prints as C++ (operator<< of model_case): paste it into run_case() to keep it
// as a regression test (test_connector_model.cpp has the ones the suite found).
//
// Knobs (environment): KVTIER_PROPERTY_CASES (cases), KVTIER_MODEL_WITHOUT=a,b (features the
// generator leaves out, to look past a known bug), KVTIER_MODEL_PUT_THROWS=0 (a put_fault::throws
// fails the put instead of throwing), KVTIER_MODEL_TRACE=1 (each command's agreed values, per rank),
// KVTIER_MODEL_PROFILE=1 (time per command kind).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "connector/connector_rig.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/store/memory_store.hpp"

namespace kvtier::test::model {

inline constexpr std::uint64_t T = 16;  // tokens per chunk
inline constexpr std::uint32_t block_size = 16;
inline constexpr std::uint64_t num_blocks = 64;
inline constexpr std::size_t row = 8;  // bytes of one token of one layer (vllm_mla, 2 x 4)
inline constexpr std::size_t max_ranks = 4, max_requests = 4;
inline constexpr std::chrono::milliseconds margin{2000};     // invariant 4
inline constexpr std::chrono::milliseconds generous{10000};  // deadlines of a case without adversaries
inline constexpr std::chrono::seconds command_limit{60};     // the harness's bounded wait per command

// ---- the case -----------------------------------------------------------------------------------

enum class op : std::uint8_t {
  begin_lookup,    // every rank: begin_lookup(id, prompt)
  step,            // every rank: step(dl)
  settle,          // every rank: step until every lookup and load is agreed (an agreed condition)
  load,            // every rank: load(id, slots) or load(id, slots, first, end) or load(id, block table)
  wait_for_layer,  // every rank
  wait_local,      // every rank, local
  limit_load,      // each rank its own cap (or none)
  cancel_load,     // one rank (or every rank)
  compute,         // the engine writes the model's bytes into the pages it has not loaded
  save,            // every rank: save(id, slots, first, end) of a computed request
  save_by_layer,   // begin_save + save_layer(l) for the first `layer` layers (all: 255)
  wait_for_save,   // every rank, local
  finish,          // every rank
  finished,        // every rank: finished() (its loads are agreed)
  drain_events,    // every rank, local
};

enum class slots_kind : std::uint8_t {
  ok,            // a page for every position
  block_table,   // load(id, block table) of the plan (whole loads only; else ok)
  short_slots,   // one entry short of the end
  out_of_range,  // one slot inside the range past the cache
  minus_one,     // one slot inside the range -1
  short_table,   // load(id, block table) with one block short of the plan's end
};

enum class get_fault : std::uint8_t {
  none,
  late_hits,      // sleeps past the deadline, then answers hits (what the store has); stream_groups:
                  // from group `group` of key `key` on
  stall,          // returns at the deadline: every key timeout
  throws,         // throws std::runtime_error
  corrupt,        // key `key` corrupt, its bytes garbage
  corrupt_group,  // stream_groups: group `group` of key `key` corrupt (whole chunks: corrupt)
  evict,          // key `key` is evicted just before the read (gone since the lookup)
  slow_first,     // sleeps `group` ms before the first group lands
  stall_group,    // stream_groups: groups below `group` land, then it stalls to the deadline
};
enum class put_fault : std::uint8_t { none, fails, throws, slow };
enum class exists_fault : std::uint8_t { none, stall, late, throws, error };

struct get_fault_spec {
  get_fault f = get_fault::none;
  std::uint8_t key = 0;
  std::uint8_t group = 0;
};

/// One rank's store script: entry n says what its n-th get / put / exists call does.
struct rank_faults {
  std::vector<get_fault_spec> gets;
  std::vector<put_fault> puts;
  std::vector<exists_fault> exists;
};

/// Round `round` (top-level collectives: all-reduces and groups) of rank `rank`'s control (or,
/// with two communicators and `data`, data) communicator stalls past its deadline, fails, or
/// (slow_ms) joins late.
struct comm_fault {
  std::uint8_t rank = 0;
  std::uint8_t round = 0;
  bool fail = false;  // false: stall
  bool data = false;
  std::uint8_t slow_ms = 0;  // set: neither; the rank joins each group (a move) of rounds
                             // [round, round + 6) this much late (timing only: not adversarial)
};

/// Tokens: `chunks` full chunks and `tail` more of token stream `family`, the stream of
/// (family, variant) from chunk `diverge` on; prompts of a family share the chunks before it.
struct prompt_spec {
  std::uint8_t family = 0;
  std::uint8_t chunks = 1;
  std::uint8_t tail = 0;
  std::uint8_t diverge = 255;
  std::uint8_t variant = 0;
};

/// Before the first command: the owners of prompt `prompt`'s chunks [0, chunks) store them
/// (except chunk `hole`).
struct warm_spec {
  std::uint8_t prompt = 0;
  std::uint8_t chunks = 1;
  std::uint8_t hole = 255;
};

struct command {
  op what = op::step;
  std::uint8_t req = 0;  // request index (id req + 1)
  std::uint8_t a = 255;  // load: chunk offset into the plan (255 the plan, 254 not whole chunks);
                         // save: first chunk (255: [0, prompt))
  std::uint8_t b = 0;    // load, save: chunks - 1
  std::uint8_t ms = 0;   // deadline of a blocking call (0: the case's)
  slots_kind slots = slots_kind::ok;  // on rank `rank` (>= W: every rank)
  std::uint8_t rank = 255;            // slots, cancel_load: which rank (>= W: every rank)
  std::uint8_t layer = 255;           // wait_for_layer: the layer; save_by_layer: layers reported
  std::array<std::uint8_t, max_ranks> caps{255, 255, 255, 255};  // limit_load per rank (255: none)

  // Builders, so that a printed command reads as the code that makes it.
  command range(std::uint8_t first, std::uint8_t count_minus_one) const {
    command c = *this;
    c.a = first, c.b = count_minus_one;
    return c;
  }
  command not_whole_chunks() const { return range(254, 0); }
  command with_ms(std::uint8_t m) const {
    command c = *this;
    c.ms = m;
    return c;
  }
  command with_slots(slots_kind k, std::uint8_t on_rank = 255) const {
    command c = *this;
    c.slots = k, c.rank = on_rank;
    return c;
  }
};

inline command begin_lookup(std::uint8_t r) { return {.what = op::begin_lookup, .req = r}; }
inline command step() { return {.what = op::step}; }
inline command settle() { return {.what = op::settle}; }
inline command load(std::uint8_t r) { return {.what = op::load, .req = r}; }
inline command wait_for_layer(std::uint8_t l) { return {.what = op::wait_for_layer, .layer = l}; }
inline command wait_local(std::uint8_t r) { return {.what = op::wait_local, .req = r}; }
inline command limit_load(std::uint8_t r, std::array<std::uint8_t, max_ranks> caps) {
  return {.what = op::limit_load, .req = r, .caps = caps};
}
inline command cancel_load(std::uint8_t r, std::uint8_t on_rank) {
  return {.what = op::cancel_load, .req = r, .rank = on_rank};
}
inline command compute(std::uint8_t r) { return {.what = op::compute, .req = r}; }
inline command save(std::uint8_t r) { return {.what = op::save, .req = r}; }
inline command save_by_layer(std::uint8_t r, std::uint8_t layers = 255) {
  return {.what = op::save_by_layer, .req = r, .layer = layers};
}
inline command wait_for_save(std::uint8_t r) { return {.what = op::wait_for_save, .req = r}; }
inline command finish(std::uint8_t r) { return {.what = op::finish, .req = r}; }
inline command finished() { return {.what = op::finished}; }
inline command drain_events() { return {.what = op::drain_events}; }

struct model_case {
  std::uint8_t world = 1;
  bool two_comms = false;
  bool streamed = false;  // connector_options::stream_groups over a group-streaming store
  std::uint8_t layers = 2;
  std::uint8_t per_group = 1;  // connector_options::layers_per_group
  std::uint8_t batch = 1;      // connector_options::fetch_batch_chunks
  std::uint8_t workers = 1;    // connector_options::fetch_workers
  std::uint16_t load_ms = 0;   // load deadline (0: generous)
  std::uint16_t lookup_ms = 0;
  std::uint16_t step_ms = 0;  // deadline of step / wait_for_layer / waits without their own
  std::vector<prompt_spec> prompts;
  std::vector<warm_spec> warm;
  std::vector<rank_faults> faults;  // per rank
  std::vector<comm_fault> comm;
  std::vector<command> commands;

  /// No adversary and every deadline generous: what the sanity checks need.
  bool generous() const { return !adversarial() && !load_ms && !lookup_ms && !step_ms; }

  bool adversarial() const {
    for (const comm_fault& f : comm)
      if (!f.slow_ms) return true;
    for (const rank_faults& f : faults) {
      for (const auto& g : f.gets)
        if (g.f != get_fault::none) return true;
      for (put_fault p : f.puts)
        if (p != put_fault::none) return true;
      for (exists_fault e : f.exists)
        if (e != exists_fault::none) return true;
    }
    return false;
  }
};

// ---- printing (as C++) -------------------------------------------------------------------------

inline const char* name(op o) {
  constexpr const char* n[] = {"begin_lookup",  "step",          "settle",      "load",     "wait_for_layer",
                               "wait_local",    "limit_load",    "cancel_load", "compute",  "save",
                               "save_by_layer", "wait_for_save", "finish",      "finished", "drain_events"};
  return n[static_cast<int>(o)];
}
inline const char* name(slots_kind k) {
  constexpr const char* n[] = {"ok",           "block_table", "short_slots",
                               "out_of_range", "minus_one",   "short_table"};
  return n[static_cast<int>(k)];
}
inline const char* name(get_fault f) {
  constexpr const char* n[] = {"none",          "late_hits", "stall",      "throws",     "corrupt",
                               "corrupt_group", "evict",     "slow_first", "stall_group"};
  return n[static_cast<int>(f)];
}
inline const char* name(put_fault f) {
  constexpr const char* n[] = {"none", "fails", "throws", "slow"};
  return n[static_cast<int>(f)];
}
inline const char* name(exists_fault f) {
  constexpr const char* n[] = {"none", "stall", "late", "throws", "error"};
  return n[static_cast<int>(f)];
}

inline std::ostream& operator<<(std::ostream& os, const command& c) {
  const int r = c.req;
  switch (c.what) {
    case op::step:
    case op::settle:
    case op::finished:
    case op::drain_events:
      os << name(c.what) << "()";
      break;
    case op::wait_for_layer:
      os << "wait_for_layer(" << int(c.layer) << ")";
      break;
    case op::limit_load:
      os << "limit_load(" << r << ", {" << int(c.caps[0]) << ", " << int(c.caps[1]) << ", " << int(c.caps[2])
         << ", " << int(c.caps[3]) << "})";
      break;
    case op::cancel_load:
      os << "cancel_load(" << r << ", " << int(c.rank) << ")";
      break;
    case op::save_by_layer:
      os << "save_by_layer(" << r << ", " << int(c.layer) << ")";
      break;
    default:
      os << name(c.what) << "(" << r << ")";
  }
  if ((c.what == op::load || c.what == op::save || c.what == op::save_by_layer) && c.a != 255)
    os << (c.a == 254 && c.what == op::load
               ? std::string(".not_whole_chunks()")
               : ".range(" + std::to_string(c.a) + ", " + std::to_string(c.b) + ")");
  if (c.ms) os << ".with_ms(" << int(c.ms) << ")";
  if (c.slots != slots_kind::ok)
    os << ".with_slots(slots_kind::" << name(c.slots) << (c.rank != 255 ? ", " + std::to_string(c.rank) : "")
       << ")";
  return os;
}

inline std::ostream& operator<<(std::ostream& os, const model_case& c) {
  os << "model_case{.world = " << int(c.world);
  if (c.two_comms) os << ", .two_comms = true";
  if (c.streamed) os << ", .streamed = true";
  os << ", .layers = " << int(c.layers) << ", .per_group = " << int(c.per_group)
     << ", .batch = " << int(c.batch);
  if (c.workers != 1) os << ", .workers = " << int(c.workers);
  if (c.load_ms) os << ", .load_ms = " << c.load_ms;
  if (c.lookup_ms) os << ", .lookup_ms = " << c.lookup_ms;
  if (c.step_ms) os << ", .step_ms = " << c.step_ms;
  os << ",\n  .prompts = {";
  for (std::size_t i = 0; i < c.prompts.size(); ++i) {
    const prompt_spec& p = c.prompts[i];
    os << (i ? ", " : "") << "{.family = " << int(p.family) << ", .chunks = " << int(p.chunks);
    if (p.tail) os << ", .tail = " << int(p.tail);
    if (p.diverge != 255) os << ", .diverge = " << int(p.diverge) << ", .variant = " << int(p.variant);
    os << "}";
  }
  os << "}";
  if (!c.warm.empty()) {
    os << ",\n  .warm = {";
    for (std::size_t i = 0; i < c.warm.size(); ++i) {
      os << (i ? ", " : "") << "{.prompt = " << int(c.warm[i].prompt)
         << ", .chunks = " << int(c.warm[i].chunks);
      if (c.warm[i].hole != 255) os << ", .hole = " << int(c.warm[i].hole);
      os << "}";
    }
    os << "}";
  }
  bool any_fault = false;
  for (const rank_faults& f : c.faults)
    any_fault = any_fault || !f.gets.empty() || !f.puts.empty() || !f.exists.empty();
  if (any_fault) {
    os << ",\n  .faults = {";
    for (std::size_t r = 0; r < c.faults.size(); ++r) {
      const rank_faults& f = c.faults[r];
      os << (r ? ", " : "") << "{";
      const char* sep = "";
      if (!f.gets.empty()) {
        os << ".gets = {";
        for (std::size_t i = 0; i < f.gets.size(); ++i) {
          os << (i ? ", " : "") << "{";
          if (f.gets[i].f == get_fault::none && !f.gets[i].key && !f.gets[i].group) {  // a call that works
            os << "}";
            continue;
          }
          os << "get_fault::" << name(f.gets[i].f);
          if (f.gets[i].key || f.gets[i].group) os << ", " << int(f.gets[i].key);
          if (f.gets[i].group) os << ", " << int(f.gets[i].group);
          os << "}";
        }
        os << "}";
        sep = ", ";
      }
      if (!f.puts.empty()) {
        os << sep << ".puts = {";
        for (std::size_t i = 0; i < f.puts.size(); ++i)
          os << (i ? ", " : "") << "put_fault::" << name(f.puts[i]);
        os << "}";
        sep = ", ";
      }
      if (!f.exists.empty()) {
        os << sep << ".exists = {";
        for (std::size_t i = 0; i < f.exists.size(); ++i)
          os << (i ? ", " : "") << "exists_fault::" << name(f.exists[i]);
        os << "}";
      }
      os << "}";
    }
    os << "}";
  }
  if (!c.comm.empty()) {
    os << ",\n  .comm = {";
    for (std::size_t i = 0; i < c.comm.size(); ++i)
      os << (i ? ", " : "") << "{.rank = " << int(c.comm[i].rank) << ", .round = " << int(c.comm[i].round)
         << (c.comm[i].fail ? ", .fail = true" : "") << (c.comm[i].data ? ", .data = true" : "")
         << (c.comm[i].slow_ms ? ", .slow_ms = " + std::to_string(c.comm[i].slow_ms) : std::string()) << "}";
    os << "}";
  }
  os << ",\n  .commands = {";
  for (std::size_t i = 0; i < c.commands.size(); ++i) os << (i ? ", " : "") << c.commands[i];
  os << "}}";
  return os;
}

// ---- the reference model ----------------------------------------------------------------------

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

inline std::vector<token_id> prompt_tokens(const prompt_spec& p) {
  const std::size_t n = p.chunks * T + p.tail;
  std::vector<token_id> t(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t stream = i / T >= p.diverge ? 1000 + p.family * 64 + p.variant : p.family;
    t[i] = static_cast<token_id>(mix(stream * 0x10001 + i) % 151552);
  }
  return t;
}

/// The salt of the model's bytes of a chunk: its key (the prefix through the chunk).
inline std::uint64_t key_salt(const chunk_key& k) { return mix(k.hi ^ mix(k.lo)); }

/// A prompt's reference KV, layer-major: byte b of layer l at position p is at (l * P + p) * row + b.
struct prompt_ref {
  std::vector<token_id> tokens;
  std::vector<chunk_key> keys;
  std::size_t P = 0;
  std::vector<std::byte> bytes;

  std::span<const std::byte> layer_run(std::uint32_t l, std::uint64_t first, std::uint64_t count) const {
    return std::span(bytes).subspan((l * P + first) * row, count * row);
  }
};

inline prompt_ref make_prompt(const prompt_spec& spec, const chunker<>& chunk, std::uint32_t layers,
                              std::size_t index) {
  prompt_ref p;
  p.tokens = prompt_tokens(spec);
  p.keys = chunk.keys(p.tokens);
  p.P = p.tokens.size();
  p.bytes.resize(layers * p.P * row);
  for (std::uint64_t pos = 0; pos < p.P; ++pos) {
    const std::size_t c = pos / T;
    const std::uint64_t salt = c < p.keys.size() ? key_salt(p.keys[c]) : mix(0x7a11 + index);
    for (std::uint32_t l = 0; l < layers; ++l)
      for (std::size_t b = 0; b < row; ++b) p.bytes[(l * p.P + pos) * row + b] = model_byte(pos, l, b, salt);
  }
  return p;
}

/// A chunk key's reference value (layer-major, as a store holds it).
struct key_ref {
  std::size_t chunk = 0;
  std::vector<std::byte> value;
};

// ---- adversaries ------------------------------------------------------------------------------

/// How far past its deadline a late answer (get_fault::late_hits, exists_fault::late) comes: 2 ms
/// on rank threads; more where the ranks are processes on a loaded machine, so that a step still
/// falls between the deadline and the late answer on every rank (test_connector_model_mpi).
inline std::chrono::milliseconds& late_by() {
  static std::chrono::milliseconds by{2};
  return by;
}

/// The per-rank store: the memory store, with the case's script of faults per call.
class adv_store {
 public:
  adv_store(memory_store& inner, rank_faults script, value_format fmt, bool puts_may_throw)
      : inner_(inner), script_(std::move(script)), fmt_(fmt), puts_may_throw_(puts_may_throw) {}

  value_format format() const { return fmt_; }
  memory_store& inner() { return inner_; }
  int failed_puts() const { return failed_puts_.load(); }
  /// Keys this store ever held (warm-up and every put it kept): no plan may count one never held.
  bool ever_held(const chunk_key& k) const {
    std::lock_guard lock(mu_);
    return ever_.count(k) != 0;
  }
  void note_held(const chunk_key& k) {
    std::lock_guard lock(mu_);
    ever_.insert(k);
  }

  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
    const std::size_t call = exists_calls_++;
    const exists_fault f = call < script_.exists.size() ? script_.exists[call] : exists_fault::none;
    switch (f) {
      case exists_fault::stall:
        sleep_to(dl);
        std::fill(st.begin(), st.end(), chunk_status::timeout);
        return make_error_code(errc::timeout);
      case exists_fault::late:
        sleep_to(dl + late_by());
        return inner_.exists(k, st, no_deadline);
      case exists_fault::throws:
        throw std::runtime_error("adversary: exists throws");
      case exists_fault::error:
        std::fill(st.begin(), st.end(), chunk_status::error);
        return make_error_code(errc::backend_error);
      case exists_fault::none:
        break;
    }
    return inner_.exists(k, st, dl);
  }

  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> st, deadline dl) {
    const get_fault_spec f = next_get();
    const std::size_t n = keys.size();
    switch (f.f) {
      case get_fault::throws:
        throw std::runtime_error("adversary: get throws");
      case get_fault::stall:
      case get_fault::stall_group:
        sleep_to(dl);
        std::fill(st.begin(), st.end(), chunk_status::timeout);
        return make_error_code(errc::timeout);
      case get_fault::late_hits:
        sleep_to(dl + late_by());
        return inner_.get(keys, dst, st, no_deadline);
      case get_fault::evict:
        if (n) inner_.erase(keys[f.key % n]);
        break;
      case get_fault::slow_first:
        std::this_thread::sleep_for(std::chrono::milliseconds(f.group % 8 + 1));
        break;
      default:
        break;
    }
    const std::error_code ec = inner_.get(keys, dst, st, dl);
    if ((f.f == get_fault::corrupt || f.f == get_fault::corrupt_group) && n) {
      const std::size_t k = f.key % n;
      st[k] = chunk_status::corrupt;
      std::memset(dst[k].data(), 0xEE, dst[k].size());
    }
    return ec;
  }

  // Group-major (connector_options::stream_groups): round g copies layer group g of every key
  // still good and reports the round, as remote_store::get_by_group does.
  std::error_code get_by_group(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                               std::span<chunk_status> st, deadline dl,
                               const std::function<void(std::span<const std::size_t>)>& on_round) {
    const get_fault_spec f = next_get();
    const std::size_t n = keys.size();
    switch (f.f) {
      case get_fault::throws:
        throw std::runtime_error("adversary: get_by_group throws");
      case get_fault::stall:
        sleep_to(dl);
        std::fill(st.begin(), st.end(), chunk_status::timeout);
        return make_error_code(errc::timeout);
      case get_fault::evict:
        if (n) inner_.erase(keys[f.key % n]);
        break;
      default:
        break;
    }
    std::vector<std::vector<std::byte>> whole(n);
    std::vector<std::span<std::byte>> spans(n);
    for (std::size_t i = 0; i < n; ++i) whole[i].resize(dst[i].size()), spans[i] = whole[i];
    std::vector<chunk_status> in(n);
    if (auto ec = inner_.get(keys, spans, in, no_deadline)) return ec;
    std::vector<std::size_t> landed(n, 0);
    std::vector<bool> dead(n, false);
    const std::size_t rounds = n ? fmt_.groups(dst[0].size()) : 0;
    const std::size_t bad = n ? f.key % n : 0;
    const std::size_t bad_round = f.f == get_fault::corrupt_group ? f.group % std::max<std::size_t>(rounds, 1)
                                  : f.f == get_fault::corrupt     ? 0
                                                                  : SIZE_MAX;
    const std::size_t stall_round =
        f.f == get_fault::stall_group ? f.group % std::max<std::size_t>(rounds, 1) : SIZE_MAX;
    // late_hits: what lands before group `group` of key `key` lands in time; it and the rest
    // land past the deadline.
    const std::size_t late_round =
        f.f == get_fault::late_hits ? f.group % std::max<std::size_t>(rounds, 1) : SIZE_MAX;
    for (std::size_t g = 0; g < rounds; ++g) {
      if (g == 0 && f.f == get_fault::slow_first)
        std::this_thread::sleep_for(std::chrono::milliseconds(f.group % 8 + 1));
      if (g == stall_round) {
        sleep_to(dl);
        for (std::size_t j = 0; j < n; ++j)
          if (!dead[j]) st[j] = chunk_status::timeout;
        return make_error_code(errc::timeout);
      }
      for (std::size_t i = 0; i < n; ++i) {
        if (g == late_round && i == bad) {
          on_round(landed);
          sleep_to(dl + late_by());
        }
        if (dead[i]) continue;
        if (in[i] != chunk_status::hit) {
          st[i] = in[i], dead[i] = true;
          continue;
        }
        const auto part = fmt_.group(dst[i], g);
        const auto from = fmt_.group(std::span<const std::byte>(whole[i]), g);
        if (g == bad_round && i == bad) {
          std::memset(part.data(), 0xEE, part.size());
          st[i] = chunk_status::corrupt, dead[i] = true;
          continue;
        }
        std::memcpy(part.data(), from.data(), part.size());
        landed[i] = g + 1;
        st[i] = landed[i] == rounds ? chunk_status::hit : chunk_status::error;
      }
      on_round(landed);
    }
    return {};
  }

  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> st, deadline dl) {
    const std::size_t call = puts_++;
    const put_fault f = call < script_.puts.size() ? script_.puts[call] : put_fault::none;
    if (f == put_fault::throws && puts_may_throw_) {
      ++failed_puts_;
      throw std::runtime_error("adversary: put throws");
    }
    if (f == put_fault::fails || f == put_fault::throws) {
      ++failed_puts_;
      std::fill(st.begin(), st.end(), chunk_status::error);
      return make_error_code(errc::backend_error);
    }
    if (f == put_fault::slow) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (const chunk_key& k : keys) note_held(k);  // before: a lookup may see it once it is in
    return inner_.put(keys, src, st, dl);
  }

 private:
  static void sleep_to(deadline dl) {
    // Never more than a second: a generous deadline would make the case slow, not wrong.
    std::this_thread::sleep_until(std::min(dl, clock::now() + std::chrono::seconds(1)));
  }
  get_fault_spec next_get() {
    const std::size_t call = gets_++;
    return call < script_.gets.size() ? script_.gets[call] : get_fault_spec{};
  }

  memory_store& inner_;
  const rank_faults script_;
  const value_format fmt_;
  const bool puts_may_throw_;
  std::atomic<std::size_t> gets_{0}, puts_{0}, exists_calls_{0};
  std::atomic<int> failed_puts_{0};
  mutable std::mutex mu_;
  std::unordered_set<chunk_key, chunk_key_hash> ever_;
};
static_assert(group_streaming_store<adv_store>);

/// One rank's communicator (`Inner`: in-process, or MPI for test_connector_model_mpi) with the
/// case's faults: at its n-th round (an all-reduce, or a group), a stall sleeps past the round's
/// deadline (at most 50 ms) before joining it; a failure makes the round invalid (an all-reduce of
/// dtype::bytes, a broadcast from no rank in the group), which fails it on every rank (in-process
/// rounds fail together). `failed`: a top-level call of this rank returned an error.
template <class Inner>
struct basic_fault_comm {
  Inner inner;
  std::vector<comm_fault> faults;  // this rank's, on this communicator
  int rounds = 0;
  int depth = 0;
  bool in_group_end = false;
  bool failed = false;

  static constexpr bool rounds_fail_together = comm::rounds_fail_together<Inner>;
  rank_t rank() const { return inner.rank(); }
  rank_t size() const { return inner.size(); }
  std::string last_error() const { return std::string(inner.last_error()); }

  std::error_code broadcast(std::span<const std::byte> s, std::span<std::byte> r, rank_t root, deadline dl) {
    if (depth == 0) {
      if (const comm_fault* f = next(dl); f && f->fail) return note(inner.broadcast(s, r, size(), dl));
    }
    return note(inner.broadcast(s, r, root, dl));
  }
  std::error_code all_gather(std::span<const std::byte> s, std::span<std::byte> r, deadline dl) {
    if (depth == 0) next(dl);
    return note(inner.all_gather(s, r, dl));
  }
  std::error_code all_reduce(std::span<const std::byte> s, std::span<std::byte> r, comm::dtype t,
                             comm::reduce_op op, deadline dl) {
    if (depth == 0) {
      if (const comm_fault* f = next(dl); f && f->fail)
        return note(inner.all_reduce(s, r, comm::dtype::bytes, op, dl));
    }
    return note(inner.all_reduce(s, r, t, op, dl));
  }
  std::error_code group_start() {
    ++depth;
    return note(inner.group_start());
  }
  std::error_code group_end(deadline dl) {
    if (depth > 0 && --depth == 0) {
      in_group_end = true;
      const comm_fault* f = next(dl);
      in_group_end = false;
      if (f && f->fail) (void)inner.broadcast({}, {}, size(), dl);
    }
    return note(inner.group_end(dl));
  }
  std::error_code local_copy(std::span<std::byte> d, std::span<const std::byte> s, deadline dl) {
    return inner.local_copy(d, s, dl);
  }

 private:
  std::error_code note(std::error_code ec) {
    failed = failed || ec;
    return ec;
  }
  const comm_fault* next(deadline dl) {
    const int round = rounds++;
    for (const comm_fault& f : faults) {
      if (f.slow_ms) {  // every group round from `round` on (the moves), all-reduces never
        if (round >= f.round && round < f.round + 6 && in_group_end)
          std::this_thread::sleep_for(std::chrono::milliseconds(f.slow_ms));
        continue;
      }
      if (f.round != round) continue;
      if (!f.fail)
        std::this_thread::sleep_until(std::min(dl, clock::now() + std::chrono::milliseconds(50)) +
                                      std::chrono::milliseconds(1));
      return &f;
    }
    return nullptr;
  }
};
using fault_comm = basic_fault_comm<comm::inproc_communicator>;

// ---- what a rank reports after each command ----------------------------------------------------

struct req_obs {
  bool known = false, finished = false;
  std::optional<load_plan> plan;
  std::optional<load_outcome> outcome;
  std::vector<std::size_t> load_errors;
  bool load_reason = false;  // errors(id) has a load-stage reason
  bool loading = false;      // load() was called on a loadable plan
  bool load_called = false;  // this command called load()
  std::error_code load_ec;   // its result on this rank
  bool load_slots_ok = true;
};

/// A layer wait's answer for one load, when the API has it (connector::layer_wait).
struct ready_obs {
  request_id id = 0;
  std::uint64_t first = 0, ready_end = 0, requested_end = 0;
  bool operator==(const ready_obs&) const = default;
};

struct rank_obs {
  std::vector<req_obs> reqs;
  std::vector<std::error_code> agreed;  // step() results (step, settle), in order
  bool layer_wait = false;
  std::error_code layer_ec;
  std::vector<ready_obs> ready;  // the layer wait's loads (new API)
  std::vector<request_id> finished_loads;
  std::uint64_t agreement_failures = 0;
  std::vector<comm::collective_call> ctrl_calls, data_calls;  // at the end
  bool ctrl_failed = false, data_failed = false;              // at the end: a call of this rank failed
  std::vector<std::string> violations;
  std::vector<std::string> notes;  // KVTIER_MODEL_TRACE=1: what this rank saw
};

inline bool trace() {
  static const bool on = [] {
    const char* e = std::getenv("KVTIER_MODEL_TRACE");
    return e && *e == '1';
  }();
  return on;
}

inline bool same_plan(const std::optional<load_plan>& a, const std::optional<load_plan>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->cached_tokens == b->cached_tokens && a->load_first_token == b->load_first_token &&
                a->load_end_token == b->load_end_token && a->prompt_tokens == b->prompt_tokens);
}
inline bool same_outcome(const std::optional<load_outcome>& a, const std::optional<load_outcome>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->load_first_token == b->load_first_token && a->loaded_end_token == b->loaded_end_token &&
                a->requested_end_token == b->requested_end_token);
}
inline std::string show(const std::optional<load_plan>& p) {
  if (!p) return "none";
  return "{cached " + std::to_string(p->cached_tokens) + ", load [" + std::to_string(p->load_first_token) +
         ", " + std::to_string(p->load_end_token) + "), prompt " + std::to_string(p->prompt_tokens) + "}";
}
inline std::string show(const std::optional<load_outcome>& o) {
  if (!o) return "none";
  return "{[" + std::to_string(o->load_first_token) + ", " + std::to_string(o->loaded_end_token) + ") of [" +
         std::to_string(o->load_first_token) + ", " + std::to_string(o->requested_end_token) + ")}";
}
template <class V>
std::string show_list(const V& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}

/// A load's range [first, end) as the engine resolves `cmd` against the agreed plan; `throws`:
/// a range the connector must refuse with std::invalid_argument (not whole chunks).
struct load_range {
  bool whole = true;
  std::uint64_t first = 0, end = 0;
  bool throws = false;
};
inline load_range resolve_load(const std::optional<load_plan>& plan, const command& k) {
  load_range r;
  if (!plan || plan->tokens_to_load() == 0) return r;
  r.first = plan->load_first_token, r.end = plan->load_end_token;
  if (k.a == 255) return r;
  r.whole = false;
  if (k.a == 254) {
    r.first += 1;
    r.throws = true;
    return r;
  }
  const std::uint64_t n = (r.end - r.first) / T;
  const std::uint64_t off = k.a % n;
  r.first += off * T;
  r.end = r.first + (1 + k.b % (n - off)) * T;
  return r;
}

// ---- the case's shared state --------------------------------------------------------------------

/// Property-wide counts (to see that the suite exercises what it claims).
struct model_stats {
  std::atomic<std::uint64_t> cases{0}, adversarial{0}, loads{0}, complete{0}, short_loads{0}, sane_loads{0},
      layer_ok{0}, layer_checked_chunks{0}, saves_stored{0}, commands{0};
  std::atomic<std::uint64_t> op_us[16] = {}, op_n[16] = {}, setup_us{0}, end_us{0}, teardown_us{0};
};
inline model_stats& stats() {
  static model_stats s;
  return s;
}

/// Whether the adversary's put throws (put_fault::throws; KVTIER_MODEL_PUT_THROWS=0: it fails the
/// put instead, for a connector where a throwing put ends the process).
inline bool& allow_put_throws() {
  static bool allowed = [] {
    const char* e = std::getenv("KVTIER_MODEL_PUT_THROWS");
    return !(e && *e == '0');
  }();
  return allowed;
}
inline bool puts_may_throw() { return allow_put_throws(); }

struct case_state {
  model_case c;
  rank_t W;
  key_namespace ns;
  chunker<> chunk;
  std::vector<prompt_ref> prompts;
  std::unordered_map<chunk_key, key_ref, chunk_key_hash> keys;  // every key of every prompt
  comm::inproc_world ctrl_world, data_world;
  std::vector<std::unique_ptr<memory_store>> inner;
  std::vector<std::unique_ptr<adv_store>> stores;

  // The command channel: main posts `cmd` and bumps `gen`; each rank runs it and counts `done`.
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t gen = 0;
  command cmd;
  bool end = false, stop = false;
  std::size_t ready = 0, done = 0, exited = 0;
  std::vector<rank_obs> obs;

  explicit case_state(model_case mc)
      : c(std::move(mc)),
        W(c.world),
        ns{.model = "model-suite",
           .kv_format = "tiny",
           .chunk_tokens = T,
           .ownership = modulo_ownership(W).geometry()},
        chunk(ns),
        ctrl_world(W),
        data_world(W),
        obs(W) {
    for (std::size_t i = 0; i < c.prompts.size(); ++i)
      prompts.push_back(make_prompt(c.prompts[i], chunk, c.layers, i));
    for (const prompt_ref& p : prompts)
      for (std::size_t k = 0; k < p.keys.size(); ++k) {
        if (keys.count(p.keys[k])) continue;
        key_ref kr{k, std::vector<std::byte>(c.layers * T * row)};
        for (std::uint32_t l = 0; l < c.layers; ++l)
          std::memcpy(kr.value.data() + l * T * row, p.layer_run(l, k * T, T).data(), T * row);
        keys.emplace(p.keys[k], std::move(kr));
      }
    const kv_layout lay = layout();
    const value_format fmt = value_format::v2(layer_group_bytes(lay, T, c.per_group));
    for (rank_t r = 0; r < W; ++r) {
      inner.push_back(std::make_unique<memory_store>(std::size_t{1} << 20));
      stores.push_back(std::make_unique<adv_store>(
          *inner.back(), r < c.faults.size() ? c.faults[r] : rank_faults{}, fmt, puts_may_throw()));
    }
    for (const warm_spec& w : c.warm) {
      if (w.prompt >= prompts.size()) continue;
      const prompt_ref& p = prompts[w.prompt];
      for (std::size_t k = 0; k < p.keys.size() && k < w.chunks; ++k) {
        if (k == w.hole) continue;
        const rank_t owner = static_cast<rank_t>(k % W);
        const std::span<const std::byte> v(keys.at(p.keys[k]).value);
        chunk_status st{};
        inner[owner]->put(std::span(&p.keys[k], 1), std::span(&v, 1), std::span(&st, 1), no_deadline);
        stores[owner]->note_held(p.keys[k]);
      }
    }
  }

  kv_layout layout() const { return kv_layout::vllm_mla(c.layers, num_blocks, block_size, 2, 4); }
  rank_t owner(std::size_t chunk_index) const { return static_cast<rank_t>(chunk_index % W); }
};

// ---- one rank ---------------------------------------------------------------------------------

/// One rank's connector and engine. `Inner`: its communicators (in-process: rank threads of one
/// case_state; MPI: one process per rank, each with its own case_state of which it uses its
/// rank's store).
template <class Inner>
class basic_rank_runner {
 public:
  using fault_comm_t = basic_fault_comm<Inner>;
  using rec_comm = comm::recording<fault_comm_t&>;
  using conn_t = connector<adv_store, rec_comm, rec_comm, modulo_ownership>;

  basic_rank_runner(case_state& s, rank_t r, Inner ctrl, Inner data)
      : s_(s),
        c_(s.c),
        r_(r),
        ctrl_fc_{std::move(ctrl), faults_for(s.c, r, false)},
        data_fc_{std::move(data), faults_for(s.c, r, true)},
        ctrl_(ctrl_fc_),
        data_(data_fc_),
        cache_(s.layout()),
        reqs_(max_requests) {
    opt_.lookup_timeout = c_.lookup_ms ? std::chrono::milliseconds(c_.lookup_ms) : generous;
    const auto load_dl = c_.load_ms ? std::chrono::milliseconds(c_.load_ms) : generous;
    opt_.load_deadline = {load_dl, std::chrono::milliseconds(0), load_dl};
    opt_.save_timeout = generous;
    opt_.layers_per_group = c_.per_group;
    opt_.fetch_batch_chunks = c_.batch;
    opt_.fetch_workers = std::max<std::size_t>(1, c_.workers);
    opt_.stream_groups = c_.streamed;
    conn_ = std::make_unique<conn_t>(s.chunk, modulo_ownership(s.W), *s.stores[r], ctrl_,
                                     c_.two_comms ? data_ : ctrl_, cache_.view(), opt_);
  }

  void run(const command& k, rank_obs& o) {
    o = {};
    if (!conn_) return;
    try {
      exec(k, o);
    } catch (const std::exception& e) {
      o.violations.push_back(std::string("invariant 5: an exception escaped: ") + e.what());
    } catch (...) {
      o.violations.push_back("invariant 5: an exception escaped");
    }
    observe(o);
  }

  /// Command k (end: the end of the case) on this rank, and what this rank reports after it;
  /// nothing escapes.
  rank_obs report(const command& k, bool end) {
    rank_obs o;
    try {
      if (end)
        this->end(o);
      else
        run(k, o);
    } catch (const std::exception& e) {
      o.violations.push_back(std::string("harness: ") + e.what());
    }
    return o;
  }

  // The end of a case: every request finished, every save ended, the stores checked.
  void end(rank_obs& o) {
    o = {};
    if (!conn_) return;
    std::vector<request_id> pending;
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      rq& q = reqs_[i];
      if (!q.known) continue;
      if (!q.finished) (void)conn_->finish(id(i));
      q.finished = true;
      pending.push_back(id(i));
    }
    // A request's saves have all ended once wait_for_save no longer knows it: finished() listed
    // it, or none was pending at finish().
    const deadline limit = deadline_after(std::chrono::seconds(30));
    while (!pending.empty() && !expired(limit)) {
      (void)conn_->finished();
      std::erase_if(pending, [&](request_id x) {
        return conn_->wait_for_save(x, deadline_after(std::chrono::milliseconds(1))) ==
               errc::invalid_argument;
      });
    }
    if (!pending.empty()) o.violations.push_back("the saves did not end within 30 s of finish()");
    // Every page is free now (no save reads it): freed, so a late write shows below.
    for (std::size_t i = 0; i < reqs_.size() && pending.empty(); ++i)
      if (reqs_[i].known && !reqs_[i].seq.blocks.empty()) release(i);
    const int failed_puts = s_.stores[r_]->failed_puts();
    const std::uint64_t save_failures = conn_->counters().save_failures.value();
    if (save_failures < static_cast<std::uint64_t>(failed_puts))
      o.violations.push_back("invariant 7: " + std::to_string(failed_puts) +
                             " puts failed, but save_failures is " + std::to_string(save_failures));
    // The connector goes (its mover runs what it was given, its fetches end), then nothing may
    // have written a page it no longer owned, nor a store a wrong value.
    conn_.reset();
    check_stores(o);
    check_pages(o);
    o.ctrl_calls = ctrl_.calls();
    if (c_.two_comms) o.data_calls = data_.calls();
    o.ctrl_failed = ctrl_fc_.failed;
    o.data_failed = c_.two_comms && data_fc_.failed;
  }

 private:
  struct rq {
    bool known = false, finished = false, computed = false, saving = false, open_by_layer = false;
    bool release_pending = false;  // finished with saves reading its pages: freed once finished() lists them
    host_kv_cache::sequence seq;
    std::vector<std::int64_t> slots;
    bool loading = false;
    std::uint64_t load_first = 0, load_end = 0;
    deadline load_dl{};
    std::optional<load_outcome> outcome;
    std::vector<std::vector<bool>> valid;               // [layer][position]: holds the reference bytes
    std::array<std::string, 3> reasons;                 // the first errors(id) message of each stage seen
    std::array<std::optional<std::uint64_t>, 4> ready;  // per layer: the agreed layer answer's ready end
  };

  static std::vector<comm_fault> faults_for(const model_case& c, rank_t r, bool data) {
    std::vector<comm_fault> out;
    for (const comm_fault& f : c.comm)
      if (f.rank % c.world == r && (c.two_comms ? f.data == data : !data)) out.push_back(f);
    return out;
  }
  static request_id id(std::size_t i) { return i + 1; }
  deadline dl_of(const command& k) const {
    const auto ms = k.ms ? std::chrono::milliseconds(k.ms)
                         : (c_.step_ms ? std::chrono::milliseconds(c_.step_ms) : generous);
    return deadline_after(ms);
  }
  bool on_me(std::uint8_t rank) const { return rank >= c_.world || rank == r_; }
  const prompt_ref* prompt(std::size_t i) const { return i < s_.prompts.size() ? &s_.prompts[i] : nullptr; }

  // Invariant 4: a blocking call returned by `bound` + margin.
  void timed(rank_obs& o, const char* what, deadline bound, clock::time_point returned) {
    if (returned > bound + margin)
      o.violations.push_back(
          std::string("invariant 4: ") + what + " returned " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(returned - bound).count()) +
          " ms past its deadline");
  }
  // With one communicator the moves run inside step(), with the loads' deadlines.
  deadline collective_bound(deadline dl) const {
    if (c_.two_comms) return dl;
    deadline b = dl;
    for (const rq& q : reqs_)
      if (q.loading && !q.outcome) b = std::max(b, q.load_dl);
    return b;
  }

  void exec(const command& k, rank_obs& o) {
    const std::size_t i = k.req % max_requests;
    rq& q = reqs_[i];
    const prompt_ref* p = prompt(i);
    switch (k.what) {
      case op::begin_lookup: {
        if (!p || q.finished) return;
        if (!q.known) {
          if (!cache_.reserve(q.seq, p->P)) throw std::logic_error("harness: cache too small");
          for (std::int32_t b : q.seq.blocks) free_fill_[static_cast<std::size_t>(b)] = -1;
          q.slots = slots_of(cache_, q.seq, p->P);
          q.valid.assign(c_.layers, std::vector<bool>(p->P, false));
        }
        const std::error_code ec = conn_->begin_lookup(id(i), p->tokens);
        if (q.known && ec != errc::invalid_argument)
          o.violations.push_back("invariant 5: begin_lookup of a known id returned '" + ec.message() + "'");
        if (!q.known && ec) o.violations.push_back("begin_lookup of a new id failed: " + ec.message());
        q.known = true;
        return;
      }
      case op::step: {
        const deadline dl = dl_of(k);
        const deadline bound = collective_bound(dl);
        o.agreed.push_back(conn_->step(dl));
        timed(o, "step", bound, clock::now());
        return;
      }
      case op::settle:
        return settle(o, k);
      case op::load:
        return do_load(k, i, o);
      case op::wait_for_layer:
        return wait_layer(k, o);
      case op::wait_local: {
        if (!q.known || q.finished) return;
        const deadline dl = dl_of(k);
        (void)conn_->wait_local(id(i), dl);
        timed(o, "wait_local", dl, clock::now());
        return;
      }
      case op::limit_load:
        if (q.known && !q.finished && k.caps[r_ % max_ranks] != 255)
          (void)conn_->limit_load(id(i), k.caps[r_ % max_ranks]);
        return;
      case op::cancel_load:
        if (q.known && !q.finished && on_me(k.rank)) (void)conn_->cancel_load(id(i));
        return;
      case op::compute:
        return do_compute(i);
      case op::save:
      case op::save_by_layer:
        return do_save(k, i, o);
      case op::wait_for_save: {
        if (!q.known) return;
        // A save by layer with layers not reported stays pending until finish(): no engine
        // waits for it, and a generous deadline would only make the case slow.
        const deadline dl =
            q.open_by_layer && !q.finished ? deadline_after(std::chrono::milliseconds(2)) : dl_of(k);
        (void)conn_->wait_for_save(id(i), dl);
        timed(o, "wait_for_save", dl, clock::now());
        return;
      }
      case op::finish: {
        if (!q.known || q.finished) return;
        const finish_result fr = conn_->finish(id(i));
        q.finished = true;
        // The engine frees the pages (a later request reuses them) once no save reads them.
        if (fr.free_pages_now)
          release(i);
        else
          q.release_pending = true;
        return;
      }
      case op::finished: {
        const finished_requests f = conn_->finished();
        o.finished_loads = f.loads;
        for (request_id x : f.saves)
          if (x >= 1 && x <= max_requests && reqs_[x - 1].release_pending) release(x - 1);
        return;
      }
      case op::drain_events: {
        for (const kv_event& e : conn_->drain_events()) {
          if (e.rank != r_)
            o.violations.push_back("drain_events: an event of rank " + std::to_string(e.rank));
          for (const chunk_key& key : e.keys) {
            const auto it = s_.keys.find(key);
            if (it == s_.keys.end())
              o.violations.push_back("drain_events: a key no prompt has");
            else if (e.what == kv_event::kind::stored && s_.owner(it->second.chunk) != r_)
              o.violations.push_back("drain_events: stored chunk " + std::to_string(it->second.chunk) +
                                     " that rank " + std::to_string(s_.owner(it->second.chunk)) + " owns");
          }
        }
        return;
      }
    }
  }

  // Request i's pages go back to the cache: the next request to reserve pages gets them, and a
  // connector that still wrote them (after finish) would overwrite that request's bytes.
  void release(std::size_t i) {
    rq& q = reqs_[i];
    for (std::int32_t b : q.seq.blocks) fill_block(static_cast<std::size_t>(b), freed_fill);
    cache_.release(q.seq);
    q.valid.clear();
    q.release_pending = false;
  }

  // Every lookup agreed and every load's outcome agreed: agreed values only, so every rank
  // steps alike.
  bool all_agreed() const {
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      const rq& q = reqs_[i];
      if (!q.known || q.finished) continue;
      if (!conn_->lookup(id(i))) return false;
      if (q.loading && !conn_->load_result(id(i))) return false;
    }
    return true;
  }

  void settle(rank_obs& o, const command& k) {
    for (int n = 0; n < 4000; ++n) {
      if (all_agreed()) return;
      for (std::size_t i = 0; i < reqs_.size(); ++i)  // this rank's own part first (bounded)
        if (reqs_[i].loading && !reqs_[i].finished && !conn_->load_result(id(i)))
          (void)conn_->wait_local(id(i), deadline_after(std::chrono::milliseconds(2)));
      const deadline dl = dl_of(k);
      const deadline bound = collective_bound(dl);
      o.agreed.push_back(conn_->step(dl));
      timed(o, "step", bound, clock::now());
      if (n > 8) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!all_agreed()) o.violations.push_back("settle: lookups or loads still not agreed after 4000 steps");
  }

  // The slots this rank passes for [lr.first, lr.end): its pages, with `kind`'s fault; `bad` is
  // the position left without a page (npos: none).
  static constexpr std::uint64_t npos = ~std::uint64_t{0};
  std::vector<std::int64_t> slots_for(slots_kind kind, std::uint8_t where, const rq& q, const load_range& lr,
                                      std::uint64_t& bad) const {
    std::vector<std::int64_t> s = q.slots;
    const std::uint64_t span = lr.end > lr.first ? lr.end - lr.first : 0;
    const std::uint64_t at = span ? lr.first + (where * 7 + 3) % span : npos;
    bad = npos;
    switch (kind) {
      case slots_kind::short_slots:
        s.resize(lr.end ? lr.end - 1 : 0);
        bad = lr.end ? lr.end - 1 : npos;
        break;
      case slots_kind::out_of_range:
        if (span) s[at] = static_cast<std::int64_t>(num_blocks * block_size + 3), bad = at;
        break;
      case slots_kind::minus_one:
        if (span) s[at] = -1, bad = at;
        break;
      default:
        break;
    }
    return s;
  }

  void do_load(const command& k, std::size_t i, rank_obs& o) {
    rq& q = reqs_[i];
    const prompt_ref* p = prompt(i);
    if (!p || !q.known || q.finished || q.computed) return;
    const std::optional<load_plan> plan = conn_->lookup(id(i));
    const load_range lr = resolve_load(plan, k);
    const bool loadable = plan && plan->tokens_to_load() > 0 && !q.loading;
    slots_kind kind = on_me(k.rank) ? k.slots : slots_kind::ok;
    const bool table = kind == slots_kind::block_table || kind == slots_kind::short_table;
    if (table && !lr.whole) kind = slots_kind::ok;  // a range load takes slots
    std::uint64_t bad = npos;
    const std::vector<std::int64_t> slots = slots_for(kind, k.b, q, lr, bad);
    std::error_code ec;
    bool threw = false;
    try {
      if (lr.whole && (kind == slots_kind::block_table || kind == slots_kind::short_table)) {
        std::vector<std::int32_t> blocks = q.seq.blocks;
        if (kind == slots_kind::short_table) {
          const std::size_t need = (lr.end + block_size - 1) / block_size;
          blocks.resize(need ? need - 1 : 0);
          if (need) bad = (need - 1) * block_size;
        }
        ec = conn_->load(id(i), std::span<const std::int32_t>(blocks));
      } else if (lr.whole) {
        ec = conn_->load(id(i), std::span<const std::int64_t>(slots));
      } else {
        ec = conn_->load(id(i), std::span<const std::int64_t>(slots), lr.first, lr.end);
      }
    } catch (const std::invalid_argument&) {
      threw = true;
      if (!(loadable && lr.throws))
        o.violations.push_back("invariant 5: load threw invalid_argument for a valid range");
    }
    const bool slots_ok = bad == npos;
    if (loadable && lr.throws && !threw)
      o.violations.push_back("invariant 5: load of a range that is not whole chunks did not throw");
    if (!loadable && !threw && ec != errc::invalid_argument)
      o.violations.push_back("load with nothing to load returned '" + ec.message() + "'");
    if (loadable && !threw && !slots_ok && ec != errc::invalid_argument)
      o.violations.push_back("invariant 5: load of [" + std::to_string(lr.first) + ", " +
                             std::to_string(lr.end) + ") with no page for position " + std::to_string(bad) +
                             " (slots_kind::" + name(kind) + ") returned '" + (ec ? ec.message() : "ok") +
                             "', not invalid_argument");
    if (loadable && !threw && slots_ok && ec)
      o.violations.push_back("load of [" + std::to_string(lr.first) + ", " + std::to_string(lr.end) +
                             ") with good slots returned '" + ec.message() + "'");
    req_obs& ro = obs_req(o, i);
    ro.load_called = true;
    ro.load_ec = threw ? make_error_code(errc::invalid_argument) : ec;
    ro.load_slots_ok = slots_ok;
    if (loadable && !threw) {
      q.loading = true;
      q.load_first = lr.first, q.load_end = lr.end;
      q.load_dl = clock::now() + opt_.load_deadline.after(lr.end - lr.first);
    }
  }

  // Layer l of chunk `c` of request i holds its reference bytes on this rank.
  bool layer_right(std::size_t i, std::uint32_t l, std::uint64_t first, std::uint64_t end) {
    if (end <= first) return true;
    const prompt_ref& p = *prompt(i);
    buf_.resize((end - first) * row);
    if (cache_.gather(reqs_[i].seq, first, end - first, buf_, {l, l + 1})) return false;
    return std::memcmp(buf_.data(), p.layer_run(l, first, end - first).data(), buf_.size()) == 0;
  }

  void wait_layer(const command& k, rank_obs& o) {
    const std::uint32_t l = k.layer % c_.layers;
    const deadline dl = dl_of(k);
    const deadline bound = collective_bound(dl);
    const layer_wait res = conn_->wait_for_layer(l, dl);
    timed(o, "wait_for_layer", bound, clock::now());
    o.layer_wait = true;
    o.layer_ec = res.ec;
    if (!res.ec && r_ == 0) stats().layer_ok++;
    // Per load: layer l of [first, ready_end) is in this rank's pages (whatever ec says) and
    // stays there; with ec empty the answer is agreed, the reach behind it final, and the engine
    // computes layer l of the rest itself (the connector never writes it).
    for (const layer_ready& lr : res.loads) {
      o.ready.push_back({lr.id, lr.first_token, lr.ready_end_token, lr.requested_end_token});
      const std::string what =
          "wait_for_layer(" + std::to_string(l) + ") of request " + std::to_string(lr.id) + ": ready [" +
          std::to_string(lr.first_token) + ", " + std::to_string(lr.ready_end_token) + ") of [" +
          std::to_string(lr.first_token) + ", " + std::to_string(lr.requested_end_token) + ")";
      if (lr.id == 0 || lr.id > max_requests || !reqs_[lr.id - 1].loading || reqs_[lr.id - 1].finished) {
        o.violations.push_back(what + ": no load of it is running");
        continue;
      }
      const std::size_t i = lr.id - 1;
      rq& q = reqs_[i];
      if (lr.first_token != q.load_first || lr.requested_end_token != q.load_end ||
          lr.ready_end_token < lr.first_token || lr.ready_end_token > lr.requested_end_token ||
          (lr.ready_end_token - lr.first_token) % T) {
        o.violations.push_back(what + " is not whole chunks of its load [" + std::to_string(q.load_first) +
                               ", " + std::to_string(q.load_end) + ")");
        continue;
      }
      stats().layer_checked_chunks += (lr.ready_end_token - lr.first_token) / T;
      if (!layer_right(i, l, lr.first_token, lr.ready_end_token)) {
        o.violations.push_back("invariant 2: " + what + ": layer " + std::to_string(l) +
                               " of that range is not in the pages");
        continue;
      }
      for (std::uint64_t t = lr.first_token; t < lr.ready_end_token; ++t) q.valid[l][t] = true;
      if (res.ec) continue;
      // Invariant 6: an agreed answer never lists more for a layer than an earlier one did.
      std::optional<std::uint64_t>& before = q.ready[l];
      if (before && lr.ready_end_token > *before)
        o.violations.push_back("invariant 6: " + what + ", an earlier agreed answer listed only up to " +
                               std::to_string(*before) + " (an agreed reach that grew again)");
      if (!before || lr.ready_end_token < *before) before = lr.ready_end_token;
      if (q.outcome && q.outcome->loaded_end_token > lr.ready_end_token)
        o.violations.push_back("invariant 2: " + what + " lists less than its outcome " + show(q.outcome));
      compute_layer(i, l, lr.ready_end_token, lr.requested_end_token);
    }
  }

  // The engine computes layer l of [first, end) of request i (past an agreed layer answer).
  void compute_layer(std::size_t i, std::uint32_t l, std::uint64_t first, std::uint64_t end) {
    rq& q = reqs_[i];
    const prompt_ref& p = *prompt(i);
    for (std::uint64_t t = first; t < end;) {
      if (q.valid[l][t]) {
        ++t;
        continue;
      }
      std::uint64_t e = t;
      while (e < end && !q.valid[l][e]) ++e;
      if (cache_.scatter(q.seq, t, e - t, p.layer_run(l, t, e - t), {l, l + 1}))
        throw std::logic_error("harness: compute scatter failed");
      for (std::uint64_t x = t; x < e; ++x) q.valid[l][x] = true;
      t = e;
    }
  }

  // The engine computes what it has not loaded: every position not known to hold its bytes.
  void do_compute(std::size_t i) {
    rq& q = reqs_[i];
    const prompt_ref* p = prompt(i);
    if (!p || !q.known || q.finished || q.computed) return;
    if (q.loading && !q.outcome) return;  // its load still writes the pages
    for (std::uint32_t l = 0; l < c_.layers; ++l) compute_layer(i, l, 0, p->P);
    q.computed = true;
  }

  void do_save(const command& k, std::size_t i, rank_obs& o) {
    rq& q = reqs_[i];
    const prompt_ref* p = prompt(i);
    if (!p || !q.known || q.finished || !q.computed) return;  // an engine saves what it computed
    std::uint64_t first = 0, end = p->P;
    if (k.a != 255) {
      first = std::min<std::uint64_t>(k.a % (p->keys.size() + 1) * T, p->P);
      end = std::min<std::uint64_t>(first + (k.b + 1) * T, p->P);
    }
    const slots_kind kind = on_me(k.rank) ? k.slots : slots_kind::ok;
    std::uint64_t bad = npos;
    const std::vector<std::int64_t> slots = slots_for(kind, k.b, q, load_range{true, first, end, false}, bad);
    // Refused, nothing queued, when a position of a full chunk it covers has no page.
    const std::uint64_t covered_end = std::min<std::uint64_t>(end / T, p->keys.size()) * T;
    const std::uint64_t covered_first = std::min(covered_end, (first + T - 1) / T * T);
    const bool refused = kind == slots_kind::short_slots || (bad >= covered_first && bad < covered_end);
    const bool open = q.open_by_layer;  // begin_save while a save by layer is reported: refused
    std::error_code ec;
    if (k.what == op::save) {
      ec = conn_->save(id(i), slots, first, end);
    } else {
      ec = conn_->begin_save(id(i), slots, first, end);
      if (!ec && k.layer < c_.layers) q.open_by_layer = true;
      if (!ec)
        for (std::uint32_t l = 0; l < c_.layers && l < k.layer; ++l)
          if (auto e = conn_->save_layer(id(i), l))
            o.violations.push_back("save_layer(" + std::to_string(l) + ") failed: " + e.message());
    }
    const std::string what = std::string(k.what == op::save ? "save" : "begin_save") + " of [" +
                             std::to_string(first) + ", " + std::to_string(end) + ")";
    if (refused && ec != errc::invalid_argument)
      o.violations.push_back("invariant 5: " + what + " with no page for position " + std::to_string(bad) +
                             " (slots_kind::" + name(kind) + ") returned '" + (ec ? ec.message() : "ok") +
                             "', not invalid_argument");
    if (!refused && !(k.what == op::save_by_layer && open) && ec)
      o.violations.push_back(what + " with good slots returned '" + ec.message() + "'");
    if (!ec) q.saving = true;
  }

  req_obs& obs_req(rank_obs& o, std::size_t i) {
    if (o.reqs.size() < max_requests) o.reqs.resize(max_requests);
    return o.reqs[i];
  }

  // After every command: the agreed values, and invariants 2 and 3 on this rank.
  void observe(rank_obs& o) {
    if (o.reqs.size() < max_requests) o.reqs.resize(max_requests);
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      rq& q = reqs_[i];
      req_obs& ro = o.reqs[i];
      ro.known = q.known, ro.finished = q.finished, ro.loading = q.loading;
      if (!q.known || q.finished) continue;
      ro.plan = conn_->lookup(id(i));
      ro.outcome = conn_->load_result(id(i));
      ro.load_errors = conn_->load_errors(id(i));
      for (const request_error& e : conn_->errors(id(i))) {
        ro.load_reason = ro.load_reason || e.what == request_error::stage::load;
        // Invariant 6 for this rank's own reasons: the first of each stage stays the first.
        std::string& first = q.reasons[static_cast<int>(e.what)];
        if (first.empty())
          first = e.message;
        else if (first != e.message)
          o.violations.push_back("invariant 6: request " + std::to_string(id(i)) + "'s " +
                                 std::string(to_string(e.what)) + " reason was '" + first + "', now '" +
                                 e.message + "' (the first of a stage must stay)");
      }
      if (ro.outcome && !q.outcome) first_outcome(i, *ro.outcome, o);
    }
    check_pages(o);
    check_stores(o);
    o.agreement_failures = conn_->counters().agreement_failures.value();
  }

  // An outcome, the first time this rank reports it: its pages hold [first, loaded_end).
  void first_outcome(std::size_t i, const load_outcome& out, rank_obs& o) {
    rq& q = reqs_[i];
    q.outcome = out;
    if (!q.loading) {
      o.violations.push_back("request " + std::to_string(id(i)) + " has an outcome but no load was started");
      return;
    }
    if (out.load_first_token != q.load_first || out.requested_end_token != q.load_end ||
        out.loaded_end_token < out.load_first_token || out.loaded_end_token > out.requested_end_token ||
        out.loaded_end_token % T) {
      o.violations.push_back("request " + std::to_string(id(i)) + ": outcome " + show(std::optional(out)) +
                             " does not fit its load [" + std::to_string(q.load_first) + ", " +
                             std::to_string(q.load_end) + ")");
      return;
    }
    for (std::uint32_t l = 0; l < c_.layers; ++l) {
      for (std::uint64_t t = out.load_first_token; t < out.loaded_end_token; t += T) {
        if (!layer_right(i, l, t, t + T)) {
          o.violations.push_back("invariant 2: request " + std::to_string(id(i)) + "'s outcome " +
                                 show(std::optional(out)) + " says chunk " + std::to_string(t / T) +
                                 " is in the pages; layer " + std::to_string(l) + " of it is not");
          return;
        }
      }
      for (std::uint64_t t = out.load_first_token; t < out.loaded_end_token; ++t) q.valid[l][t] = true;
    }
    for (std::uint32_t l = 0; l < c_.layers; ++l)  // an agreed layer answer bounds the outcome
      if (q.ready[l] && out.loaded_end_token > *q.ready[l])
        o.violations.push_back("invariant 2: request " + std::to_string(id(i)) + "'s outcome " +
                               show(std::optional(out)) + " counts loaded tokens past " +
                               std::to_string(*q.ready[l]) + ", where an agreed wait_for_layer(" +
                               std::to_string(l) + ") said layer " + std::to_string(l) +
                               " ended (an agreed reach that grew again)");
  }

  // A free block (never reserved: zeros; freed: freed_fill) is written by no one; each check
  // reads it straight from the cache's memory (one plane per layer in this layout).
  static constexpr int freed_fill = 0xA5;
  std::span<std::byte> block_bytes(std::size_t b, std::uint32_t l) const {
    const kv_layout& lay = cache_.layout();
    return {cache_.view().plane(l, 0) + b * lay.block_stride, std::size_t{lay.block_size} * lay.token_stride};
  }
  void fill_block(std::size_t b, int fill) {
    for (std::uint32_t l = 0; l < c_.layers; ++l)
      std::memset(block_bytes(b, l).data(), fill, block_bytes(b, l).size());
    free_fill_[b] = fill;
  }
  void check_free_blocks(rank_obs& o) const {
    for (std::size_t b = 0; b < free_fill_.size(); ++b) {
      if (free_fill_[b] < 0) continue;
      for (std::uint32_t l = 0; l < c_.layers; ++l) {
        const std::span<std::byte> v = block_bytes(b, l);
        const auto wrong =
            std::count_if(v.begin(), v.end(), [&](std::byte x) { return x != std::byte(free_fill_[b]); });
        if (wrong) {
          o.violations.push_back("invariant 2: layer " + std::to_string(l) + " of page block " +
                                 std::to_string(b) +
                                 (free_fill_[b] ? ", freed by a finished request," : ", never reserved,") +
                                 " was written (" + std::to_string(wrong) + " bytes)");
          return;
        }
      }
    }
  }

  // Invariant 2, later: every page that held its bytes still does.
  void check_pages(rank_obs& o) {
    check_free_blocks(o);
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      const rq& q = reqs_[i];
      if (!q.known || q.valid.empty()) continue;
      for (std::uint32_t l = 0; l < c_.layers; ++l) {
        const std::vector<bool>& v = q.valid[l];
        for (std::uint64_t t = 0; t < v.size();) {
          if (!v[t]) {
            ++t;
            continue;
          }
          std::uint64_t e = t;
          while (e < v.size() && v[e]) ++e;
          if (!layer_right(i, l, t, e)) {
            o.violations.push_back("invariant 2: layer " + std::to_string(l) + " of [" + std::to_string(t) +
                                   ", " + std::to_string(e) + ") of request " + std::to_string(id(i)) +
                                   " held its bytes and was overwritten since");
            return;
          }
          t = e;
        }
      }
    }
  }

  // Invariant 3: every known key in this rank's store holds its reference bytes, or is absent.
  void check_stores(rank_obs& o) {
    memory_store& m = s_.stores[r_]->inner();
    for (const auto& [key, ref] : s_.keys) {
      buf_.resize(ref.value.size());
      std::span<std::byte> d(buf_);
      chunk_status st{};
      m.get(std::span(&key, 1), std::span(&d, 1), std::span(&st, 1), no_deadline);
      if (st == chunk_status::miss) continue;
      if (st != chunk_status::hit || std::memcmp(buf_.data(), ref.value.data(), buf_.size()) != 0) {
        std::size_t wrong = 0;
        for (std::size_t b = 0; b < buf_.size(); ++b) wrong += buf_[b] != ref.value[b];
        o.violations.push_back("invariant 3: rank " + std::to_string(r_) + "'s store holds chunk " +
                               std::to_string(ref.chunk) + " with " + std::to_string(wrong) + " of " +
                               std::to_string(buf_.size()) + " bytes not the model's");
        return;
      }
    }
  }

  case_state& s_;
  const model_case& c_;
  rank_t r_;
  fault_comm_t ctrl_fc_, data_fc_;
  rec_comm ctrl_, data_;
  host_kv_cache cache_;
  connector_options opt_;
  std::vector<rq> reqs_;
  std::vector<std::byte> buf_;
  std::vector<int> free_fill_ = std::vector<int>(num_blocks, 0);  // per block: its fill while free, -1 in use
  std::unique_ptr<conn_t> conn_;                                  // last: it goes first
};

using rank_runner = basic_rank_runner<comm::inproc_communicator>;

// ---- the driver -------------------------------------------------------------------------------

namespace detail {

inline void rank_thread(std::shared_ptr<case_state> s, rank_t r) {
  std::unique_ptr<rank_runner> runner;
  std::string setup_error;
  try {
    runner = std::make_unique<rank_runner>(*s, r, s->ctrl_world.communicator_for(r),
                                           s->data_world.communicator_for(r));
  } catch (const std::exception& e) {
    setup_error = e.what();
  }
  std::uint64_t seen = 0;
  {
    std::lock_guard lock(s->mu);
    ++s->ready;
    if (!runner) s->obs[r].violations.push_back("rank setup failed: " + setup_error);
  }
  s->cv.notify_all();
  for (;;) {
    command k;
    bool end = false;
    {
      std::unique_lock lock(s->mu);
      s->cv.wait(lock, [&] { return s->stop || s->gen != seen; });
      if (s->stop) break;
      seen = s->gen;
      k = s->cmd;
      end = s->end;
    }
    rank_obs o;
    if (runner) o = runner->report(k, end);
    {
      std::lock_guard lock(s->mu);
      s->obs[r] = std::move(o);
      ++s->done;
    }
    s->cv.notify_all();
  }
  runner.reset();  // the connector's threads end here (bounded by the loads' deadlines)
  {
    std::lock_guard lock(s->mu);
    ++s->exited;
  }
  s->cv.notify_all();
}

/// What main keeps per request: the first agreed values it saw (invariant 6), and what the
/// sanity checks need.
struct main_req {
  std::optional<load_plan> plan;
  std::optional<load_outcome> outcome;
  std::vector<std::size_t> errors;
  bool cut = false;                    // limit_load or cancel_load was called
  bool load_seen = false;              // a load was started
  bool all_stored = false;             // its range was in the owners' stores when it started
  bool slots_ok = true;                // every rank's load() took its slots
  std::uint64_t failures_at_load = 0;  // agreement failures when it started (rank 0)
  std::uint64_t failures_at_lookup = 0;
  std::optional<std::size_t> lb;  // chunks stored at begin_lookup (no adversary)
};

/// What every rank has in its store, as main sees it: held(owner, key, ever) says whether rank
/// `owner`'s store holds `key` now (ever: or ever held it).
using held_fn = std::function<bool(rank_t, const chunk_key&, bool)>;

/// Chunks [0, n) of prompt i that their owners hold now (ever: ever held), the longest such prefix.
inline std::size_t stored_prefix_of(const case_state& s, const held_fn& held, std::size_t i, bool ever) {
  const prompt_ref& p = s.prompts[i];
  std::size_t n = 0;
  while (n < p.keys.size() && held(s.owner(n), p.keys[n], ever)) ++n;
  return n;
}

/// Command n of a case (n == the number of commands: the end), as a violation names it.
inline std::string where_of(std::size_t n, bool end, const command& k) {
  std::ostringstream where;
  if (end)
    where << "at the end of the case (every request finished, every save ended)";
  else
    where << "command " << n << " (" << k << ")";
  return where.str();
}

/// KVTIER_MODEL_TRACE=1: what every rank reported after a command.
inline void print_trace(const std::string& where, const std::vector<rank_obs>& obs) {
  std::ostringstream t;
  t << where << ":";
  for (std::size_t r = 0; r < obs.size(); ++r) {
    const rank_obs& o = obs[r];
    t << "\n  rank " << r << ": steps " << o.agreed.size();
    if (o.layer_wait) t << ", layer wait '" << (o.layer_ec ? o.layer_ec.message() : "ok") << "'";
    for (std::size_t i = 0; i < o.reqs.size(); ++i)
      if (o.reqs[i].known && !o.reqs[i].finished)
        t << ", request " << i + 1 << " plan " << show(o.reqs[i].plan) << " outcome "
          << show(o.reqs[i].outcome);
    for (const std::string& n : o.notes) t << "\n    " << n;
  }
  std::cerr << t.str() << "\n";
}

/// Main's checks across ranks (invariants 1, 6, 7 and the sanity checks) over every rank's
/// report of a command, and its bookkeeping between commands; the same whether the ranks are
/// threads (driver) or processes (test_connector_model_mpi, where every process checks the
/// gathered reports alike). `rounds_fail_together`: false for MPI (see check()).
class checker {
 public:
  checker(const case_state& s, held_fn held, bool rounds_fail_together = true)
      : s_(s), held_(std::move(held)), rounds_fail_together_(rounds_fail_together), reqs_(max_requests) {}

  // Main's bookkeeping before a command runs (no rank runs meanwhile).
  void before(const command& k, bool end, bool generous) {
    if (end) return;
    const std::size_t i = k.req % max_requests;
    main_req& m = reqs_[i];
    if (k.what == op::limit_load || k.what == op::cancel_load) m.cut = true;
    if (k.what == op::begin_lookup && generous && !known_[i] && i < s_.prompts.size()) {
      m.lb = stored_prefix(i, false);
      m.failures_at_lookup = failures_;
    }
    if (k.what == op::load && !m.load_seen && i < s_.prompts.size()) {
      const load_range lr = resolve_load(m.plan, k);
      m.all_stored = true;
      for (std::uint64_t t = lr.first; t < lr.end; t += T)
        m.all_stored = m.all_stored && held_(s_.owner(t / T), s_.prompts[i].keys[t / T], false);
      m.failures_at_load = failures_;
    }
  }

  /// Empty, or the first violation in the ranks' reports `obs` of command k.
  std::string check(const command& k, bool end, bool generous, const std::vector<rank_obs>& obs) {
    const rank_t W = s_.W;
    obs_ = &obs;
    for (rank_t r = 0; r < W; ++r)
      if (!obs[r].violations.empty()) return "rank " + std::to_string(r) + ": " + obs[r].violations.front();
    // Invariant 1: what every rank agreed is the same.
    const rank_obs& a = obs[0];
    for (rank_t r = 1; r < W; ++r) {
      const rank_obs& b = obs[r];
      if (a.agreed != b.agreed)
        return "invariant 1: rank 0's steps returned " + show_ecs(a.agreed) + ", rank " + std::to_string(r) +
               "'s " + show_ecs(b.agreed);
      if (a.finished_loads != b.finished_loads)
        return "invariant 1: finished().loads differ: rank 0 " + show_list(a.finished_loads) + ", rank " +
               std::to_string(r) + " " + show_list(b.finished_loads);
      for (std::size_t i = 0; i < max_requests && i < a.reqs.size() && i < b.reqs.size(); ++i) {
        const req_obs &x = a.reqs[i], &y = b.reqs[i];
        if (!x.known || x.finished) continue;
        const std::string who = "request " + std::to_string(i + 1) + ": rank 0 ";
        if (!same_plan(x.plan, y.plan))
          return "invariant 1: " + who + "plans " + show(x.plan) + ", rank " + std::to_string(r) + " " +
                 show(y.plan);
        if (!same_outcome(x.outcome, y.outcome))
          return "invariant 1: " + who + "load_result " + show(x.outcome) + ", rank " + std::to_string(r) +
                 " " + show(y.outcome);
        if (x.load_errors != y.load_errors)
          return "invariant 1: " + who + "load_errors " + show_list(x.load_errors) + ", rank " +
                 std::to_string(r) + " " + show_list(y.load_errors);
      }
      if (a.layer_wait && !a.layer_ec && !b.layer_ec)
        for (const ready_obs& x : a.ready)
          for (const ready_obs& y : b.ready)
            if (x.id == y.id && !(x == y))
              return "invariant 1: wait_for_layer agreed (ok on every rank) but request " +
                     std::to_string(x.id) + " is ready to " + std::to_string(x.ready_end) +
                     " on rank 0 and to " + std::to_string(y.ready_end) + " on rank " + std::to_string(r);
      if (end) {
        if (a.ctrl_calls != b.ctrl_calls)
          return "invariant 1: the recorded control collectives differ: rank 0 made " +
                 std::to_string(a.ctrl_calls.size()) + " calls, rank " + std::to_string(r) + " " +
                 std::to_string(b.ctrl_calls.size()) + first_diff(a.ctrl_calls, b.ctrl_calls);
        // MPI: a move that timed out on one rank may have completed on another, which then went
        // on to the batch's next group (the failure is agreed at the next step): after a failed
        // data call the ranks' data records may differ.
        const bool data_may_differ =
            !rounds_fail_together_ &&
            std::any_of(obs.begin(), obs.end(), [](const rank_obs& o) { return o.data_failed; });
        if (!data_may_differ && a.data_calls != b.data_calls)
          return "invariant 1: the recorded data collectives differ: rank 0 made " +
                 std::to_string(a.data_calls.size()) + " calls, rank " + std::to_string(r) + " " +
                 std::to_string(b.data_calls.size()) + first_diff(a.data_calls, b.data_calls);
      }
    }
    if (end) return {};
    failures_ = std::max(failures_, a.agreement_failures);
    for (std::size_t i = 0; i < max_requests && i < a.reqs.size(); ++i) {
      const req_obs& x = a.reqs[i];
      main_req& m = reqs_[i];
      known_[i] = x.known;
      if (!x.known || x.finished) continue;
      // Invariant 6: once reported, never changed.
      if (m.plan && !same_plan(m.plan, x.plan))
        return "invariant 6: request " + std::to_string(i + 1) + "'s plan was " + show(m.plan) + ", now " +
               show(x.plan);
      if (!m.plan && x.plan) {
        m.plan = x.plan;
        if (std::string v = check_plan(i, *x.plan, generous); !v.empty()) return v;
      }
      if (m.outcome && (!same_outcome(m.outcome, x.outcome) || m.errors != x.load_errors))
        return "invariant 6: request " + std::to_string(i + 1) + "'s outcome was " + show(m.outcome) +
               ", now " + show(x.outcome);
      if (x.loading && !m.load_seen) {  // this command started the load
        m.load_seen = true;
        m.slots_ok = true;
        for (rank_t r = 0; r < W; ++r) {
          const req_obs& y = obs[r].reqs[i];
          m.slots_ok = m.slots_ok && y.load_called && !y.load_ec && y.load_slots_ok;
        }
      }
      if (!m.outcome && x.outcome) {
        m.outcome = x.outcome;
        m.errors = x.load_errors;
        if (std::string v = check_outcome(i, *x.outcome, generous); !v.empty()) return v;
      }
    }
    return {};
  }

 private:
  std::string check_plan(std::size_t i, const load_plan& p, bool generous) {
    const std::size_t ub = stored_prefix(i, true);
    if (p.cached_tokens > ub * T)
      return "request " + std::to_string(i + 1) + ": plan " + show(std::optional(p)) + " counts " +
             std::to_string(p.cached_tokens / T) + " chunks cached; their owners only ever held the first " +
             std::to_string(ub);
    if (p.load_first_token != 0 || p.load_end_token != p.cached_tokens / T * T)
      return "request " + std::to_string(i + 1) + ": plan " + show(std::optional(p)) +
             " does not load its cached prefix (policy always)";
    const std::optional<std::size_t> lb = reqs_[i].lb;
    if (generous && lb && p.cached_tokens < *lb * T && failures_ == reqs_[i].failures_at_lookup)
      return "sanity: request " + std::to_string(i + 1) + ": plan " + show(std::optional(p)) + " counts " +
             std::to_string(p.cached_tokens / T) + " chunks cached; " + std::to_string(*lb) +
             " were stored at begin_lookup (no adversary, generous deadlines, no failed agreement)";
    return {};
  }

  std::string check_outcome(std::size_t i, const load_outcome& out, bool generous) {
    const main_req& m = reqs_[i];
    stats().loads++;
    (out.complete() ? stats().complete : stats().short_loads)++;
    const bool reason =
        std::any_of(obs_->begin(), obs_->end(), [&](const rank_obs& o) { return o.reqs[i].load_reason; });
    if (!out.complete() && !m.cut && !reason)
      return "invariant 7: request " + std::to_string(i + 1) + "'s load was agreed short " +
             show(std::optional(out)) +
             " with no limit_load or cancel_load, and no rank has a load reason in errors(id)";
    if (generous && m.all_stored && m.slots_ok && !m.cut && failures_ == m.failures_at_load) {
      stats().sane_loads++;
      if (!out.complete())
        return "sanity: request " + std::to_string(i + 1) + "'s load of a fully stored range ended " +
               show(std::optional(out)) +
               " (no adversary, generous deadlines, good slots, no failed agreement)";
    }
    return {};
  }

  static std::string show_ecs(const std::vector<std::error_code>& v) {
    std::string s = "{";
    for (std::size_t i = 0; i < v.size(); ++i)
      s += (i ? ", " : "") + (v[i] ? v[i].message() : std::string("ok"));
    return s + "}";
  }
  static std::string first_diff(const std::vector<comm::collective_call>& a,
                                const std::vector<comm::collective_call>& b) {
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
      if (!(a[i] == b[i]))
        return "; first difference at call " + std::to_string(i) + ": " + comm::to_string(a[i]) + " vs " +
               comm::to_string(b[i]);
    return "";
  }

  std::size_t stored_prefix(std::size_t i, bool ever) const { return stored_prefix_of(s_, held_, i, ever); }

  const case_state& s_;
  held_fn held_;
  bool rounds_fail_together_;
  const std::vector<rank_obs>* obs_ = nullptr;
  std::vector<main_req> reqs_;
  std::array<bool, max_requests> known_{};
  std::uint64_t failures_ = 0;
};

class driver {
 public:
  explicit driver(const model_case& c)
      : s_(std::make_shared<case_state>(c)),
        check_(*s_, [s = s_.get()](rank_t r, const chunk_key& k, bool ever) {
          return ever ? s->stores[r]->ever_held(k) : s->inner[r]->contains(k);
        }) {
    for (rank_t r = 0; r < s_->W; ++r) threads_.emplace_back(rank_thread, s_, r);
  }
  driver(const driver&) = delete;
  driver& operator=(const driver&) = delete;
  ~driver() {
    const auto t0 = clock::now();
    shut_down();
    stats().teardown_us += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count());
  }

  /// Runs the case: empty, or the first violation, naming the command.
  std::string run() {
    const auto t0 = clock::now();
    {
      std::unique_lock lock(s_->mu);
      if (!s_->cv.wait_for(lock, command_limit, [&] { return s_->ready == s_->W; })) return hang("setup");
      for (const rank_obs& o : s_->obs)
        if (!o.violations.empty()) return o.violations.front();
    }
    stats().setup_us += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count());
    const model_case& c = s_->c;
    const bool generous = c.generous();  // the sanity checks hold only then
    stats().cases++;
    if (c.adversarial()) stats().adversarial++;
    for (std::size_t n = 0; n <= c.commands.size(); ++n) {
      const bool end = n == c.commands.size();
      const command k = end ? command{} : c.commands[n];
      const std::string where = where_of(n, end, k);
      check_.before(k, end, generous);
      const auto t0 = clock::now();
      {
        std::unique_lock lock(s_->mu);
        s_->cmd = k;
        s_->end = end;
        s_->done = 0;
        ++s_->gen;
        s_->cv.notify_all();
        if (!s_->cv.wait_for(lock, command_limit, [&] { return s_->done == s_->W; })) return hang(where);
      }
      stats().commands++;
      if (trace()) print_trace(where, s_->obs);
      const auto us = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count());
      if (end) {
        stats().end_us += us;
      } else {
        stats().op_us[static_cast<int>(k.what)] += us;
        stats().op_n[static_cast<int>(k.what)]++;
      }
      if (std::string v = check_.check(k, end, generous, s_->obs); !v.empty()) return where + ": " + v;
    }
    return {};
  }

 private:
  std::string hang(const std::string& where) {
    hung_ = true;
    return "a rank did not finish " + where + " within " + std::to_string(command_limit.count()) +
           " s (a blocking call that never returned)";
  }

  void shut_down() {
    if (threads_.empty()) return;
    bool exited = false;
    if (!hung_) {
      std::unique_lock lock(s_->mu);
      s_->stop = true;
      s_->cv.notify_all();
      exited = s_->cv.wait_for(lock, command_limit, [&] { return s_->exited == s_->W; });
    }
    for (std::thread& t : threads_) {
      if (exited)
        t.join();
      else
        t.detach();  // a hung rank keeps the case's state (shared) alive
    }
    threads_.clear();
  }

  std::shared_ptr<case_state> s_;
  checker check_;
  std::vector<std::thread> threads_;
  bool hung_ = false;
};

}  // namespace detail

/// Runs one case on W rank threads: empty when every invariant held, else the first violation.
inline std::string run_case(const model_case& c) {
  detail::driver d(c);
  return d.run();
}

/// The cases one step simpler than `c`, most reductive first (the property's shrinks, and
/// minimize()'s): fewer commands, fewer ranks, simpler modes, fewer faults and warm entries,
/// shorter prompts, plainer commands.
inline std::vector<model_case> smaller(const model_case& c) {
  std::vector<model_case> out;
  const auto with = [&](auto edit) {
    model_case x = c;
    edit(x);
    out.push_back(std::move(x));
  };
  const std::size_t n = c.commands.size();
  if (n >= 4) {
    with([&](model_case& x) { x.commands.resize(n / 2); });
    with([&](model_case& x) {
      x.commands.erase(x.commands.begin(), x.commands.begin() + static_cast<std::ptrdiff_t>(n / 2));
    });
  }
  for (std::size_t i = n; i-- > 0;)
    with([&](model_case& x) { x.commands.erase(x.commands.begin() + static_cast<std::ptrdiff_t>(i)); });
  if (c.world > 1) with([](model_case& x) { --x.world; });
  if (c.faults.size() > c.world) with([](model_case& x) { x.faults.resize(x.world); });
  if (c.two_comms) with([](model_case& x) { x.two_comms = false; });
  if (c.streamed) with([](model_case& x) { x.streamed = false; });
  if (c.workers != 1) with([](model_case& x) { x.workers = 1; });
  if (c.batch != 1) with([](model_case& x) { x.batch = 1; });
  if (c.layers > 2) with([](model_case& x) { --x.layers; });
  if (c.per_group != 1) with([](model_case& x) { x.per_group = 1; });
  for (std::size_t i = c.comm.size(); i-- > 0;)
    with([&](model_case& x) { x.comm.erase(x.comm.begin() + static_cast<std::ptrdiff_t>(i)); });
  if (c.comm.empty() && c.step_ms) with([](model_case& x) { x.step_ms = 0; });
  for (std::size_t r = 0; r < c.faults.size(); ++r) {
    for (std::size_t i = c.faults[r].gets.size(); i-- > 0;) {
      with([&](model_case& x) {
        x.faults[r].gets.erase(x.faults[r].gets.begin() + static_cast<std::ptrdiff_t>(i));
      });
      if (c.faults[r].gets[i].f != get_fault::none) with([&](model_case& x) { x.faults[r].gets[i] = {}; });
    }
    for (std::size_t i = c.faults[r].puts.size(); i-- > 0;)
      with([&](model_case& x) {
        x.faults[r].puts.erase(x.faults[r].puts.begin() + static_cast<std::ptrdiff_t>(i));
      });
    for (std::size_t i = c.faults[r].exists.size(); i-- > 0;)
      with([&](model_case& x) {
        x.faults[r].exists.erase(x.faults[r].exists.begin() + static_cast<std::ptrdiff_t>(i));
      });
  }
  if (!c.faults.empty() && !c.adversarial()) with([](model_case& x) { x.faults.clear(); });
  if (!c.adversarial() && (c.load_ms || c.lookup_ms))
    with([](model_case& x) { x.load_ms = x.lookup_ms = 0; });
  for (std::size_t i = c.warm.size(); i-- > 0;) {
    with([&](model_case& x) { x.warm.erase(x.warm.begin() + static_cast<std::ptrdiff_t>(i)); });
    if (c.warm[i].hole != 255) with([&](model_case& x) { x.warm[i].hole = 255; });
    if (c.warm[i].chunks > 1) with([&](model_case& x) { --x.warm[i].chunks; });
  }
  std::size_t used = 0;  // prompts a command refers to
  for (const command& k : c.commands) used = std::max<std::size_t>(used, k.req % max_requests + 1);
  if (c.prompts.size() > std::max<std::size_t>(used, 1))
    with([&](model_case& x) { x.prompts.resize(std::max<std::size_t>(used, 1)); });
  for (std::size_t i = 0; i < c.prompts.size(); ++i) {
    if (c.prompts[i].chunks > 1) with([&](model_case& x) { --x.prompts[i].chunks; });
    if (c.prompts[i].tail) with([&](model_case& x) { x.prompts[i].tail = 0; });
    if (c.prompts[i].diverge != 255)
      with([&](model_case& x) { x.prompts[i].diverge = 255, x.prompts[i].variant = 0; });
    if (c.prompts[i].family) with([&](model_case& x) { x.prompts[i].family = 0; });
  }
  for (std::size_t i = 0; i < n; ++i) {
    const command& k = c.commands[i];
    if (k.ms) with([&](model_case& x) { x.commands[i].ms = 0; });
    if (k.slots != slots_kind::ok)
      with([&](model_case& x) { x.commands[i].slots = slots_kind::ok, x.commands[i].rank = 255; });
    if (k.rank != 255 && k.what != op::cancel_load) with([&](model_case& x) { x.commands[i].rank = 255; });
    if (k.a != 255 && k.what != op::wait_for_layer)
      with([&](model_case& x) { x.commands[i].a = 255, x.commands[i].b = 0; });
    if (k.b && k.a == 255) with([&](model_case& x) { x.commands[i].b = 0; });
    if (k.what == op::save_by_layer && k.layer != 255)
      with([&](model_case& x) { x.commands[i].layer = 255; });
    if (k.req) with([&](model_case& x) { x.commands[i].req = 0; });
  }
  return out;
}

/// Greedy minimization: the simplest case reachable by smaller() steps for which `fails` holds.
template <class Fails>
model_case minimize(model_case c, Fails fails) {
  for (bool progress = true; progress;) {
    progress = false;
    for (model_case& x : smaller(c))
      if (fails(x)) {
        c = std::move(x);
        progress = true;
        break;
      }
  }
  return c;
}

}  // namespace kvtier::test::model
