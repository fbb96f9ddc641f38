// kvtier-probe's fit: least squares over several batch sizes, T0 never negative, intervals and
// per-size checks that say how far the fit can be trusted.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "probe_fit.hpp"

using kvtier_probe::batch_ladder;
using kvtier_probe::batch_sample;
using kvtier_probe::fit_batches;

namespace {
constexpr double chunk_gb = 0.0124;  // one 12.4 MB chunk

// `reps` batches of each size with time t0 + gb / b, plus a deterministic +-jitter.
std::vector<batch_sample> line(double t0, double b, std::vector<int> sizes, int reps, double jitter) {
  std::vector<batch_sample> v;
  for (int k : sizes)
    for (int i = 0; i < reps; ++i) {
      const double gb = chunk_gb * k;
      v.push_back({k, gb, t0 + gb / b + ((i % 2) ? jitter : -jitter)});
    }
  return v;
}
}  // namespace

TEST_CASE("probe fit: a straight line is recovered with a tight interval", "[unit]") {
  const auto f = fit_batches(line(0.005, 1.0, {8, 4, 2, 1}, 6, 1e-4));
  REQUIRE(f);
  CHECK_FALSE(f->clamped);
  CHECK(f->path.fixed_cost_s == Approx(0.005).margin(2e-4));
  CHECK(f->path.bandwidth_gb_per_s == Approx(1.0).epsilon(0.01));
  CHECK(f->t0_interval_s[0] < 0.005);
  CHECK(f->t0_interval_s[1] > 0.005);
  CHECK(f->b_interval_gbps[0] < 1.0);
  CHECK(f->b_interval_gbps[1] > 1.0);
  CHECK(f->samples == 24u);
  REQUIRE(f->sizes.size() == 4u);
  CHECK(f->sizes[0].batch == 8);
  CHECK(f->max_abs_error < 0.01);
  CHECK(f->rms_residual_s == Approx(1e-4).epsilon(0.05));
}

TEST_CASE("probe fit: a negative least-squares T0 is clamped to 0 and said so", "[unit]") {
  // The review's case: small batches a little faster than a line through the large ones, as
  // with a fixed cost near 0 (two-point fits gave T0 = -3.8 ms from 8 and 4).
  std::vector<batch_sample> s;
  for (int i = 0; i < 5; ++i) {
    s.push_back({8, 8 * chunk_gb, 0.1190});
    s.push_back({4, 4 * chunk_gb, 0.0605});
    s.push_back({2, 2 * chunk_gb, 0.0290});
    s.push_back({1, 1 * chunk_gb, 0.0135});
  }
  const auto f = fit_batches(s);
  REQUIRE(f);
  CHECK(f->fitted_t0_s < 0);
  CHECK(f->clamped);
  CHECK(f->path.fixed_cost_s == 0.0);
  CHECK(f->t0_interval_s[0] == 0.0);
  CHECK(f->t0_interval_s[0] <= f->t0_interval_s[1]);
  // Through the origin: B from sum(x*y) / sum(x*x), near 0.83 GB/s here.
  CHECK(f->path.bandwidth_gb_per_s == Approx(0.83).epsilon(0.03));
}

TEST_CASE("probe fit: a tier that is not linear in batch bytes shows it", "[unit]") {
  // Flat for small batches, then a jump: no line fits every size within 10%.
  std::vector<batch_sample> s;
  for (int i = 0; i < 4; ++i) {
    s.push_back({8, 8 * chunk_gb, 0.200});
    s.push_back({4, 4 * chunk_gb, 0.020});
    s.push_back({2, 2 * chunk_gb, 0.019});
    s.push_back({1, 1 * chunk_gb, 0.018});
  }
  const auto f = fit_batches(s);
  REQUIRE(f);
  CHECK(f->max_abs_error > 0.1);
}

TEST_CASE("probe fit: no fit from too few batches or without a positive slope", "[unit]") {
  CHECK_FALSE(fit_batches(line(0.005, 1.0, {2, 1}, 1, 0)));      // two samples
  CHECK_FALSE(fit_batches(line(0.005, 1.0, {4}, 5, 1e-4)));      // one size
  CHECK_FALSE(fit_batches(line(0.005, -1.0, {4, 2, 1}, 3, 0)));  // faster with more bytes
}

TEST_CASE("probe fit: the batch-size ladder", "[unit]") {
  CHECK(batch_ladder(8) == std::vector<int>{8, 4, 2, 1});
  CHECK(batch_ladder(1) == std::vector<int>{2, 1});
  CHECK(batch_ladder(2) == std::vector<int>{2, 1});
  CHECK(batch_ladder(3) == std::vector<int>{3, 1});
  CHECK(batch_ladder(64) == std::vector<int>{64, 32, 16, 8, 1});
}
