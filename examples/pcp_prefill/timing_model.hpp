// examples/pcp_prefill/timing_model.hpp: the explicit timing model of the
// example (this machine has no GPU), the modeled L2 servers' timeline, and the
// deterministic payloads.
//
// Time is modeled, not slept: the engine keeps a modeled clock that advances
// by events (arrivals, the end of a compute step, the modeled end of a lookup,
// a load, a broadcast or a write-back). The data path (stores, fetch queue,
// collectives, byte checks) runs for real in between, as fast as the CPU goes,
// and none of its real CPU time enters modeled time. A replay is therefore
// reproducible (the same trace and flags give the same figures) and fast.
//
// Every modeled cost:
//   compute       n tokens take n / R
//   lookup        per rank: RTT + keys * per-key server time, queued at its L2 instance
//   L2 load       per rank: T0 (client, network; does not hold the server), then its
//                 bytes / per-instance GB/s in the instance's FIFO
//   L1 load       per rank: T0_l1 + bytes / L1 GB/s (host memory, ranks in parallel)
//   write-back    per rank: T0 + bytes / per-instance GB/s in the instance's FIFO
//                 (async: off the step; sync: the step waits for it)
//   broadcast     owner -> all: the bytes one rank receives / interconnect GB/s
//                 + one collective latency per collective the protocol issued
//
//   pcp::timing_model tm;                        // the reference's figures
//   tm.print(std::cout, 8);
//   pcp::l2_timeline line(tm);
//   double end = line.serve(/*rank*/ 3, /*arrive*/ 1.0, /*hold_s*/ 0.06);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

#include "kvtier/cost_model.hpp"
#include "kvtier/kv_layout.hpp"
#include "trace.hpp"

namespace pcp {

/// What the L2 tier is: the modeled servers, none, or real servers (timed by the wall clock).
enum class l2_kind { modeled, none, real };

/// When a loaded request's prefill may start computing (--load-granularity):
///   chunk           after its whole load has been fetched and moved (the default);
///   layer           layer l once layer group l of every loaded chunk is in the pages, with
///                   whole-chunk fetches (one GET per chunk, remote_store's get): only
///                   the owner -> all move and scatter, group by group, overlap compute;
///   layer_streamed  the same with group-major ranged reads (GETRANGE per layer group,
///                   remote_store::get_by_group; the storage choice is in
///                   docs/layer_by_layer.md): group g of a rank's chunks is fetched after
///                   (g+1)/G of its transfer, so the fetch overlaps compute too. Modeled here;
///                   with --l2 redis://... it runs for real.
enum class load_granularity { chunk, layer, layer_streamed };
inline const char* to_string(load_granularity g) {
  return g == load_granularity::chunk ? "chunk" : g == load_granularity::layer ? "layer" : "layer-streamed";
}

/// The layout of the engine's paged KV cache (--kv-layout).
enum class kv_layout_kind { mla, fa_nhd };
inline const char* to_string(kv_layout_kind k) { return k == kv_layout_kind::mla ? "mla" : "fa-nhd"; }

struct timing_model {
  double prefill_tokens_per_s = 52.2e3;  ///< R (--prefill-tokens-per-s)
  double bytes_per_token = 48.4e3;       ///< S, modeled KV bytes per token (--bytes-per-token)
  double payload_scale = 1.0 / 8192;     ///< stored bytes = modeled bytes * scale (--payload-scale)
  std::uint32_t chunk_tokens = 256;      ///< tokens per chunk (--chunk-tokens)
  // The paged KV cache every rank keeps its KV in (host memory, a real engine layout).
  kv_layout_kind kv = kv_layout_kind::mla;  ///< vLLM MLA (bf16 latent) or FlashAttention NHD (--kv-layout)
  std::uint32_t kv_layers = 3;              ///< layers of the paged cache (--kv-layers)
  std::uint32_t kv_block_tokens = 64;       ///< tokens per block (--kv-block-tokens)
  // Modeled L2 (embedded): K single-threaded FIFO servers.
  std::uint32_t l2_instances = 1;  ///< K (--l2-model-instances)
  double l2_gbps = 1.71;           ///< per instance, decimal GB/s (--l2-model-gbps)
  double l2_t0_s = 0.33;           ///< fixed cost of each load and write-back request (--l2-model-t0-ms)
  double l2_rtt_s = 0.5e-3;        ///< a lookup's round trip (--l2-model-rtt-ms)
  double l2_key_s = 2e-6;          ///< server time per key of a lookup (--l2-model-key-us)
  // Modeled L1: host memory of each rank, read by that rank in parallel with the others.
  double l1_gbps = 0.5;   ///< per rank (--l1-model-gbps)
  double l1_t0_s = 0.05;  ///< fixed cost of each L1 load (--l1-model-t0-ms)
  // The owner -> all broadcast of loaded chunks between the node's GPUs.
  double interconnect_gbps = 100;  ///< bytes one rank receives per second (--interconnect-gbps)
  double collective_s = 20e-6;     ///< latency of one collective (--collective-us)

  /// Modeled bytes of one chunk.
  double chunk_model_bytes() const { return bytes_per_token * chunk_tokens; }
  /// Bytes one token takes in one layer per element of width: MLA one bf16 latent element;
  /// FlashAttention a K and a V element of one fp8 head.
  static constexpr std::uint64_t kv_element_bytes = 2;
  /// The layout's width (MLA latent elements, FA head size) that makes a token's bytes over
  /// kv_layers the scaled payload (modeled bytes * payload_scale), rounded, at least 1: the
  /// real widths (576 bf16 for DeepSeek MLA) do not fit the scaled-down payload.
  std::uint32_t kv_width() const {
    const double per_token = chunk_model_bytes() * payload_scale / std::max<std::uint32_t>(1, chunk_tokens);
    const double w =
        std::round(per_token / static_cast<double>(kv_element_bytes * std::max<std::uint32_t>(1, kv_layers)));
    return static_cast<std::uint32_t>(std::clamp(w, 1.0, 1e9));
  }
  /// The paged cache's layout with `blocks` blocks.
  kvtier::kv_layout kv_layout_for(std::uint64_t blocks) const {
    return kv == kv_layout_kind::mla
               ? kvtier::kv_layout::vllm_mla(kv_layers, blocks, kv_block_tokens, 2, kv_width())
               : kvtier::kv_layout::vllm_flash_attn(kv_layers, blocks, kv_block_tokens, 1, kv_width(), 1,
                                                    kvtier::kv_order::nhd);
  }
  /// Bytes really stored and moved per chunk: the chunk's tokens in the paged layout
  /// (≈ modeled bytes * payload_scale, rounded to whole layout tokens).
  std::size_t chunk_bytes() const {
    return static_cast<std::size_t>(kv_layout_for(1).bytes_per_token()) * chunk_tokens;
  }
  double compute_s(double tokens) const { return tokens / prefill_tokens_per_s; }
  /// Seconds an instance is held serving `model_bytes`.
  double l2_hold_s(double model_bytes) const { return model_bytes / (l2_gbps * 1e9); }
  double l1_load_s(double model_bytes) const {
    return model_bytes > 0 ? l1_t0_s + model_bytes / (l1_gbps * 1e9) : 0.0;
  }
  double broadcast_s(double received_model_bytes, std::uint64_t collectives) const {
    return received_model_bytes / (interconnect_gbps * 1e9) + static_cast<double>(collectives) * collective_s;
  }
  /// The whole tier's bandwidth when every rank loads: K instances (at most one per rank).
  double l2_total_gbps(std::uint32_t world) const { return l2_gbps * std::min(l2_instances, world); }
  kvtier::prefill_node node() const {
    return {.kv_bytes_per_token = bytes_per_token, .prefill_tokens_per_s = prefill_tokens_per_s};
  }

  /// The closed-form TTFT of one request alone (no queue, no lookup): `hit` tokens loaded from
  /// the L2 at (T0, B = every rank's instance in parallel), moved owner -> all (M: the
  /// (W-1)/W of the bytes a rank receives over the interconnect), and the `prompt - hit`
  /// suffix computed (c = suffix / R), split evenly over the kv_layers layers (L, one layer
  /// group each in the layer modes). F = hit bytes / B. Layer group l is in at
  ///   chunk           T0 + F + M (the whole load), then c:            T0 + F + M + c
  ///   layer           T0 + F + (l+1) M/L, layer l after it:           T0 + F + max(M/L + c, M + c/L)
  ///   layer_streamed  T0 + (l+1) F/L + M/L (group l moves as soon as it is fetched):
  ///                                                                   T0 + M/L + max(F/L + c, F + c/L)
  /// (each a maximum over l of a linear function of l: at l = 0 or l = L-1). No hit: prompt / R.
  double predicted_ttft_s(load_granularity g, double hit, double prompt, std::uint32_t world) const {
    const double c = compute_s(prompt - hit);
    if (!(hit > 0)) return c;
    const double f = kvtier::kv_gb(hit, bytes_per_token) / l2_total_gbps(world);
    const double w = static_cast<double>(std::max<std::uint32_t>(1, world));
    const double m = broadcast_s(hit * bytes_per_token * (w - 1) / w, 0);
    const double layers = static_cast<double>(std::max<std::uint32_t>(1, kv_layers));
    switch (g) {
      case load_granularity::chunk:
        return l2_t0_s + f + m + c;
      case load_granularity::layer:
        return l2_t0_s + f + std::max(m / layers + c, m + c / layers);
      case load_granularity::layer_streamed:
        return l2_t0_s + m / layers + std::max(f / layers + c, f + c / layers);
    }
    return 0;
  }

  /// The timing block. Real servers: their figures are measured, so the modeled ones are not shown.
  void print(std::ostream& os, std::uint32_t world, l2_kind l2 = l2_kind::modeled) const {
    char buf[320];
    auto line = [&](const char* fmt, auto... a) {
      std::snprintf(buf, sizeof buf, fmt, a...);
      os << buf << '\n';
    };
    line("timing model (modeled seconds on a clock that advances by events; real CPU time is not counted)");
    line("  prefill    R = %.1fk tokens/s on the node (W = %u ranks in lockstep); n tokens take n/R",
         prefill_tokens_per_s / 1e3, world);
    line(
        "  KV         S = %.1f KB/token, %u-token chunks = %.2f MB modeled; stored payload x%.6g = %zu "
        "B/chunk",
        bytes_per_token / 1e3, chunk_tokens, chunk_model_bytes() / 1e6, payload_scale, chunk_bytes());
    line(
        "  KV cache   paged, %s: %s, %u layers, width %u, %u-token blocks, %llu B/token (host memory per "
        "rank)",
        to_string(kv), kv_layout_for(1).name.c_str(), kv_layers, kv_width(), kv_block_tokens,
        static_cast<unsigned long long>(kv_layout_for(1).bytes_per_token()));
    line("  B* = S*R = %.2f GB/s; a 16,384-token prompt: %.2f GB, recompute %.3f s",
         kvtier::break_even_bandwidth_gb_per_s(node()), kvtier::kv_gb(16384, bytes_per_token),
         compute_s(16384));
    line("  L1 load    per rank: %.0f ms + bytes / %.3g GB/s (host memory)", l1_t0_s * 1e3, l1_gbps);
    if (l2 == l2_kind::modeled) {
      line(
          "  L2         K = %u instance(s), each a single-threaded FIFO at %.4g GB/s (%.4g GB/s in all); "
          "rank r "
          "-> instance r mod K",
          l2_instances, l2_gbps, l2_total_gbps(world));
      line("  L2 load    per rank: T0 = %.1f ms (not holding the server), then its bytes in the FIFO",
           l2_t0_s * 1e3);
      line("  L2 lookup  per rank: %.2f ms RTT + %.1f us per key in the FIFO", l2_rtt_s * 1e3,
           l2_key_s * 1e6);
      line(
          "  write-back per rank: T0 = %.1f ms + its bytes in the FIFO (async: off the step; sync: the step "
          "waits)",
          l2_t0_s * 1e3);
    } else if (l2 == l2_kind::none) {
      line("  L2         none");
    } else {
      line(
          "  L2         real servers: lookup, load and write-back times are measured (wall clock), not "
          "modeled");
    }
    line("  broadcast  owner -> all: received bytes / %.4g GB/s + %.0f us per collective", interconnect_gbps,
         collective_s * 1e6);
  }
};

/// The modeled L2 instances in modeled time: each serves one request at a time,
/// in order of arrival. Requests are booked when the engine issues them, which
/// can be before an earlier-arriving one is booked (a load's arrival is T0
/// ahead, a lookup's only an RTT), so a booking takes the first idle gap at or
/// after its arrival that fits it rather than the end of the last booking.
/// Every rank keeps its own copy and books the same requests in the same order
/// (ranks 0..W-1), so all copies agree without a collective.
class l2_timeline {
 public:
  explicit l2_timeline(const timing_model& tm) : busy_(std::max<std::uint32_t>(1, tm.l2_instances)) {}
  /// A request of `rank` reaching its instance at `arrive` and holding it `hold_s`: its end.
  double serve(std::uint32_t rank, double arrive, double hold_s) {
    auto& v = busy_[rank % busy_.size()];
    double t = arrive;
    auto it = v.begin();
    for (; it != v.end(); ++it) {
      if (it->second <= t) continue;
      if (it->first >= t + hold_s) break;  // fits in the gap before this booking
      t = it->second;
    }
    v.insert(it, {t, t + hold_s});
    busy_s_ += hold_s;
    return t + hold_s;
  }
  /// Forgets bookings that ended by `now` (no later request arrives before now).
  void prune(double now) {
    for (auto& v : busy_) {
      auto it = v.begin();
      while (it != v.end() && it->second <= now) ++it;
      v.erase(v.begin(), it);
    }
  }
  double busy_s() const { return busy_s_; }

 private:
  std::vector<std::vector<std::pair<double, double>>> busy_;  // per instance: (start, end), by start
  double busy_s_ = 0;
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
