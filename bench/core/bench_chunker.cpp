// bench_chunker: a 200k-token prompt into chained chunk keys, with the default
// XXH3-128 chain and, as the baseline in the same run, an OpenSSL SHA-256 chain
// through the same chunker<> template. Repetitions alternate between the two;
// the figures are medians. The last line is one JSON object.
//
//   bench_chunker [--tokens N] [--chunk T] [--reps R]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/chunker.hpp"

#ifdef KVTIER_BENCH_HAS_OPENSSL
#include <openssl/evp.h>

#include "../support/stats.hpp"

namespace {
// key c = first 128 bits of SHA-256(key c-1 || chunk bytes): the same chaining as
// the default hash, with a cryptographic hash. One reused context per thread.
struct sha256_chain {
  static constexpr std::string_view name = "sha256";
  static kvtier::chunk_key chain(const kvtier::chunk_key& prev, std::span<const std::byte> bytes) {
    thread_local const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                                                   &EVP_MD_CTX_free);
    thread_local const EVP_MD* md = EVP_sha256();
    unsigned char digest[32];
    unsigned int len = 0;
    const std::uint64_t prev_words[2] = {prev.hi, prev.lo};
    if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1 ||
        EVP_DigestUpdate(ctx.get(), prev_words, sizeof prev_words) != 1 ||
        EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1 ||
        EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1) {
      std::fprintf(stderr, "bench_chunker: OpenSSL SHA-256 failed\n");
      std::exit(1);
    }
    kvtier::chunk_key k;
    std::memcpy(&k.hi, digest, 8);
    std::memcpy(&k.lo, digest + 8, 8);
    return k;
  }
};
}  // namespace
#endif

namespace {

using clock_type = std::chrono::steady_clock;

struct series {
  std::vector<double> seconds_per_prompt;
  std::uint64_t sink = 0;  // keeps the keys alive for the optimiser
  double median() const { return kvtier_bench::median(seconds_per_prompt); }
};

// Seconds for `iters` passes over the prompt.
template <class Hash>
double time_passes(const kvtier::chunker<Hash>& ch, std::span<const kvtier::token_id> tokens,
                   std::vector<kvtier::chunk_key>& out, std::size_t iters, std::uint64_t& sink) {
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < iters; ++i) {
    out.clear();
    ch.keys(tokens, out);
    sink ^= out.back().lo;
  }
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Passes per repetition so that one repetition takes about 20 ms.
template <class Hash>
std::size_t calibrate(const kvtier::chunker<Hash>& ch, std::span<const kvtier::token_id> tokens,
                      std::vector<kvtier::chunk_key>& out, std::uint64_t& sink) {
  time_passes(ch, tokens, out, 1, sink);  // warm up caches and OpenSSL's dispatch
  const double once = std::max(time_passes(ch, tokens, out, 3, sink) / 3, 1e-7);
  return std::max<std::size_t>(1, static_cast<std::size_t>(0.02 / once));
}

template <class Hash>
void repetition(const kvtier::chunker<Hash>& ch, std::span<const kvtier::token_id> tokens,
                std::vector<kvtier::chunk_key>& out, std::size_t iters, series& s) {
  s.seconds_per_prompt.push_back(time_passes(ch, tokens, out, iters, s.sink) / static_cast<double>(iters));
}

std::size_t arg(int argc, char** argv, const char* name, std::size_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0)
      return static_cast<std::size_t>(std::strtoull(argv[i + 1], nullptr, 10));
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n_tokens = arg(argc, argv, "--tokens", 200000);
  const std::size_t chunk = arg(argc, argv, "--chunk", 256);
  const std::size_t reps = std::max<std::size_t>(1, arg(argc, argv, "--reps", 15));
  if (chunk == 0 || n_tokens < chunk) {
    std::fprintf(stderr, "bench_chunker: need --chunk > 0 and --tokens >= --chunk\n");
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
  std::vector<kvtier::chunk_key> out;
  out.reserve(n_tokens / chunk + 1);

  const kvtier::chunker<> xxh(ns);
  series xs;
  const std::size_t x_iters = calibrate(xxh, tokens, out, xs.sink);
#ifdef KVTIER_BENCH_HAS_OPENSSL
  const kvtier::chunker<sha256_chain> sha(ns);
  series ss;
  const std::size_t s_iters = calibrate(sha, tokens, out, ss.sink);
#endif
  for (std::size_t r = 0; r < reps; ++r) {  // alternate, so drift hits both alike
    repetition(xxh, tokens, out, x_iters, xs);
#ifdef KVTIER_BENCH_HAS_OPENSSL
    repetition(sha, tokens, out, s_iters, ss);
#endif
  }

  const double token_bytes = static_cast<double>(n_tokens * sizeof(kvtier::token_id));
  const double x_s = xs.median();
  const double x_tps = static_cast<double>(n_tokens) / x_s, x_gbps = token_bytes / x_s / 1e9;
  std::printf("prompt: %zu tokens (%zu full chunks of %zu), %zu repetitions, medians\n", n_tokens,
              n_tokens / chunk, chunk, reps);
  std::printf("%-10s %10.1f us/prompt %14.0f tokens/s %8.2f GB/s of token bytes\n", "xxh3-128", x_s * 1e6,
              x_tps, x_gbps);
  std::string sha_json =
      "\"sha256_tokens_per_s\":null,\"sha256_gb_per_s\":null,\"ratio_xxh3_over_sha256\":null";
#ifdef KVTIER_BENCH_HAS_OPENSSL
  const double s_s = ss.median();
  const double s_tps = static_cast<double>(n_tokens) / s_s, s_gbps = token_bytes / s_s / 1e9;
  std::printf("%-10s %10.1f us/prompt %14.0f tokens/s %8.2f GB/s of token bytes  (baseline, OpenSSL)\n",
              "sha256", s_s * 1e6, s_tps, s_gbps);
  std::printf("ratio xxh3-128 / sha256: %.1fx\n", s_s / x_s);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "\"sha256_tokens_per_s\":%.0f,\"sha256_gb_per_s\":%.3f,\"ratio_xxh3_over_sha256\":%.2f",
                s_tps, s_gbps, s_s / x_s);
  sha_json = buf;
  const std::uint64_t sink = xs.sink ^ ss.sink;
#else
  std::printf("sha256 baseline skipped: built without OpenSSL\n");
  const std::uint64_t sink = xs.sink;
#endif
  std::printf(
      "{\"bench\":\"chunker\",\"tokens\":%zu,\"chunk_tokens\":%zu,\"repetitions\":%zu,"
      "\"xxh3_128_tokens_per_s\":%.0f,\"xxh3_128_gb_per_s\":%.3f,%s,\"sink\":%llu}\n",
      n_tokens, chunk, reps, x_tps, x_gbps, sha_json.c_str(), static_cast<unsigned long long>(sink % 1000));
  return 0;
}
