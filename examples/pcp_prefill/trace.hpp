// examples/pcp_prefill/trace.hpp: the JSONL request trace, its reader and
// writer, and the generator of the hit-heavy and cold streams.
//
// One request per line, either explicit tokens or seeded segments:
//
//   {"id": "r0", "t": 0.0, "tokens": [12, 99, 7]}
//   {"id": "r1", "t": 0.8, "segments": [{"seed": 1, "len": 1000}, {"seed": 77, "len": 15000}]}
//
// Token i of a segment with seed S is splitmix64((S << 32) | i) % 151552, so a
// segment shared by two requests is a shared prefix, and a trace of 7M tokens
// fits in a few kilobytes.
//
//   std::vector<pcp::request> reqs;
//   std::string err;
//   if (!pcp::read_trace_file("trace.jsonl", reqs, err)) { std::cerr << err << "\n"; }
//   auto gen = pcp::generate_trace({.kind = pcp::trace_kind::hit_heavy});
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <istream>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "json_line.hpp"

namespace pcp {

/// Vocabulary size the segment rule reduces into (GLM's 151,552).
inline constexpr std::uint64_t vocab_size = 151552;
/// Longest prompt a trace line may describe; a guard against typos, not a model limit.
inline constexpr std::uint64_t max_prompt_tokens = 4'000'000;

/// splitmix64 as usually defined: add the golden gamma, then two xor-shift-multiply rounds.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Token i of the segment with seed `seed` (seed and i below 2^32).
constexpr std::uint32_t segment_token(std::uint64_t seed, std::uint64_t i) noexcept {
  return static_cast<std::uint32_t>(splitmix64((seed << 32) | i) % vocab_size);
}

struct segment {
  std::uint64_t seed = 0;
  std::uint64_t len = 0;
  friend bool operator==(const segment&, const segment&) = default;
};

struct request {
  std::string id;
  double t = 0;                       ///< arrival offset, seconds from the trace start
  std::vector<std::uint32_t> tokens;  ///< the prompt (always filled after reading)
  std::vector<segment> segments;      ///< how it was described, if by segments
};

/// Appends the tokens of `segs` to `out`.
inline void expand_segments(const std::vector<segment>& segs, std::vector<std::uint32_t>& out) {
  for (const segment& s : segs)
    for (std::uint64_t i = 0; i < s.len; ++i) out.push_back(segment_token(s.seed, i));
}

namespace detail {

inline std::string field_error(const std::string& where, std::string_view field, const std::string& what) {
  return where + ": field \"" + std::string(field) + "\": " + what;
}

}  // namespace detail

/// Parses one trace line into `out`. `where` prefixes messages ("trace.jsonl:12").
/// Unknown members are ignored, so traces can carry extra annotations.
inline bool parse_trace_line(std::string_view line, const std::string& where, request& out,
                             std::string& err) {
  using detail::field_error;
  json_value v;
  std::string perr;
  if (!parse_json(line, v, perr)) {
    err = where + ": not valid JSON: " + perr;
    return false;
  }
  if (v.kind != json_value::object) {
    err = where + ": expected a JSON object, got " + kind_name(v.kind);
    return false;
  }
  out = request{};
  const json_value* id = v.find("id");
  if (!id) return err = field_error(where, "id", "missing"), false;
  if (id->kind == json_value::string)
    out.id = id->text;
  else if (id->is_uint())
    out.id = id->text;  // numeric ids are accepted as their text
  else
    return err = field_error(where, "id", std::string("expected a string, got ") + kind_name(id->kind)),
           false;
  if (out.id.empty()) return err = field_error(where, "id", "must not be empty"), false;

  const json_value* t = v.find("t");
  if (!t) return err = field_error(where, "t", "missing"), false;
  if (t->kind != json_value::number)
    return err = field_error(where, "t", std::string("expected a number, got ") + kind_name(t->kind)), false;
  if (!std::isfinite(t->num) || t->num < 0)
    return err = field_error(where, "t", "expected seconds >= 0, got " + t->text), false;
  out.t = t->num;

  const json_value* tokens = v.find("tokens");
  const json_value* segs = v.find("segments");
  if (tokens && segs) return err = where + ": give either \"tokens\" or \"segments\", not both", false;
  if (!tokens && !segs) return err = where + ": missing \"tokens\" or \"segments\"", false;
  if (tokens) {
    if (tokens->kind != json_value::array)
      return err = field_error(where, "tokens",
                               std::string("expected an array, got ") + kind_name(tokens->kind)),
             false;
    if (tokens->items.size() > max_prompt_tokens)
      return err = field_error(where, "tokens", "more than " + std::to_string(max_prompt_tokens) + " tokens"),
             false;
    out.tokens.reserve(tokens->items.size());
    for (std::size_t i = 0; i < tokens->items.size(); ++i) {
      const json_value& x = tokens->items[i];
      if (!x.is_uint() || x.as_uint() > 0xFFFFFFFFull)
        return err =
                   field_error(where, "tokens[" + std::to_string(i) + "]",
                               "expected an integer token id in [0, 2^32), got " +
                                   (x.kind == json_value::number ? x.text : std::string(kind_name(x.kind)))),
               false;
      out.tokens.push_back(static_cast<std::uint32_t>(x.as_uint()));
    }
  } else {
    if (segs->kind != json_value::array)
      return err = field_error(where, "segments",
                               std::string("expected an array, got ") + kind_name(segs->kind)),
             false;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < segs->items.size(); ++i) {
      const json_value& s = segs->items[i];
      const std::string name = "segments[" + std::to_string(i) + "]";
      if (s.kind != json_value::object)
        return err = field_error(where, name, std::string("expected an object, got ") + kind_name(s.kind)),
               false;
      const json_value* seed = s.find("seed");
      const json_value* len = s.find("len");
      if (!seed) return err = field_error(where, name + ".seed", "missing"), false;
      if (!seed->is_uint() || seed->as_uint() > 0xFFFFFFFFull)
        return err = field_error(where, name + ".seed", "expected an integer in [0, 2^32)"), false;
      if (!len) return err = field_error(where, name + ".len", "missing"), false;
      if (!len->is_uint() || len->as_uint() > max_prompt_tokens)
        return err = field_error(where, name + ".len",
                                 "expected an integer in [0, " + std::to_string(max_prompt_tokens) + "]"),
               false;
      total += len->as_uint();
      if (total > max_prompt_tokens)
        return err = field_error(where, "segments",
                                 "more than " + std::to_string(max_prompt_tokens) + " tokens"),
               false;
      out.segments.push_back({seed->as_uint(), len->as_uint()});
    }
    out.tokens.reserve(total);
    expand_segments(out.segments, out.tokens);
  }
  if (out.tokens.empty()) return err = where + ": the prompt is empty (no tokens)", false;
  return true;
}

/// Reads a whole trace; blank lines are skipped. Requests come back ordered by
/// arrival (stable, so equal offsets keep file order). Duplicate ids are an error.
inline bool read_trace(std::istream& in, const std::string& name, std::vector<request>& out,
                       std::string& err) {
  out.clear();
  std::string line;
  std::unordered_set<std::string> ids;
  std::size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    request r;
    const std::string where = name + ":" + std::to_string(lineno);
    if (!parse_trace_line(line, where, r, err)) return false;
    if (!ids.insert(r.id).second)
      return err = detail::field_error(where, "id", "duplicate id \"" + r.id + "\""), false;
    out.push_back(std::move(r));
  }
  if (out.empty()) return err = name + ": no requests in the trace", false;
  std::stable_sort(out.begin(), out.end(), [](const request& a, const request& b) { return a.t < b.t; });
  return true;
}

inline bool read_trace_file(const std::string& path, std::vector<request>& out, std::string& err) {
  std::ifstream in(path);
  if (!in) return err = path + ": cannot open the trace file", false;
  return read_trace(in, path, out, err);
}

/// One trace line for `r` (segments when it has them, else tokens).
inline std::string trace_line(const request& r) {
  std::string s = "{\"id\": ";
  append_json_string(s, r.id);
  s += ", \"t\": ";
  append_json_number(s, r.t);
  if (!r.segments.empty()) {
    s += ", \"segments\": [";
    for (std::size_t i = 0; i < r.segments.size(); ++i) {
      if (i) s += ", ";
      s += "{\"seed\": " + std::to_string(r.segments[i].seed) +
           ", \"len\": " + std::to_string(r.segments[i].len) + "}";
    }
  } else {
    s += ", \"tokens\": [";
    for (std::size_t i = 0; i < r.tokens.size(); ++i) {
      if (i) s += ",";
      s += std::to_string(r.tokens[i]);
    }
  }
  return s + "]}";
}

inline void write_trace(std::ostream& out, const std::vector<request>& reqs) {
  for (const request& r : reqs) out << trace_line(r) << '\n';
}

// ---- generator ----------------------------------------------------------------

enum class trace_kind { hit_heavy, cold, mixed };

/// The hit-heavy subset's published shape (450 requests, 1.21 requests/s, median
/// 16,390 tokens, range 14,715-17,889); the mean of 16,333 tokens gives its 7.35M
/// prompt tokens.
struct trace_spec {
  trace_kind kind = trace_kind::hit_heavy;
  std::size_t requests = 450;
  double rate_per_s = 1.21;
  std::uint64_t min_tokens = 14715, median_tokens = 16390, max_tokens = 17889;
  double mean_tokens = 16333;
  double sd_tokens = 560;
  std::uint64_t system_tokens = 1024;  ///< shared by every request (hit-heavy only)
  std::size_t group = 3;               ///< requests per shared document (hit-heavy only)
  std::uint64_t seed = 1;
};

/// The long-prompt stream: 64k-200k-token prompts (exactly one at 200k) sharing
/// a system prompt and documents, arriving slowly (one every 25 s on average,
/// so an engine that recomputes everything is about 20% busy).
inline trace_spec long_prompt_spec(std::size_t requests = 40, std::uint64_t seed = 1) {
  return {.kind = trace_kind::hit_heavy,
          .requests = requests,
          .rate_per_s = 0.04,
          .min_tokens = 64000,
          .median_tokens = 132000,
          .max_tokens = 200000,
          .mean_tokens = 132000,
          .sd_tokens = 40000,
          .system_tokens = 2048,
          .group = 3,
          .seed = seed};
}

namespace detail {

/// Deterministic uniform and normal draws from splitmix64 (std distributions
/// differ between standard libraries; traces must not).
class rng {
 public:
  explicit rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() { return splitmix64(s_++ * 0x2545F4914F6CDD1Dull); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }

 private:
  std::uint64_t s_;
};

}  // namespace detail

/// Prompt lengths with exactly the spec's minimum, median and maximum.
inline std::vector<std::uint64_t> generate_lengths(const trace_spec& spec, detail::rng& g) {
  const std::size_t n = spec.requests;
  std::vector<std::uint64_t> len(n);
  for (auto& x : len) {
    const double v = spec.mean_tokens + spec.sd_tokens * g.normal();
    x = static_cast<std::uint64_t>(std::clamp(std::llround(v), static_cast<long long>(spec.min_tokens),
                                              static_cast<long long>(spec.max_tokens)));
  }
  std::sort(len.begin(), len.end());
  if (n >= 2) len.front() = spec.min_tokens, len.back() = spec.max_tokens;
  if (n >= 3) {
    const std::size_t lo = (n - 1) / 2, hi = n / 2;  // the middle one or two
    len[lo] = len[hi] = spec.median_tokens;
    for (std::size_t i = 1; i < lo; ++i) len[i] = std::min(len[i], spec.median_tokens);
    for (std::size_t i = hi + 1; i + 1 < n; ++i) len[i] = std::max(len[i], spec.median_tokens);
  }
  for (std::size_t i = n; i > 1; --i) std::swap(len[i - 1], len[g.below(i)]);  // Fisher-Yates
  return len;
}

/// The generated stream. Arrivals are a Poisson process rescaled so the mean rate
/// is exactly rate_per_s. hit_heavy: every prompt = a system prompt shared by all
/// + a document shared by `group` requests + its own question, so the stream
/// reuses prefixes and a priming replay caches all full chunks. mixed: the same
/// with questions about half of each prompt, so priming the shared segments
/// (--prime-shared) caches about half the tokens. cold: the same lengths and
/// arrivals, every prompt unique.
inline std::vector<request> generate_trace(const trace_spec& spec) {
  detail::rng g(spec.seed);
  const std::size_t n = spec.requests;
  std::vector<request> out(n);
  if (n == 0) return out;
  std::vector<double> t(n, 0.0);
  for (std::size_t i = 1; i < n; ++i) t[i] = t[i - 1] - std::log(1.0 - g.uniform());
  const double span = (static_cast<double>(n) - 1.0) / spec.rate_per_s;
  if (n > 1 && t[n - 1] > 0)
    for (auto& x : t) x = std::round(x * span / t[n - 1] * 1000.0) / 1000.0;
  const std::vector<std::uint64_t> len = generate_lengths(spec, g);

  // Seeds: 1 = system prompt, 1000 + d = document d, 1'000'000 + i = request i's own text.
  const std::uint64_t base = (spec.seed % 400) * 10'000'000ull;  // seeds stay below 2^32
  for (std::size_t i = 0; i < n; ++i) {
    out[i].id = "r" + std::to_string(i);
    out[i].t = t[i];
  }
  if (spec.kind == trace_kind::cold) {
    for (std::size_t i = 0; i < n; ++i) out[i].segments = {{base + 1'000'000 + i, len[i]}};
  } else {
    // Requests join documents in a shuffled order, so readers of one document
    // arrive spread over the run.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[g.below(i)]);
    const std::size_t group = std::max<std::size_t>(spec.group, 1);
    for (std::size_t g0 = 0; g0 < n; g0 += group) {
      const std::size_t g1 = std::min(n, g0 + group);
      std::uint64_t shortest = len[order[g0]];
      for (std::size_t k = g0; k < g1; ++k) shortest = std::min(shortest, len[order[k]]);
      const std::uint64_t sys = std::min(spec.system_tokens, shortest / 4);
      const std::uint64_t question_min =
          spec.kind == trace_kind::mixed ? shortest / 2 : std::min<std::uint64_t>(160, shortest / 8);
      const std::uint64_t doc = shortest - sys - question_min;
      for (std::size_t k = g0; k < g1; ++k) {
        const std::size_t i = order[k];
        out[i].segments = {
            {base + 1, sys}, {base + 1000 + g0 / group, doc}, {base + 1'000'000 + i, len[i] - sys - doc}};
      }
    }
  }
  for (auto& r : out) expand_segments(r.segments, r.tokens);
  return out;
}

}  // namespace pcp
