// examples/pcp_prefill/timing_model.hpp: the explicit timing model of the
// example (this machine has no GPU), its clock, and the deterministic payloads.
//
// Every modeled duration is a real sleep of (duration * time_scale), so a
// 6-minute trace replays in ~20 s at time_scale 0.05 while queueing, overlap
// and stalls still happen for real between threads. Reported times are
// converted back to modeled seconds.
//
//   pcp::timing_model tm;                        // the reference's figures
//   tm.print(std::cout);
//   pcp::model_clock clk(tm.time_scale);
//   clk.sleep_for_model(tm.compute_s(16384));    // ~0.31 modeled s of prefill
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <span>
#include <thread>

#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "trace.hpp"

namespace pcp {

struct timing_model {
  double prefill_tokens_per_s = 52.2e3;  ///< R (--prefill-tokens-per-s)
  double bytes_per_token = 48.4e3;       ///< S, modeled KV bytes per token (--bytes-per-token)
  double payload_scale = 1.0 / 8192;     ///< stored bytes = modeled bytes * scale (--payload-scale)
  std::uint32_t chunk_tokens = 256;      ///< tokens per chunk (--chunk-tokens)
  // Modeled L2 (embedded): K single-threaded FIFO servers.
  std::uint32_t l2_instances = 1;  ///< K (--l2-model-instances)
  double l2_gbps = 1.71;           ///< per instance, decimal GB/s (--l2-model-gbps)
  double l2_t0_s = 0.33;           ///< fixed cost of each load request (--l2-model-t0-ms)
  // Modeled L1: host memory of each rank, read by that rank in parallel with the others.
  double l1_gbps = 0.5;      ///< per rank (--l1-model-gbps)
  double l1_t0_s = 0.05;     ///< fixed cost of each L1 load (--l1-model-t0-ms)
  double time_scale = 0.05;  ///< real seconds per modeled second (--time-scale)

  /// Modeled bytes of one chunk.
  double chunk_model_bytes() const { return bytes_per_token * chunk_tokens; }
  /// Bytes really stored and moved per chunk (at least 8).
  std::size_t chunk_bytes() const {
    return static_cast<std::size_t>(std::max(8.0, std::round(chunk_model_bytes() * payload_scale)));
  }
  /// Modeled bytes that `stored` real payload bytes stand for.
  double model_bytes(std::size_t stored) const {
    return static_cast<double>(stored) / static_cast<double>(chunk_bytes()) * chunk_model_bytes();
  }
  double compute_s(double tokens) const { return tokens / prefill_tokens_per_s; }
  kvtier::prefill_node node() const {
    return {.kv_bytes_per_token = bytes_per_token, .prefill_tokens_per_s = prefill_tokens_per_s};
  }

  void print(std::ostream& os, std::uint32_t world) const {
    char buf[256];
    auto line = [&](const char* fmt, auto... a) {
      std::snprintf(buf, sizeof buf, fmt, a...);
      os << buf << '\n';
    };
    line("timing model (modeled seconds; every modeled duration is slept x%.4g in real time)", time_scale);
    line("  prefill  R = %.1fk tokens/s on the node (W = %u ranks in lockstep); n tokens take n/R",
         prefill_tokens_per_s / 1e3, world);
    line(
        "  KV       S = %.1f KB/token, %u-token chunks = %.2f MB modeled; stored payload x%.6g = %zu B/chunk",
        bytes_per_token / 1e3, chunk_tokens, chunk_model_bytes() / 1e6, payload_scale, chunk_bytes());
    line("  B* = S*R = %.2f GB/s; a 16,384-token prompt: %.2f GB, recompute %.3f s",
         kvtier::break_even_bandwidth_gb_per_s(node()), kvtier::kv_gb(16384, bytes_per_token),
         compute_s(16384));
    line("  L1       per rank: %.3g GB/s + %.0f ms per load", l1_gbps, l1_t0_s * 1e3);
    line("  L2 model K = %u instance(s), each a single-threaded FIFO at %.3g GB/s (%.3g GB/s in all)",
         l2_instances, l2_gbps, l2_gbps * l2_instances);
    line(
        "           + %.0f ms fixed cost per load request (not holding the server); rank r -> instance r mod "
        "K",
        l2_t0_s * 1e3);
  }
};

/// Real clock <-> modeled seconds.
class model_clock {
 public:
  explicit model_clock(double scale) : scale_(scale > 0 ? scale : 0), start_(kvtier::clock::now()) {}
  double scale() const { return scale_; }
  /// Starts the clock again at now with `scale` (0: untimed, no sleeps). Not thread-safe:
  /// call it between runs, while no store or rank thread uses the clock.
  void restart(double scale) {
    scale_ = scale > 0 ? scale : 0;
    start_ = kvtier::clock::now();
  }
  kvtier::clock::time_point start() const { return start_; }
  /// Real time of modeled offset `s` from the start.
  kvtier::clock::time_point at(double s) const { return start_ + real(s); }
  /// Modeled seconds since the start.
  double now() const { return to_model(kvtier::clock::now() - start_); }
  double to_model(kvtier::clock::duration d) const {
    return scale_ > 0 ? std::chrono::duration<double>(d).count() / scale_ : 0.0;
  }
  kvtier::clock::duration real(double model_s) const {
    return std::chrono::duration_cast<kvtier::clock::duration>(
        std::chrono::duration<double>(model_s * scale_));
  }
  void sleep_for_model(double s) const {
    if (scale_ > 0 && s > 0) std::this_thread::sleep_for(real(s));
  }
  static void sleep_until(kvtier::clock::time_point t) { std::this_thread::sleep_until(t); }

 private:
  double scale_;
  kvtier::clock::time_point start_;
};

// ---- payloads -------------------------------------------------------------------

/// The KV bytes of one chunk, a pure function of its tokens and their positions:
/// what a load must reproduce exactly and what recompute would produce.
/// `tokens` are the chunk's tokens, `first_pos` the position of tokens[0].
inline void fill_payload(std::span<std::byte> out, std::span<const std::uint32_t> tokens,
                         std::uint64_t first_pos) {
  const std::size_t n = out.size(), t = tokens.size();
  if (n == 0 || t == 0) return;
  std::size_t i = 0;
  for (std::size_t w = 0; i < n; ++w) {
    const std::size_t k = std::min(t - 1, i * t / n);  // the token this word belongs to
    const std::uint64_t x = splitmix64((static_cast<std::uint64_t>(tokens[k]) << 32) ^
                                       ((first_pos + k) * 0x9E3779B97F4A7C15ull) ^ w);
    const std::size_t m = std::min<std::size_t>(8, n - i);
    std::memcpy(out.data() + i, &x, m);
    i += m;
  }
}

/// True when `got` is exactly the payload of that chunk. `scratch` avoids an allocation.
inline bool verify_payload(std::span<const std::byte> got, std::span<const std::uint32_t> tokens,
                           std::uint64_t first_pos, std::span<std::byte> scratch) {
  if (scratch.size() < got.size()) return false;
  fill_payload(scratch.first(got.size()), tokens, first_pos);
  return std::memcmp(scratch.data(), got.data(), got.size()) == 0;
}

}  // namespace pcp
