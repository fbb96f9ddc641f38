// bench_kv_copy: CPU gather (paged cache → chunk value) and scatter (value → paged cache) of one
// 256-token chunk of about 12.4 MB, in the vLLM MLA (bf16 and the 656-byte fp8 format) and vLLM
// FlashAttention (NHD and HND) layouts, against memcpy of the same number of contiguous bytes in
// the same run. The chunk's 256 tokens sit in whole blocks taken in shuffled order, as a block
// allocator leaves them. Repetitions alternate gather, scatter and memcpy; figures are medians,
// and each ratio is the median of the per-repetition ratios (steadier on a shared machine).
// The last line is one JSON object.
//
//   bench_kv_copy [--reps R]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"

#include "../support/machine.hpp"
#include "../support/stats.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

template <class F>
double seconds(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct row {
  const char* name;
  kvtier::kv_layout layout;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(3, std::atoi(argv[i + 1]));
  constexpr std::size_t tokens = 256;
  // Layer counts chosen so one chunk is about 12.4 MB; 4x the chunk's blocks in the cache.
  const row rows[] = {
      {"vllm_mla_bf16", kvtier::kv_layout::vllm_mla(42, 16, 64)},
      {"vllm_mla_fp8", kvtier::kv_layout::vllm_mla_fp8(74, 16, 64)},
      {"flash_attn_nhd", kvtier::kv_layout::vllm_flash_attn(12, 64, 16, 8, 128)},
      {"flash_attn_hnd", kvtier::kv_layout::vllm_flash_attn(12, 64, 16, 8, 128, 2, kvtier::kv_order::hnd)}};
  std::printf("%-16s %8s %12s %12s %12s %9s %9s\n", "layout", "MB", "gather", "scatter", "memcpy", "g/memcpy",
              "s/memcpy");
  std::string json = "{\"bench\":\"kv_copy\",\"reps\":" + std::to_string(reps) + ",\"rows\":[";
  bool ok = true;
  for (const row& r : rows) {
    const kvtier::kv_layout& lay = r.layout;
    std::vector<std::vector<std::byte>> layers(lay.num_layers, std::vector<std::byte>(lay.layer_extent()));
    std::vector<std::byte*> ptrs;
    for (auto& l : layers) {
      for (std::size_t i = 0; i < l.size(); i += 4096) l[i] = std::byte(i >> 12);  // fault in
      ptrs.push_back(l.data());
    }
    const auto cache = kvtier::kv_cache_view::per_layer(lay, ptrs);
    // whole blocks in a fixed shuffled order (every 3rd block, wrapping)
    std::vector<std::int64_t> slots;
    for (std::uint64_t k = 0; slots.size() < tokens; ++k) {
      const std::uint64_t b = (k * 3 + 1) % lay.num_blocks;
      for (std::uint32_t t = 0; t < lay.block_size && slots.size() < tokens; ++t)
        slots.push_back(static_cast<std::int64_t>(b * lay.block_size + t));
    }
    const std::size_t bytes = lay.bytes_per_token() * tokens;
    std::vector<std::byte> chunk(bytes, std::byte{1}), a(bytes, std::byte{2}), b(bytes, std::byte{3});
    std::vector<double> g, s, m, rg, rs;  // rg/rs: memcpy time / copy time within one repetition
    for (int i = 0; i < reps + 1; ++i) {  // the first round warms up and is dropped
      const double tg = seconds([&] { ok &= !kvtier::kv_gather(cache, slots, chunk); });
      const double ts = seconds([&] { ok &= !kvtier::kv_scatter(cache, slots, chunk); });
      const double tm = seconds([&] { std::memcpy(b.data(), a.data(), bytes); });
      if (i == 0) continue;
      g.push_back(tg);
      s.push_back(ts);
      m.push_back(tm);
      rg.push_back(tm / tg);
      rs.push_back(tm / ts);
    }
    const double mg = kvtier_bench::median(g), ms = kvtier_bench::median(s), mm = kvtier_bench::median(m);
    const double ratio_g = kvtier_bench::median(rg), ratio_s = kvtier_bench::median(rs);
    auto gbs = [&](double sec) { return bytes / sec / 1e9; };
    std::printf("%-16s %8.2f %7.2f GB/s %7.2f GB/s %7.2f GB/s %9.2f %9.2f\n", r.name, bytes / 1e6, gbs(mg),
                gbs(ms), gbs(mm), ratio_g, ratio_s);
    char buf[384];
    std::snprintf(
        buf, sizeof buf,
        "%s{\"layout\":\"%s\",\"bytes\":%zu,\"gather_gbs\":%.3f,\"scatter_gbs\":%.3f,\"memcpy_gbs\":%.3f,"
        "\"gather_vs_memcpy\":%.3f,\"scatter_vs_memcpy\":%.3f}",
        &r == rows ? "" : ",", r.name, bytes, gbs(mg), gbs(ms), gbs(mm), ratio_g, ratio_s);
    json += buf;
  }
  std::printf(
      "ratios: median over repetitions of memcpy time / copy time in the same repetition (1.0 = as fast as\n"
      "memcpy of the same bytes; target >= 0.7); paired, so load from other processes cancels out\n");
  std::printf("%s],\"ok\":%s,\"loadavg_1m\":%.2f}\n", json.c_str(), ok ? "true" : "false",
              kvtier_bench::load_average());
  return ok ? 0 : 1;
}
