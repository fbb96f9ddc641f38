// Cost model: the reference's figures, the edge cases of each formula, the fits
// and the online estimator.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "kvtier/cost_model.hpp"

namespace {
// GLM-5.3 FP8 on one B300 node, as measured in the reference.
constexpr kvtier::prefill_node glm{.kv_bytes_per_token = 48.4e3, .prefill_tokens_per_s = 52.2e3};
constexpr double prompt_gb = 0.79;  // median 16k-token prompt
constexpr double fast_gb_per_s = 10.76, one_instance_gb_per_s = 1.71;
}  // namespace

TEST_CASE("cost model: the reference's figures", "[unit]") {
  SECTION("break-even bandwidth B* = s R ~= 2.53 GB/s") {
    CHECK(kvtier::break_even_bandwidth_gb_per_s(glm) == Approx(2.53).margin(0.005));
    CHECK(kvtier::break_even_bandwidth_gb_per_s(48.4e3, 52.2e3) == Approx(2.52648));
    CHECK(one_instance_gb_per_s < kvtier::break_even_bandwidth_gb_per_s(glm));  // every hit loses
  }
  SECTION("a 16k-token prompt is 0.79 GB") {
    CHECK(kvtier::kv_gb(16384, glm.kv_bytes_per_token) == Approx(0.793).margin(0.001));
  }
  const double t0 = kvtier::fit_fixed_cost_s(0.40, prompt_gb, fast_gb_per_s);
  SECTION("T0 = 0.40 - 0.79 / 10.76 ~= 0.33 s") { CHECK(t0 == Approx(0.33).margin(0.005)); }
  SECTION("a 16k-token hit at 1.71 GB/s is predicted at ~0.79 s") {
    const kvtier::load_path one{.fixed_cost_s = t0, .bandwidth_gb_per_s = one_instance_gb_per_s};
    CHECK(kvtier::load_time_s(one, prompt_gb) == Approx(0.79).margin(0.005));
    CHECK(kvtier::predicted_hit_time_s(glm, one, 16384) == Approx(0.79).margin(0.005));
    // ...while recomputing it takes 0.31 s: load loses.
    CHECK(kvtier::recompute_time_s(glm, 16384) == Approx(0.31).margin(0.005));
    CHECK_FALSE(kvtier::decide_load(glm, one, 16384).load);
  }
  SECTION("R T0 ~= 17k tokens: the floor below which no bandwidth helps") {
    CHECK(glm.prefill_tokens_per_s * t0 == Approx(17000).margin(100));
    const kvtier::load_path infinite{.fixed_cost_s = t0, .bandwidth_gb_per_s = 1e12};
    CHECK(kvtier::min_profitable_tokens(glm, infinite) ==
          Approx(glm.prefill_tokens_per_s * t0).epsilon(1e-4));
  }
  SECTION("rho ~= 1.1 at 1.21 requests/s, 0.79 GB, 0.85 GB/s; ~= 0.09 at 10.76 GB/s") {
    CHECK(kvtier::utilisation(1.21, prompt_gb, 0.85) == Approx(1.1).margin(0.03));
    CHECK(kvtier::utilisation(1.21, prompt_gb, 0.85) > 1.0);
    CHECK(kvtier::utilisation(1.21, prompt_gb, fast_gb_per_s) == Approx(0.09).margin(0.005));
  }
}

TEST_CASE("cost model: minimum profitable prompt length", "[unit]") {
  const double inf = std::numeric_limits<double>::infinity();
  SECTION("infinite at or below B*") {
    CHECK(kvtier::min_profitable_tokens(glm, {.fixed_cost_s = 0.33, .bandwidth_gb_per_s = 1.71}) == inf);
    const double b_star = kvtier::break_even_bandwidth_gb_per_s(glm);
    CHECK(kvtier::min_profitable_tokens(glm, {.fixed_cost_s = 0.33, .bandwidth_gb_per_s = b_star}) == inf);
    CHECK(kvtier::min_profitable_tokens(glm, {.fixed_cost_s = 0, .bandwidth_gb_per_s = 0}) == inf);
  }
  SECTION("zero without a fixed cost above B*") {
    CHECK(kvtier::min_profitable_tokens(glm, {.fixed_cost_s = 0, .bandwidth_gb_per_s = 3}) == 0);
  }
  SECTION("the threshold separates loads that pay from loads that do not") {
    const kvtier::load_path fast{.fixed_cost_s = 0.33, .bandwidth_gb_per_s = fast_gb_per_s};
    const double n_min = kvtier::min_profitable_tokens(glm, fast);
    CHECK(n_min == Approx(22500).margin(100));  // above R T0 = 17k because B is finite
    CHECK(kvtier::predicted_hit_time_s(glm, fast, n_min) == Approx(kvtier::recompute_time_s(glm, n_min)));
    CHECK_FALSE(kvtier::decide_load(glm, fast, n_min * 0.95).load);
    CHECK(kvtier::decide_load(glm, fast, n_min * 1.05).load);
  }
}

TEST_CASE("cost model: load-or-recompute decision", "[unit]") {
  const kvtier::load_path fast{.fixed_cost_s = 0.33, .bandwidth_gb_per_s = fast_gb_per_s};
  const auto d = kvtier::decide_load(glm, fast, 100000);
  CHECK(d.load);
  CHECK(d.recompute_s == Approx(100000 / 52.2e3));
  CHECK(d.predicted_load_s == Approx(0.33 + 100000 * 48.4e3 / 10.76e9));
  // A required saving larger than the gain turns it into a recompute.
  CHECK_FALSE(kvtier::decide_load(glm, fast, 100000, d.recompute_s - d.predicted_load_s + 0.01).load);
  // Nothing to load: never pay T0.
  CHECK_FALSE(kvtier::decide_load(glm, {.fixed_cost_s = 0, .bandwidth_gb_per_s = 100}, 0).load);
}

TEST_CASE("cost model: the delay a recompute imposes on the queue behind it", "[unit]") {
  CHECK(kvtier::recompute_externality_s(0.314, 0.0) == 0.0);
  CHECK(kvtier::recompute_externality_s(0.314, 0.5) == Approx(0.314));
  CHECK(kvtier::recompute_externality_s(0.314, 0.38) == Approx(0.314 * 0.38 / 0.62));
  CHECK(std::isinf(kvtier::recompute_externality_s(0.314, 1.0)));
  CHECK(std::isinf(kvtier::recompute_externality_s(0.314, 1.7)));
  // A 16k-token hit over 8 instances: 0.40 s to load against 0.31 s to recompute. On an idle
  // engine recomputing wins; at the hit-heavy stream's rho ~ 0.38 the load wins once the
  // delay recomputing imposes on later requests is counted.
  const kvtier::load_path eight{.fixed_cost_s = 0.326, .bandwidth_gb_per_s = fast_gb_per_s};
  const double n = 16384, own = kvtier::recompute_time_s(glm, n);
  CHECK_FALSE(kvtier::decide_load(glm, eight, n).load);
  CHECK(kvtier::decide_load(glm, eight, n, -kvtier::recompute_externality_s(own, 0.38)).load);
}

TEST_CASE("cost model: least-squares fit of (T0, B)", "[unit]") {
  SECTION("recovers an exact line") {
    std::vector<kvtier::load_sample> pts;
    for (double gb : {0.1, 0.4, 0.79, 1.5, 3.0}) pts.push_back({gb, 0.33 + gb / 10.76});
    const auto fit = kvtier::fit_load_path(pts);
    REQUIRE(fit);
    CHECK(fit->fixed_cost_s == Approx(0.33).epsilon(1e-9));
    CHECK(fit->bandwidth_gb_per_s == Approx(10.76).epsilon(1e-9));
  }
  SECTION("two points suffice") {
    const std::vector<kvtier::load_sample> pts{{0.79, 0.79}, {1.58, 0.79 + 0.79 / 1.71}};
    const auto fit = kvtier::fit_load_path(pts);
    REQUIRE(fit);
    CHECK(fit->bandwidth_gb_per_s == Approx(1.71));
    CHECK(fit->fixed_cost_s == Approx(0.79 - 0.79 / 1.71));
  }
  SECTION("noisy points land near the truth") {
    std::vector<kvtier::load_sample> pts;
    for (int i = 0; i < 40; ++i) {
      const double gb = 0.2 + 0.05 * i;
      pts.push_back({gb, 0.33 + gb / 10.76 + ((i % 3) - 1) * 0.002});
    }
    const auto fit = kvtier::fit_load_path(pts);
    REQUIRE(fit);
    CHECK(fit->fixed_cost_s == Approx(0.33).margin(0.005));
    CHECK(fit->bandwidth_gb_per_s == Approx(10.76).epsilon(0.05));
  }
  SECTION("degenerate inputs give no fit") {
    CHECK_FALSE(kvtier::fit_load_path({}));
    const std::vector<kvtier::load_sample> one{{0.79, 0.4}};
    CHECK_FALSE(kvtier::fit_load_path(one));
    const std::vector<kvtier::load_sample> same_size{{0.79, 0.4}, {0.79, 0.5}, {0.79, 0.45}};
    CHECK_FALSE(kvtier::fit_load_path(same_size));
    const std::vector<kvtier::load_sample> falling{{0.5, 0.9}, {1.0, 0.4}};  // bigger loads faster
    CHECK_FALSE(kvtier::fit_load_path(falling));
  }
}

TEST_CASE("cost model: online estimator", "[unit][tsan]") {
  const kvtier::load_path prior{.fixed_cost_s = 0.1, .bandwidth_gb_per_s = 10.76};

  SECTION("the prior until the first sample; bad samples are ignored") {
    kvtier::load_estimator est(prior);
    CHECK(est.estimate().fixed_cost_s == prior.fixed_cost_s);
    CHECK(est.estimate().bandwidth_gb_per_s == prior.bandwidth_gb_per_s);
    CHECK_FALSE(est.record(0, 0.4));
    CHECK_FALSE(est.record(0.79, -1));
    CHECK_FALSE(est.record(std::nan(""), 0.4));
    CHECK_FALSE(est.record(0.79, std::numeric_limits<double>::infinity()));
    CHECK(est.samples() == 0);
  }
  SECTION("same-size loads refit T0 at the known bandwidth (the one-point fit)") {
    kvtier::load_estimator est(prior);
    REQUIRE(est.record(0.79, 0.40));
    CHECK(est.estimate().fixed_cost_s == Approx(kvtier::fit_fixed_cost_s(0.40, 0.79, 10.76)));
    CHECK(est.estimate().bandwidth_gb_per_s == 10.76);
    for (int i = 0; i < 10; ++i) est.record_bytes(790'000'000, 0.40);
    CHECK(est.samples() == 11);
    CHECK(est.estimate().fixed_cost_s == Approx(0.33).margin(0.005));
  }
  SECTION("spread sizes fit both T0 and B, and follow a slower store") {
    kvtier::load_estimator est(prior, {.half_life_samples = 16, .min_relative_spread = 0.2});
    for (int i = 0; i < 64; ++i) {
      const double gb = 0.2 + 0.1 * (i % 10);
      est.record(gb, 0.33 + gb / 10.76);
    }
    CHECK(est.estimate().fixed_cost_s == Approx(0.33).margin(0.01));
    CHECK(est.estimate().bandwidth_gb_per_s == Approx(10.76).epsilon(0.02));
    CHECK(est.decide(glm, 100000).load);
    for (int i = 0; i < 400; ++i) {  // the store degrades to one instance
      const double gb = 0.2 + 0.1 * (i % 10);
      est.record(gb, 0.33 + gb / 1.71);
    }
    CHECK(est.estimate().bandwidth_gb_per_s == Approx(1.71).epsilon(0.02));
    CHECK_FALSE(est.decide(glm, 100000).load);  // below B*: recompute at any length
  }
  SECTION("T0 never goes negative") {
    kvtier::load_estimator est(prior);
    est.record(0.79, 0.01);  // faster than the bandwidth allows
    CHECK(est.estimate().fixed_cost_s == 0);
  }
  SECTION("thread-safe: concurrent record() and decide()") {
    kvtier::load_estimator est(prior);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&est, t] {
        for (int i = 0; i < 2000; ++i) {
          const double gb = 0.2 + 0.1 * ((i + t) % 10);
          est.record(gb, 0.33 + gb / 10.76);
          (void)est.decide(glm, 20000);
        }
      });
    for (auto& th : threads) th.join();
    CHECK(est.samples() == 8000);
    CHECK(est.estimate().bandwidth_gb_per_s == Approx(10.76).epsilon(0.02));
  }
}

TEST_CASE("cost model: the estimator's reset forgets every sample", "[unit]") {
  const kvtier::load_path prior{.fixed_cost_s = 0.01, .bandwidth_gb_per_s = 2.0};
  kvtier::load_estimator est(prior);
  for (int i = 0; i < 8; ++i) est.record(0.1 + 0.05 * i, 5.0);  // a tier far slower than the prior
  REQUIRE(est.samples() == 8);
  REQUIRE(est.estimate().fixed_cost_s > prior.fixed_cost_s);
  est.reset();  // the connector's won probe: what was learnt while slow no longer holds
  CHECK(est.samples() == 0);
  CHECK(est.estimate().fixed_cost_s == prior.fixed_cost_s);
  CHECK(est.estimate().bandwidth_gb_per_s == prior.bandwidth_gb_per_s);
  est.record(0.2, 0.11);  // and it learns again from the prior, not from the old moments
  CHECK(est.estimate().fixed_cost_s == Approx(0.11 - 0.2 / 2.0));
}
