// kvtier/cost_model.hpp: when does loading a cached prefix beat recomputing it?
//
// Pure arithmetic, no I/O. Units are in the names: bandwidths in decimal GB/s
// (1 GB = 1e9 bytes), times in seconds, sizes in tokens, bytes or decimal GB.
//
//   s  = KV bytes per token (all layers)       R  = prefill tokens/s on a miss
//   B  = load bandwidth, GB/s                  T0 = fixed cost of one hit, s
//
//   recompute n tokens:  n / R
//   load n tokens:       T0 + n*s / B                     (predicted hit time)
//   break-even B*:       s * R        (below it no hit pays off, at any n)
//   pays off iff         n > T0 / (1/R - s/B)             (infinite when B <= s*R)
//   sync queue load:     rho = lambda * n*s / B           (rho >= 1: no steady state)
//   split at k:          max(k/R, T0 + (h-k)*s/B) + (n-h)/R   (compute the front while loading the back)
//
// With s = 48.4 KB/token and R = 52.2k tokens/s, B* = 2.53 GB/s; with T0 = 0.33 s
// no prompt below R*T0 = 17k tokens gains from a hit at any bandwidth.
//
//   kvtier::prefill_node node{.kv_bytes_per_token = 48.4e3, .prefill_tokens_per_s = 52.2e3};
//   kvtier::load_estimator est(kvtier::load_path{.fixed_cost_s = 0.33, .bandwidth_gb_per_s = 1.71});
//   if (est.decide(node, hit_tokens).load) { ... load, then est.record_bytes(bytes, seconds) ... }
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>

namespace kvtier {

/// Bytes in one decimal gigabyte: every "gb" here is 1e9 bytes.
inline constexpr double bytes_per_gb = 1e9;

/// What the node does on a miss.
struct prefill_node {
  double kv_bytes_per_token = 0;    ///< s: KV bytes per token over all layers (GLM-5.3 FP8: 48.4e3)
  double prefill_tokens_per_s = 0;  ///< R: prefill speed on a miss (one B300 node: 52.2e3)
};

/// How a hit loads.
struct load_path {
  double fixed_cost_s = 0;        ///< T0: per-hit cost that does not grow with size
  double bandwidth_gb_per_s = 0;  ///< B: decimal GB/s
};

/// One measured load: `gb` decimal GB arrived in `seconds`.
struct load_sample {
  double gb = 0;
  double seconds = 0;
};

/// KV size of `tokens` tokens in decimal GB. kv_gb(16384, 48.4e3) ~= 0.79.
constexpr double kv_gb(double tokens, double kv_bytes_per_token) noexcept {
  return tokens * kv_bytes_per_token / bytes_per_gb;
}

/// B* = s * R in decimal GB/s. break_even_bandwidth_gb_per_s(48.4e3, 52.2e3) ~= 2.53.
constexpr double break_even_bandwidth_gb_per_s(double kv_bytes_per_token,
                                               double prefill_tokens_per_s) noexcept {
  return kv_bytes_per_token * prefill_tokens_per_s / bytes_per_gb;
}
constexpr double break_even_bandwidth_gb_per_s(const prefill_node& node) noexcept {
  return break_even_bandwidth_gb_per_s(node.kv_bytes_per_token, node.prefill_tokens_per_s);
}

/// n / R: seconds to recompute `tokens` tokens.
constexpr double recompute_time_s(const prefill_node& node, double tokens) noexcept {
  return tokens / node.prefill_tokens_per_s;
}

/// T0 + gb / B: seconds to load `gb` decimal GB. load_time_s({0.33, 1.71}, 0.79) ~= 0.79.
constexpr double load_time_s(const load_path& path, double gb) noexcept {
  return path.fixed_cost_s + gb / path.bandwidth_gb_per_s;
}

/// T0 + n*s / B: predicted seconds for a hit of `tokens` tokens.
constexpr double predicted_hit_time_s(const prefill_node& node, const load_path& path,
                                      double tokens) noexcept {
  return load_time_s(path, kv_gb(tokens, node.kv_bytes_per_token));
}

/// The prompt length a hit must exceed to pay off: T0 / (1/R - s/B) tokens;
/// +infinity when B <= s*R (no length pays off). At B -> infinity it tends to
/// R*T0, the floor below which recomputing wins at any bandwidth.
inline double min_profitable_tokens(const prefill_node& node, const load_path& path) noexcept {
  const double bytes_per_s = path.bandwidth_gb_per_s * bytes_per_gb;
  if (!(bytes_per_s > node.kv_bytes_per_token * node.prefill_tokens_per_s))
    return std::numeric_limits<double>::infinity();
  return path.fixed_cost_s / (1.0 / node.prefill_tokens_per_s - node.kv_bytes_per_token / bytes_per_s);
}

/// rho = lambda * n*s / B for synchronous loads, which stall the whole engine
/// step: the engine is a single-server queue. rho >= 1 means latency grows
/// without bound. utilisation(1.21, 0.79, 0.85) ~= 1.1.
constexpr double utilisation(double arrivals_per_s, double gb_per_request,
                             double bandwidth_gb_per_s) noexcept {
  return arrivals_per_s * gb_per_request / bandwidth_gb_per_s;
}

/// The queueing delay that recomputing `work_s` seconds of prefill imposes on the
/// requests behind it, in an engine whose offered utilisation (were every request
/// recomputed) is `utilisation`: work_s * rho / (1 - rho). Adding x seconds of work
/// stretches the busy period by x / (1 - rho), and about lambda * x / (1 - rho)
/// requests arrive in the stretch, each delayed by x: for a job of typical size
/// (lambda * x ~ rho) that totals x * rho / (1 - rho). +infinity at rho >= 1, where
/// the queue has no steady state. A loaded prefix adds no compute, so this is the
/// capacity value of a hit that a per-request latency comparison misses:
///
///   // rho = 0.38 (1.21 req/s of 16k-token prompts at R = 52.2k tokens/s):
///   recompute_externality_s(0.314, 0.38) ~= 0.19   // 0.31 s own + 0.19 s imposed on others
constexpr double recompute_externality_s(double work_s, double utilisation) noexcept {
  if (!(utilisation < 1.0)) return std::numeric_limits<double>::infinity();
  return utilisation > 0 ? work_s * utilisation / (1.0 - utilisation) : 0.0;
}

/// The load-or-recompute decision for one request's cached prefix.
struct load_decision {
  bool load = false;            ///< true: load the prefix; false: recompute it
  double predicted_load_s = 0;  ///< T0 + n*s/B
  double recompute_s = 0;       ///< n/R
};

/// Load iff the predicted load beats recomputing by more than `min_saving_s`.
/// A prefix of zero tokens is never loaded (nothing to gain, T0 to pay).
constexpr load_decision decide_load(const prefill_node& node, const load_path& path, double hit_tokens,
                                    double min_saving_s = 0) noexcept {
  load_decision d;
  d.predicted_load_s = predicted_hit_time_s(node, path, hit_tokens);
  d.recompute_s = recompute_time_s(node, hit_tokens);
  d.load = hit_tokens > 0 && d.recompute_s - d.predicted_load_s > min_saving_s;
  return d;
}

/// T0 from one measured point at a known bandwidth: seconds - gb / B.
/// fit_fixed_cost_s(0.40, 0.79, 10.76) ~= 0.33.
constexpr double fit_fixed_cost_s(double measured_s, double gb, double bandwidth_gb_per_s) noexcept {
  return measured_s - gb / bandwidth_gb_per_s;
}

/// An instance's serving rate from what it sustained under load: a hit of `gb`
/// occupied the engine gb / sustained seconds in all, T0 included, so the rate
/// the model uses beside a separate T0 is gb / (gb / sustained - T0). Returns
/// +infinity when T0 covers the whole hit time (no finite rate fits).
/// instance_rate_gb_per_s(0.835, 0.79, 0.33) ~= 1.28 (0.95 s per hit).
constexpr double instance_rate_gb_per_s(double sustained_gb_per_s, double gb, double fixed_cost_s) noexcept {
  const double serve_s = gb / sustained_gb_per_s - fixed_cost_s;
  return serve_s > 0 ? gb / serve_s : std::numeric_limits<double>::infinity();
}

/// Split plan for a request whose agreed hit is `hit` of its `prompt` tokens:
/// compute tokens [0, k) while loading [k, hit), then compute [hit, prompt).
struct split_plan {
  double k_tokens = 0;     ///< 0: full load; == hit: full recompute
  double predicted_s = 0;  ///< max(k/R, T0 + (hit-k)*s/B) + (prompt-hit)/R (no T0 when k == hit)
  double full_load_s = 0;  ///< the same at k = 0
  double recompute_s = 0;  ///< prompt / R
};

/// Predicted time of the split at `k` tokens (0 <= k <= hit <= prompt).
constexpr double split_time_s(const prefill_node& node, const load_path& path, double hit, double prompt,
                              double k) noexcept {
  const double front = k / node.prefill_tokens_per_s;
  const double load = k < hit ? load_time_s(path, kv_gb(hit - k, node.kv_bytes_per_token)) : 0.0;
  return std::max(front, load) + (prompt - hit) / node.prefill_tokens_per_s;
}

/// The split point that minimises split_time_s over k in {0, g, 2g, ..., hit}
/// (g = `granularity` tokens, e.g. the chunks of one round of owners; the hit
/// itself is always a candidate). The continuous optimum balances the halves,
/// k/R = T0 + (hit - k)*s/B; the piecewise-linear time is minimised at one of
/// the two multiples of g around it, at 0 or at hit. Never predicts more than
/// the better of full load and full recompute, since both are candidates.
/// The reference's 200k-token hit at 1.71 GB/s, T0 = 0.33 s: recompute 3.83 s,
/// load 5.99 s, split about 2.42 s at k ~= 126k tokens.
inline split_plan split_point(const prefill_node& node, const load_path& path, double hit, double prompt,
                              double granularity = 1) noexcept {
  split_plan p;
  hit = std::clamp(hit, 0.0, std::max(0.0, prompt));
  p.full_load_s = split_time_s(node, path, hit, prompt, 0);
  p.recompute_s = split_time_s(node, path, hit, prompt, hit);
  p.k_tokens = p.full_load_s <= p.recompute_s ? 0.0 : hit;
  p.predicted_s = std::min(p.full_load_s, p.recompute_s);
  const double per_token =
      1.0 / node.prefill_tokens_per_s + node.kv_bytes_per_token / (path.bandwidth_gb_per_s * bytes_per_gb);
  if (!(hit > 0) || !(per_token > 0) || !std::isfinite(per_token)) return p;
  const double star =
      (path.fixed_cost_s + kv_gb(hit, node.kv_bytes_per_token) / path.bandwidth_gb_per_s) / per_token;
  const double g = granularity >= 1 ? granularity : 1.0;
  for (double k : {std::floor(star / g) * g, std::ceil(star / g) * g}) {
    if (!(k > 0) || !(k < hit)) continue;
    const double t = split_time_s(node, path, hit, prompt, k);
    if (t < p.predicted_s) p.predicted_s = t, p.k_tokens = k;
  }
  return p;
}

namespace detail {

/// Weighted first and second moments of (gb, seconds) samples.
struct load_moments {
  double w = 0, x = 0, y = 0, xx = 0, xy = 0;

  void add(double gb, double seconds, double weight = 1) noexcept {
    w += weight, x += weight * gb, y += weight * seconds;
    xx += weight * gb * gb, xy += weight * gb * seconds;
  }
  void scale(double f) noexcept { w *= f, x *= f, y *= f, xx *= f, xy *= f; }

  /// Least squares seconds = T0 + gb * (1/B). Empty when the sizes do not
  /// spread by at least `min_relative_spread` (weighted standard deviation over
  /// mean) or when the slope is not positive (no finite bandwidth fits).
  std::optional<load_path> fit(double min_relative_spread) const noexcept {
    if (!(w > 0)) return std::nullopt;
    const double mx = x / w, my = y / w;
    const double var = xx / w - mx * mx;
    const double cov = xy / w - mx * my;
    // The floor keeps rounding noise in var (all sizes equal) from passing as spread.
    const double spread = std::max(min_relative_spread, 1e-6) * std::abs(mx);
    if (!(var > 0) || !(std::sqrt(var) > spread)) return std::nullopt;
    const double slope = cov / var;  // seconds per GB
    if (!(slope > 0) || !std::isfinite(slope)) return std::nullopt;
    return load_path{.fixed_cost_s = my - slope * mx, .bandwidth_gb_per_s = 1.0 / slope};
  }
};

}  // namespace detail

/// (T0, B) by least squares from two or more samples of different sizes.
/// Empty when fewer than two distinct sizes are given or the fitted slope is not
/// positive. T0 is returned as fitted (it may come out slightly negative on noisy
/// data; load_estimator clamps it at 0).
inline std::optional<load_path> fit_load_path(std::span<const load_sample> samples) noexcept {
  detail::load_moments m;
  for (const load_sample& s : samples) m.add(s.gb, s.seconds);
  return m.fit(0.0);
}

/// Online (T0, B) estimate fed with measured loads; what an engine's cost policy
/// asks before each load. Thread-safe: record() and estimate() may be called
/// from any threads (one mutex, held for a few arithmetic operations).
///
/// Samples decay exponentially (weight halves every `half_life_samples` newer
/// samples), so the estimate follows a store that gets slower or faster. When
/// the recent sizes spread enough, T0 and B come from least squares; otherwise
/// (prompts of similar length) B stays at its last fitted value, the prior at
/// first, and T0 is refitted from the weighted mean point, as the one-point fit
/// does. T0 is never negative.
///
///   kvtier::load_estimator est({.fixed_cost_s = 0.3, .bandwidth_gb_per_s = 2.0});
///   est.record_bytes(793'000'000, 0.81);              // after each measured load
///   bool load = est.decide(node, hit_tokens).load;     // before each load
class load_estimator {
 public:
  struct options {
    double half_life_samples = 64;     ///< > 0: a sample's weight halves after this many newer ones
    double min_relative_spread = 0.2;  ///< size spread (stddev / mean) needed to refit B
  };

  explicit load_estimator(load_path prior) : load_estimator(prior, options{}) {}
  load_estimator(load_path prior, options opt) : opt_(opt), prior_(prior), current_(prior) {
    decay_ = opt_.half_life_samples > 0 ? std::exp2(-1.0 / opt_.half_life_samples) : 0.0;
  }

  load_estimator(const load_estimator&) = delete;
  load_estimator& operator=(const load_estimator&) = delete;

  /// Adds one measured load. Ignores (and returns false for) a sample that is
  /// not finite or not positive.
  bool record(double gb, double seconds) noexcept {
    if (!(gb > 0) || !(seconds > 0) || !std::isfinite(gb) || !std::isfinite(seconds)) return false;
    std::lock_guard lock(mu_);
    moments_.scale(decay_);
    moments_.add(gb, seconds);
    ++samples_;
    if (auto fitted = moments_.fit(opt_.min_relative_spread); fitted && fitted->fixed_cost_s >= 0) {
      current_ = *fitted;
    } else {
      const double mean_gb = moments_.x / moments_.w, mean_s = moments_.y / moments_.w;
      current_.fixed_cost_s = std::max(0.0, fit_fixed_cost_s(mean_s, mean_gb, current_.bandwidth_gb_per_s));
    }
    return true;
  }
  bool record_bytes(std::uint64_t bytes, double seconds) noexcept {
    return record(static_cast<double>(bytes) / bytes_per_gb, seconds);
  }

  /// Forgets every sample: the estimate is the prior again (the path changed, e.g. a server
  /// that was slow is back).
  void reset() noexcept {
    std::lock_guard lock(mu_);
    moments_ = {}, current_ = prior_, samples_ = 0;
  }

  /// The current (T0, B); the prior until the first sample.
  load_path estimate() const noexcept {
    std::lock_guard lock(mu_);
    return current_;
  }
  std::uint64_t samples() const noexcept {
    std::lock_guard lock(mu_);
    return samples_;
  }

  /// split_point() with the current estimate.
  split_plan split(const prefill_node& node, double hit_tokens, double prompt_tokens,
                   double granularity = 1) const noexcept {
    return split_point(node, estimate(), hit_tokens, prompt_tokens, granularity);
  }

  /// decide_load() with the current estimate.
  load_decision decide(const prefill_node& node, double hit_tokens, double min_saving_s = 0) const noexcept {
    return decide_load(node, estimate(), hit_tokens, min_saving_s);
  }

 private:
  options opt_;
  double decay_ = 1;
  mutable std::mutex mu_;
  detail::load_moments moments_;
  load_path prior_;
  load_path current_;
  std::uint64_t samples_ = 0;
};

}  // namespace kvtier
