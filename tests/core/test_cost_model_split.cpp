// Cost model: the split point (compute the front of a hit while loading its back)
// on the reference's figures, and its bound against full load and full recompute;
// the single-instance rate derived from the sustained rate.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "kvtier/cost_model.hpp"
#include "support/property.hpp"

namespace {
constexpr kvtier::prefill_node glm{.kv_bytes_per_token = 48.4e3, .prefill_tokens_per_s = 52.2e3};
constexpr kvtier::load_path one{.fixed_cost_s = 0.33, .bandwidth_gb_per_s = 1.71};
constexpr kvtier::load_path eight{.fixed_cost_s = 0.33, .bandwidth_gb_per_s = 10.76};
}  // namespace

TEST_CASE("split point: the reference's 200k-token hit", "[unit]") {
  const double n = 200000;
  SECTION("one instance: recompute 3.83 s, load 5.99 s, split 2.42 s") {
    const auto p = kvtier::split_point(glm, one, n, n);
    CHECK(p.recompute_s == Approx(3.83).margin(0.005));
    CHECK(p.full_load_s == Approx(5.99).margin(0.005));
    CHECK(p.predicted_s == Approx(2.42).margin(0.005));
    CHECK(p.k_tokens == Approx(126200).margin(200));  // both halves take ~2.42 s
    CHECK(kvtier::split_time_s(glm, one, n, n, p.k_tokens) == Approx(p.predicted_s));
  }
  SECTION("eight instances: load 1.23 s, split about 1.0 s") {
    const auto p = kvtier::split_point(glm, eight, n, n);
    CHECK(p.full_load_s == Approx(1.23).margin(0.005));
    CHECK(p.predicted_s == Approx(0.996).margin(0.005));
    CHECK(p.predicted_s / std::min(p.full_load_s, p.recompute_s) < 0.9);
  }
  SECTION("granularity: k is a multiple of it, at most a little slower than the continuous optimum") {
    const double g = 8 * 256;
    const auto p = kvtier::split_point(glm, one, n, n, g);
    CHECK(std::fmod(p.k_tokens, g) == 0);
    CHECK(p.predicted_s < 2.42 + g / glm.prefill_tokens_per_s);
  }
  SECTION("the uncached tail adds its compute") {
    const auto p = kvtier::split_point(glm, one, 150000, 200000);
    const auto q = kvtier::split_point(glm, one, 150000, 150000);
    CHECK(p.predicted_s == Approx(q.predicted_s + 50000 / 52.2e3));
  }
}

TEST_CASE("split point: edge cases", "[unit]") {
  SECTION("no hit: nothing to load, the prompt is recomputed") {
    const auto p = kvtier::split_point(glm, one, 0, 1000);
    CHECK(p.k_tokens == 0);
    CHECK(p.predicted_s == Approx(1000 / 52.2e3));
  }
  SECTION("a short prompt below R*T0: T0 alone exceeds its compute, so k = hit (recompute)") {
    const auto p = kvtier::split_point(glm, eight, 4096, 4097);
    CHECK(p.k_tokens == 4096);
    CHECK(p.predicted_s == Approx(p.recompute_s));
  }
  SECTION("a free, infinitely fast load: k = 0") {
    const auto p = kvtier::split_point(glm, {.fixed_cost_s = 0, .bandwidth_gb_per_s = 1e12}, 100000, 100001);
    CHECK(p.k_tokens == 0);
  }
  SECTION("a hit above the prompt is clamped to it") {
    const auto p = kvtier::split_point(glm, one, 5000, 3000);
    CHECK(p.recompute_s == Approx(3000 / 52.2e3));
  }
}

TEST_CASE("split point: never predicted above the better of full load and full recompute", "[property]") {
  kvtier::test::prop("split <= min(load, recompute)", [](std::uint32_t hit_k, std::uint32_t extra,
                                                         std::uint16_t t0_ms, std::uint16_t gbps_x100,
                                                         std::uint8_t gran_chunks) {
    const double hit = static_cast<double>(hit_k % 400000);
    const double prompt = hit + static_cast<double>(extra % 50000);
    const kvtier::load_path path{.fixed_cost_s = t0_ms / 1000.0,
                                 .bandwidth_gb_per_s = 0.01 + gbps_x100 / 100.0};
    const double g = 256.0 * (1 + gran_chunks % 16);
    const auto p = kvtier::split_point(glm, path, hit, prompt, g);
    RC_ASSERT(p.predicted_s <= std::min(p.full_load_s, p.recompute_s) + 1e-12);
    RC_ASSERT(p.k_tokens >= 0);
    RC_ASSERT(p.k_tokens <= hit);
    RC_ASSERT(p.k_tokens == hit || std::fmod(p.k_tokens, g) == 0);
    // The prediction is the time of the chosen k, and no multiple of g does better.
    RC_ASSERT(std::abs(kvtier::split_time_s(glm, path, hit, prompt, p.k_tokens) - p.predicted_s) < 1e-9);
    for (double k = 0; k < hit; k += std::max(g, hit / 64))
      RC_ASSERT(kvtier::split_time_s(glm, path, hit, prompt, std::floor(k / g) * g) >= p.predicted_s - 1e-9);
  });
}

TEST_CASE("single-instance rate: derived from the sustained rate and T0", "[unit]") {
  const double gb = kvtier::kv_gb(16384, 48.4e3), t0 = 0.33;
  CHECK(gb / 0.835 == Approx(0.95).margin(0.005));  // s per hit, T0 included
  CHECK(kvtier::instance_rate_gb_per_s(0.835, gb, t0) == Approx(1.27).margin(0.02));  // the midpoint
  CHECK(kvtier::instance_rate_gb_per_s(0.78, gb, t0) == Approx(1.15).margin(0.02));
  CHECK(kvtier::instance_rate_gb_per_s(0.89, gb, t0) == Approx(1.40).margin(0.02));
  // Round trip: T0 + gb / rate is the sustained hit time.
  CHECK(t0 + gb / kvtier::instance_rate_gb_per_s(0.835, gb, t0) == Approx(gb / 0.835));
  CHECK(std::isinf(kvtier::instance_rate_gb_per_s(0.835, gb, 2.0)));  // T0 longer than the whole hit
}
