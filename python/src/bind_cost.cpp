// python/src/bind_cost.cpp: the cost model (kvtier/cost_model.hpp) and kvtier-probe's fit
// (tools/probe/probe_fit.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>

#include "common.hpp"
#include "kvtier/cost_model.hpp"
#include "probe_fit.hpp"

namespace kvtier_py {

namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

void check_node(const kvtier::prefill_node& n) {
  if (!(n.kv_bytes_per_token > 0) || !(n.prefill_tokens_per_s > 0) || !std::isfinite(n.kv_bytes_per_token) ||
      !std::isfinite(n.prefill_tokens_per_s))
    raise_invalid("PrefillNode needs kv_bytes_per_token > 0 and prefill_tokens_per_s > 0 (finite), got " +
                  num(n.kv_bytes_per_token) + " and " + num(n.prefill_tokens_per_s));
}

void check_path(const kvtier::load_path& p) {
  if (!(p.bandwidth_gb_per_s > 0) || !(p.fixed_cost_s >= 0) || !std::isfinite(p.fixed_cost_s))
    raise_invalid("LoadPath needs bandwidth_gb_per_s > 0 and fixed_cost_s >= 0, got " +
                  num(p.bandwidth_gb_per_s) + " and " + num(p.fixed_cost_s));
}

// Samples from a list of `T` or of tuples `Tuple` (what `make` turns into a T); `shape` names
// the tuple in the message.
template <class T, class Tuple, class Make>
std::vector<T> samples_as(py::handle obj, const char* shape, Make make) {
  if (obj.is_none() || !py::isinstance<py::sequence>(obj))
    raise_invalid("samples must be a list, not " + type_name(obj));
  std::vector<T> out;
  for (py::handle x : py::reinterpret_borrow<py::sequence>(obj)) {
    if (py::isinstance<T>(x)) {
      out.push_back(x.cast<T>());
      continue;
    }
    try {
      out.push_back(make(x.cast<Tuple>()));
    } catch (const py::cast_error&) {
      raise_invalid(std::string("a sample must be ") + shape + ", not " + type_name(x));
    }
  }
  return out;
}

std::vector<kvtier::load_sample> samples_of(py::handle obj) {
  return samples_as<kvtier::load_sample, std::pair<double, double>>(
      obj, "kvtier.LoadSample or (gb, seconds)", [](auto t) {
        return kvtier::load_sample{t.first, t.second};
      });
}

std::vector<kvtier_probe::batch_sample> batches_of(py::handle obj) {
  return samples_as<kvtier_probe::batch_sample, std::tuple<int, double, double>>(
      obj, "kvtier.BatchSample or (batch, gb, seconds)", [](auto t) {
        return kvtier_probe::batch_sample{std::get<0>(t), std::get<1>(t), std::get<2>(t)};
      });
}

}  // namespace

void bind_cost(py::module_& m) {
  py::class_<kvtier::prefill_node>(
      m, "PrefillNode",
      "s (KV bytes per token) and R (prefill tokens/s on a miss).\n\n"
      "    node = kvtier.PrefillNode(kv_bytes_per_token=48.4e3, prefill_tokens_per_s=52.2e3)")
      .def(py::init([](double s, double r) {
             kvtier::prefill_node n{s, r};
             check_node(n);
             return n;
           }),
           py::arg("kv_bytes_per_token"), py::arg("prefill_tokens_per_s"))
      .def_readonly("kv_bytes_per_token", &kvtier::prefill_node::kv_bytes_per_token)
      .def_readonly("prefill_tokens_per_s", &kvtier::prefill_node::prefill_tokens_per_s)
      .def("__repr__", [](const kvtier::prefill_node& n) {
        return "kvtier.PrefillNode(kv_bytes_per_token=" + num(n.kv_bytes_per_token) +
               ", prefill_tokens_per_s=" + num(n.prefill_tokens_per_s) + ")";
      });
  py::class_<kvtier::load_path>(m, "LoadPath",
                                "T0 (fixed cost per hit, s) and B (decimal GB/s) of a load path.\n\n"
                                "    path = kvtier.LoadPath(fixed_cost_s=0.002, bandwidth_gb_per_s=3.0)")
      .def(py::init([](double t0, double b) {
             kvtier::load_path p{t0, b};
             check_path(p);
             return p;
           }),
           py::arg("fixed_cost_s"), py::arg("bandwidth_gb_per_s"))
      .def_readonly("fixed_cost_s", &kvtier::load_path::fixed_cost_s)
      .def_readonly("bandwidth_gb_per_s", &kvtier::load_path::bandwidth_gb_per_s)
      .def("__repr__", [](const kvtier::load_path& p) {
        return "kvtier.LoadPath(fixed_cost_s=" + num(p.fixed_cost_s) +
               ", bandwidth_gb_per_s=" + num(p.bandwidth_gb_per_s) + ")";
      });
  py::class_<kvtier::load_sample>(m, "LoadSample", "One measured load: gb decimal GB in seconds.")
      .def(py::init([](double gb, double s) {
             return kvtier::load_sample{gb, s};
           }),
           py::arg("gb"), py::arg("seconds"))
      .def_readonly("gb", &kvtier::load_sample::gb)
      .def_readonly("seconds", &kvtier::load_sample::seconds);
  py::class_<kvtier::load_decision>(m, "LoadDecision", "decide_load's verdict: load (True) or recompute.")
      .def_readonly("load", &kvtier::load_decision::load)
      .def_readonly("predicted_load_s", &kvtier::load_decision::predicted_load_s)
      .def_readonly("recompute_s", &kvtier::load_decision::recompute_s)
      .def("__repr__", [](const kvtier::load_decision& d) {
        return std::string("kvtier.LoadDecision(load=") + (d.load ? "True" : "False") +
               ", predicted_load_s=" + num(d.predicted_load_s) + ", recompute_s=" + num(d.recompute_s) + ")";
      });
  py::class_<kvtier::split_plan>(m, "SplitPlan",
                                 "split_point's plan: recompute the first k_tokens while loading the rest.")
      .def_readonly("k_tokens", &kvtier::split_plan::k_tokens)
      .def_readonly("predicted_s", &kvtier::split_plan::predicted_s)
      .def_readonly("full_load_s", &kvtier::split_plan::full_load_s)
      .def_readonly("recompute_s", &kvtier::split_plan::recompute_s)
      .def("__repr__", [](const kvtier::split_plan& p) {
        return "kvtier.SplitPlan(k_tokens=" + num(p.k_tokens) + ", predicted_s=" + num(p.predicted_s) +
               ", full_load_s=" + num(p.full_load_s) + ", recompute_s=" + num(p.recompute_s) + ")";
      });

  m.def("kv_gb", &kvtier::kv_gb, py::arg("tokens"), py::arg("kv_bytes_per_token"), "GB of KV for `tokens`.");
  m.def(
      "break_even_bandwidth_gb_per_s",
      [](const kvtier::prefill_node& n) { return kvtier::break_even_bandwidth_gb_per_s(n); }, py::arg("node"),
      "B* = s*R: the bandwidth below which loading is slower than recomputing.\n\n"
      "    kvtier.break_even_bandwidth_gb_per_s(node)  # 2.53 for 48.4 KB/token at 52.2k tokens/s");
  m.def("recompute_time_s", &kvtier::recompute_time_s, py::arg("node"), py::arg("tokens"), "tokens / R.");
  m.def("load_time_s", &kvtier::load_time_s, py::arg("path"), py::arg("gb"), "T0 + gb / B.");
  m.def("predicted_hit_time_s", &kvtier::predicted_hit_time_s, py::arg("node"), py::arg("path"),
        py::arg("tokens"), "T0 + tokens*s/B: the predicted time to load a hit of `tokens`.");
  m.def("min_profitable_tokens", &kvtier::min_profitable_tokens, py::arg("node"), py::arg("path"),
        "Shortest hit that loads faster than it recomputes (math.inf when B <= B*).");
  m.def("utilisation", &kvtier::utilisation, py::arg("arrivals_per_s"), py::arg("gb_per_request"),
        py::arg("bandwidth_gb_per_s"), "rho = arrivals * GB per request / B.");
  m.def("recompute_externality_s", &kvtier::recompute_externality_s, py::arg("work_s"),
        py::arg("utilisation"), "Queueing delay a recompute of work_s adds to others at utilisation rho.");
  m.def(
      "decide_load",
      [](const kvtier::prefill_node& n, const kvtier::load_path& p, double hit, double min_saving_s) {
        check_node(n);
        if (!(hit >= 0)) raise_invalid("hit_tokens must be >= 0");
        return kvtier::decide_load(n, p, hit, min_saving_s);
      },
      py::arg("node"), py::arg("path"), py::arg("hit_tokens"), py::arg("min_saving_s") = 0.0,
      "Load or recompute a hit of hit_tokens.\n\n    kvtier.decide_load(node, path, 16384).load  # True or "
      "False");
  m.def(
      "split_point",
      [](const kvtier::prefill_node& n, const kvtier::load_path& p, double hit, double prompt,
         double granularity) {
        check_node(n);
        check_path(p);
        return kvtier::split_point(n, p, hit, prompt, granularity);
      },
      py::arg("node"), py::arg("path"), py::arg("hit_tokens"), py::arg("prompt_tokens"),
      py::arg("granularity") = 1.0,
      "The best k: compute tokens [0, k) while loading [k, hit).\n\n"
      "    kvtier.split_point(node, path, 16384, 20000, granularity=256).k_tokens");
  m.def("fit_fixed_cost_s", &kvtier::fit_fixed_cost_s, py::arg("measured_s"), py::arg("gb"),
        py::arg("bandwidth_gb_per_s"), "T0 from one measured load at a known B.");
  m.def("instance_rate_gb_per_s", &kvtier::instance_rate_gb_per_s, py::arg("sustained_gb_per_s"),
        py::arg("gb"), py::arg("fixed_cost_s"), "An instance's rate beside T0, from a sustained rate.");
  m.def(
      "fit_load_path",
      [](py::handle samples) -> std::optional<kvtier::load_path> {
        const auto s = samples_of(samples);
        return kvtier::fit_load_path(s);
      },
      py::arg("samples"),
      "Least-squares T0 and B over (gb, seconds) samples; None when no positive slope fits.\n\n"
      "    kvtier.fit_load_path([(0.1, 0.035), (0.2, 0.068), (0.4, 0.135)])");

  py::class_<kvtier::load_estimator>(m, "LoadEstimator",
                                     "Online T0 and B from observed loads (thread-safe).\n\n"
                                     "    est = kvtier.LoadEstimator(kvtier.LoadPath(0.001, 2.0))\n"
                                     "    est.record(0.1, 0.05); est.estimate()")
      .def(py::init([](const kvtier::load_path& prior, double half_life, double spread) {
             check_path(prior);
             return std::make_unique<kvtier::load_estimator>(
                 prior, kvtier::load_estimator::options{.half_life_samples = half_life,
                                                        .min_relative_spread = spread});
           }),
           py::arg("prior"), py::arg("half_life_samples") = 64.0, py::arg("min_relative_spread") = 0.2)
      .def("record", &kvtier::load_estimator::record, py::arg("gb"), py::arg("seconds"),
           "Adds a sample; False (ignored) unless both are finite and > 0.")
      .def("record_bytes", &kvtier::load_estimator::record_bytes, py::arg("bytes"), py::arg("seconds"))
      .def("estimate", &kvtier::load_estimator::estimate)
      .def_property_readonly("samples", &kvtier::load_estimator::samples)
      .def("split", &kvtier::load_estimator::split, py::arg("node"), py::arg("hit_tokens"),
           py::arg("prompt_tokens"), py::arg("granularity") = 1.0)
      .def("decide", &kvtier::load_estimator::decide, py::arg("node"), py::arg("hit_tokens"),
           py::arg("min_saving_s") = 0.0);

  // kvtier-probe's fit.
  py::class_<kvtier_probe::batch_sample>(m, "BatchSample",
                                         "One probe batch: `batch` values, gb in all, in seconds.")
      .def(py::init([](int batch, double gb, double s) {
             return kvtier_probe::batch_sample{batch, gb, s};
           }),
           py::arg("batch"), py::arg("gb"), py::arg("seconds"))
      .def_readonly("batch", &kvtier_probe::batch_sample::batch)
      .def_readonly("gb", &kvtier_probe::batch_sample::gb)
      .def_readonly("seconds", &kvtier_probe::batch_sample::seconds);
  py::class_<kvtier_probe::size_check>(m, "SizeCheck",
                                       "Per batch size: median measured time against the fit.")
      .def_readonly("batch", &kvtier_probe::size_check::batch)
      .def_readonly("median_s", &kvtier_probe::size_check::median_s)
      .def_readonly("predicted_s", &kvtier_probe::size_check::predicted_s)
      .def_readonly("error", &kvtier_probe::size_check::error);
  py::class_<kvtier_probe::fit_report>(m, "FitReport",
                                       "kvtier-probe's fit of batch time against batch bytes.")
      .def_readonly("path", &kvtier_probe::fit_report::path)
      .def_readonly("fitted_t0_s", &kvtier_probe::fit_report::fitted_t0_s)
      .def_readonly("clamped", &kvtier_probe::fit_report::clamped)
      .def_property_readonly("t0_interval_s",
                             [](const kvtier_probe::fit_report& r) {
                               return std::make_pair(r.t0_interval_s[0], r.t0_interval_s[1]);
                             })
      .def_property_readonly("b_interval_gbps",
                             [](const kvtier_probe::fit_report& r) {
                               return std::make_pair(r.b_interval_gbps[0], r.b_interval_gbps[1]);
                             })
      .def_readonly("rms_residual_s", &kvtier_probe::fit_report::rms_residual_s)
      .def_readonly("samples", &kvtier_probe::fit_report::samples)
      .def_readonly("sizes", &kvtier_probe::fit_report::sizes)
      .def_readonly("max_abs_error", &kvtier_probe::fit_report::max_abs_error);
  m.def(
      "fit_batches",
      [](py::handle samples) {
        const auto s = batches_of(samples);
        return kvtier_probe::fit_batches(s);
      },
      py::arg("samples"),
      "kvtier-probe's fit (T0 >= 0, 95% intervals, per-size check) over (batch, gb, seconds) samples; None "
      "when no positive slope fits.\n\n"
      "    r = kvtier.fit_batches([(8, 0.099, 0.095), (4, 0.050, 0.049), (2, 0.025, 0.026)])\n"
      "    r.path.bandwidth_gb_per_s, r.b_interval_gbps");
}

}  // namespace kvtier_py
