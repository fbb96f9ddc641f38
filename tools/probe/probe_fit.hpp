// tools/probe/probe_fit.hpp: kvtier-probe's fit of batch time against batch bytes, with how far
// to trust it.
//
// T0 and B come from least squares over every measured batch of several sizes
// (kvtier::fit_load_path). A fitted T0 below 0 is noise around a fixed cost too small to
// resolve: it is clamped to 0 and B refitted through the origin, and the report says so. The
// report carries a 95% interval for T0 and B (from the regression's standard errors) and, per
// batch size, the median measured time against the fit's prediction, so a reader sees whether a
// straight line describes the tier at all.
//
//   std::vector<kvtier_probe::batch_sample> s = {{8, 0.099, 0.095}, {4, 0.050, 0.049}, ...};
//   if (auto f = kvtier_probe::fit_batches(s)) use(f->path.fixed_cost_s, f->b_interval_gbps);
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "kvtier/cost_model.hpp"
#include "probe_stats.hpp"

namespace kvtier_probe {

/// One measured batch: `batch` values of `gb` decimal GB in all, read in `seconds`.
struct batch_sample {
  int batch = 0;
  double gb = 0;
  double seconds = 0;
};

/// Per batch size: the median measured time and what the fit predicts for it.
struct size_check {
  int batch = 0;
  double median_s = 0;
  double predicted_s = 0;
  double error = 0;  ///< (predicted - median) / median
};

struct fit_report {
  kvtier::load_path path;              ///< T0 >= 0 always
  double fitted_t0_s = 0;              ///< T0 as least squares gave it (may be < 0)
  bool clamped = false;                ///< fitted T0 < 0: T0 = 0, B refitted through the origin
  double t0_interval_s[2] = {0, 0};    ///< 95% interval of T0, clamped at 0
  double b_interval_gbps[2] = {0, 0};  ///< 95% interval of B (upper may be +inf)
  double rms_residual_s = 0;           ///< root mean square of measured - predicted, all samples
  std::size_t samples = 0;
  std::vector<size_check> sizes;  ///< in the order the sizes first appear
  double max_abs_error = 0;       ///< largest |error| over the sizes
};

namespace detail {
// Two-sided 95% Student t quantile for `df` degrees of freedom (table, then 1.96 + 2.5/df).
inline double t95(std::size_t df) {
  constexpr double table[] = {12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23};
  if (df == 0) return std::numeric_limits<double>::infinity();
  if (df <= 10) return table[df - 1];
  return 1.96 + 2.5 / static_cast<double>(df);
}
}  // namespace detail

/// The fit over `samples` (at least three samples and two distinct sizes); empty when no
/// positive slope fits (latency did not grow with the batch).
inline std::optional<fit_report> fit_batches(std::span<const batch_sample> samples) {
  std::vector<kvtier::load_sample> pts;
  for (const batch_sample& s : samples) pts.push_back({s.gb, s.seconds});
  const std::optional<kvtier::load_path> ls = kvtier::fit_load_path(pts);
  const std::size_t n = pts.size();
  if (!ls || n < 3) return std::nullopt;

  fit_report r;
  r.samples = n;
  r.fitted_t0_s = ls->fixed_cost_s;
  double mx = 0, sxx0 = 0, sxy0 = 0;  // sxx0, sxy0: about the origin
  for (const auto& p : pts) mx += p.gb, sxx0 += p.gb * p.gb, sxy0 += p.gb * p.seconds;
  mx /= static_cast<double>(n);
  double sxx = 0;  // about the mean
  for (const auto& p : pts) sxx += (p.gb - mx) * (p.gb - mx);
  const double slope = 1.0 / ls->bandwidth_gb_per_s;

  // Standard errors of the unconstrained fit.
  double ssr = 0;
  for (const auto& p : pts) {
    const double e = p.seconds - (ls->fixed_cost_s + slope * p.gb);
    ssr += e * e;
  }
  const double sigma = std::sqrt(ssr / static_cast<double>(n - 2));
  const double t = detail::t95(n - 2);
  const double se_t0 = sigma * std::sqrt(1.0 / static_cast<double>(n) + mx * mx / sxx);
  double se_slope = sigma / std::sqrt(sxx);
  double fit_slope = slope;

  if (ls->fixed_cost_s < 0) {  // through the origin: seconds = gb / B
    r.clamped = true;
    fit_slope = sxy0 / sxx0;
    double ssr0 = 0;
    for (const auto& p : pts) ssr0 += (p.seconds - fit_slope * p.gb) * (p.seconds - fit_slope * p.gb);
    se_slope = std::sqrt(ssr0 / static_cast<double>(n - 1)) / std::sqrt(sxx0);
    r.path = {.fixed_cost_s = 0.0, .bandwidth_gb_per_s = 1.0 / fit_slope};
  } else {
    r.path = *ls;
  }
  r.t0_interval_s[0] = std::max(0.0, ls->fixed_cost_s - t * se_t0);
  r.t0_interval_s[1] = std::max(0.0, ls->fixed_cost_s + t * se_t0);
  const double t_b = detail::t95(r.clamped ? n - 1 : n - 2);
  r.b_interval_gbps[0] = 1.0 / (fit_slope + t_b * se_slope);
  r.b_interval_gbps[1] = fit_slope - t_b * se_slope > 0 ? 1.0 / (fit_slope - t_b * se_slope)
                                                        : std::numeric_limits<double>::infinity();

  double ss = 0;
  for (const auto& p : pts) {
    const double e = p.seconds - kvtier::load_time_s(r.path, p.gb);
    ss += e * e;
  }
  r.rms_residual_s = std::sqrt(ss / static_cast<double>(n));

  for (const batch_sample& s : samples) {
    if (std::any_of(r.sizes.begin(), r.sizes.end(), [&](const size_check& c) { return c.batch == s.batch; }))
      continue;
    std::vector<double> times;
    double gb = 0;
    for (const batch_sample& o : samples)
      if (o.batch == s.batch) times.push_back(o.seconds), gb = o.gb;
    size_check c{.batch = s.batch, .median_s = percentile(times, 0.5)};
    c.predicted_s = kvtier::load_time_s(r.path, gb);
    c.error = c.median_s > 0 ? (c.predicted_s - c.median_s) / c.median_s : 0.0;
    r.max_abs_error = std::max(r.max_abs_error, std::abs(c.error));
    r.sizes.push_back(c);
  }
  return r;
}

/// Batch sizes the probe measures for --batch K: K, K/2, K/4, ... down to 1 (at most five, the
/// last always 1); K = 1 measures 2 and 1.
inline std::vector<int> batch_ladder(int k) {
  if (k <= 1) return {2, 1};
  std::vector<int> v;
  for (int b = k; b >= 1; b /= 2) v.push_back(b);
  if (v.size() > 5) v.erase(v.begin() + 4, v.end() - 1);
  return v;
}

}  // namespace kvtier_probe
