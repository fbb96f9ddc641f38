// bench_chunker: a 200k-token prompt into chained chunk keys with the default XXH3-128 chain
// and (where kvtier::openssl is built) the SHA-256 chain, each plain and with key material (a
// LoRA adapter, a tenant salt and four 576-token images). Baselines in the same run: one
// XXH3-128 and one SHA-256 pass over the whole prompt's bytes (the floor of a chain of that
// hash). Repetitions interleave every variant; the figures are medians of the thread's CPU
// time (hashing is compute-bound, and CPU time does not count the time other processes hold
// the core on a shared machine). The last line is one JSON object.
//
//   bench_chunker [--tokens N] [--chunk T] [--reps R]
#include <time.h>
#include <algorithm>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../support/machine.hpp"
#include "../support/stats.hpp"
#include "kvtier/chunker.hpp"

#ifdef KVTIER_BENCH_HAS_OPENSSL
#include <openssl/evp.h>

#include "kvtier/chunk_hash_openssl.hpp"
#endif

namespace {

// This thread's CPU time in seconds.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// One measured variant: `run` does one pass over the prompt and returns something to keep.
struct variant {
  std::string name;
  std::string key;  // JSON field prefix
  std::function<std::uint64_t()> run;
  std::size_t iters = 1;
  std::vector<double> seconds_per_prompt;
  double median() const { return kvtier_bench::median(seconds_per_prompt); }
};

std::uint64_t g_sink = 0;  // keeps results alive for the optimiser

double time_passes(variant& v, std::size_t iters) {
  const double t0 = cpu_now();
  for (std::size_t i = 0; i < iters; ++i) g_sink ^= v.run();
  return cpu_now() - t0;
}

// Passes per repetition so that one repetition takes about 20 ms.
void calibrate(variant& v) {
  time_passes(v, 1);  // warm up caches and OpenSSL's dispatch
  const double once = std::max(time_passes(v, 3) / 3, 1e-7);
  v.iters = std::max<std::size_t>(1, static_cast<std::size_t>(0.02 / once));
}

std::size_t arg(int argc, char** argv, const char* name, std::size_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0)
      return static_cast<std::size_t>(std::strtoull(argv[i + 1], nullptr, 10));
  return fallback;
}

template <class Hash>
std::function<std::uint64_t()> chain(const kvtier::chunker<Hash>& ch,
                                     std::span<const kvtier::token_id> tokens, const kvtier::key_material& m,
                                     std::vector<kvtier::chunk_key>& out) {
  return [&ch, tokens, m, &out] {
    out.clear();
    ch.keys(tokens, m, out);
    return out.back().lo;
  };
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n_tokens = arg(argc, argv, "--tokens", 200000);
  const std::size_t chunk = arg(argc, argv, "--chunk", 256);
  const std::size_t reps = std::max<std::size_t>(1, arg(argc, argv, "--reps", 15));
  if (chunk == 0 || n_tokens < chunk || n_tokens < 4 * 576) {
    std::fprintf(stderr, "bench_chunker: need --chunk > 0, --tokens >= --chunk and --tokens >= 2304\n");
    return 2;
  }

  // Token ids spread over a 151,552-entry vocabulary (GLM's).
  std::vector<kvtier::token_id> tokens(n_tokens);
  std::uint64_t x = 0x2545F4914F6CDD1Dull;
  for (auto& t : tokens) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<kvtier::token_id>(x % 151552);
  }
  const kvtier::key_namespace ns{
      .model = "bench", .kv_format = "fp8", .chunk_tokens = static_cast<std::uint32_t>(chunk)};
  // Four images of 576 placeholder tokens each, spread over the prompt.
  std::vector<kvtier::media_item> images;
  for (std::uint64_t i = 0; i < 4; ++i)
    images.push_back({.offset = i * (n_tokens / 4), .length = 576, .content_hash = {i + 1, ~i}});
  const kvtier::key_material none{};
  const kvtier::key_material material{
      .adapter = "sql-lora-v2", .tenant_salt = "tenant-0042", .media = images};
  std::vector<kvtier::chunk_key> out;
  out.reserve(n_tokens / chunk + 1);
  const auto bytes = std::as_bytes(std::span<const kvtier::token_id>(tokens));

  const kvtier::chunker<> xxh(ns);
  std::vector<variant> v;
  v.push_back({"xxh3-128 chain", "xxh3_chain", chain(xxh, tokens, none, out)});
  v.push_back({"xxh3-128 chain + material", "xxh3_material", chain(xxh, tokens, material, out)});
  v.push_back({"xxh3-128 one pass (floor)", "xxh3_floor",
               [&] { return XXH3_128bits(bytes.data(), bytes.size()).low64; }});
#ifdef KVTIER_BENCH_HAS_OPENSSL
  const kvtier::chunker<kvtier::sha256_128> sha(ns);
  v.push_back({"sha256-128 chain", "sha256_chain", chain(sha, tokens, none, out)});
  v.push_back({"sha256-128 chain + material", "sha256_material", chain(sha, tokens, material, out)});
  v.push_back({"sha256 one pass (floor)", "sha256_floor", [&] {
                 unsigned char d[32];
                 unsigned int len = 0;
                 EVP_Digest(bytes.data(), bytes.size(), d, &len, EVP_sha256(), nullptr);
                 std::uint64_t r;
                 std::memcpy(&r, d, 8);
                 return r;
               }});
#endif
  for (auto& e : v) calibrate(e);
  for (std::size_t r = 0; r < reps; ++r)  // interleaved, so drift hits every variant alike
    for (auto& e : v) e.seconds_per_prompt.push_back(time_passes(e, e.iters) / static_cast<double>(e.iters));

  const double token_bytes = static_cast<double>(bytes.size());
  const std::size_t chunks = n_tokens / chunk;
  std::printf(
      "prompt: %zu tokens (%zu full chunks of %zu), %zu repetitions interleaved, medians of thread CPU "
      "time\n",
      n_tokens, chunks, chunk, reps);
  std::string js = "{\"bench\":\"chunker\",\"tokens\":" + std::to_string(n_tokens) +
                   ",\"chunk_tokens\":" + std::to_string(chunk) + ",\"repetitions\":" + std::to_string(reps);
  for (auto& e : v) {
    const double s = e.median();
    std::printf("%-28s %10.1f us/prompt %8.3f us/chunk %8.2f GB/s of token bytes\n", e.name.c_str(), s * 1e6,
                s * 1e6 / static_cast<double>(chunks), token_bytes / s / 1e9);
    char buf[160];
    std::snprintf(buf, sizeof buf, ",\"%s_us\":%.1f", e.key.c_str(), s * 1e6);
    js += buf;
  }
  auto ratio = [&](std::size_t a, std::size_t b) { return v[a].median() / v[b].median(); };
  char buf[512];
  std::snprintf(buf, sizeof buf, ",\"material_overhead_xxh3\":%.3f,\"xxh3_chain_over_floor\":%.2f",
                ratio(1, 0), ratio(0, 2));
  js += buf;
  std::printf("key material (adapter + salt + 4 images) costs %.1f%% with xxh3-128\n",
              (ratio(1, 0) - 1) * 100);
#ifdef KVTIER_BENCH_HAS_OPENSSL
  std::printf("sha256-128 chain / xxh3-128 chain: %.1fx slower (%.2f us more per chunk)\n", ratio(3, 0),
              (v[3].median() - v[0].median()) * 1e6 / static_cast<double>(chunks));
  std::printf("sha256-128 chain / one SHA-256 pass over the prompt: %.2fx\n", ratio(3, 5));
  std::snprintf(
      buf, sizeof buf,
      ",\"ratio_sha256_over_xxh3\":%.2f,\"material_overhead_sha256\":%.3f,\"sha256_chain_over_floor\":%.2f",
      ratio(3, 0), ratio(4, 3), ratio(3, 5));
  js += buf;
#else
  std::printf("sha256 variants skipped: built without OpenSSL\n");
  js += ",\"ratio_sha256_over_xxh3\":null";
#endif
  std::printf("%s,\"sink\":%llu,\"loadavg_1m\":%.2f}\n", js.c_str(),
              static_cast<unsigned long long>(g_sink % 1000), kvtier_bench::load_average());
  return 0;
}
