// examples/pcp_prefill/report.hpp: summary figures of a replay, the per-request
// JSON lines, the summary table and JSON line, and the gnuplot plot.
//
//   pcp::summary s = pcp::summarize(run);
//   pcp::print_table(std::cout, {{"l2_partitioned_async", s}});
//   std::cout << pcp::summary_json(s) << "\n";   // the last line of stdout
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "json_line.hpp"

namespace pcp {

/// Linear-interpolation percentile (p in [0, 1]) of sorted values.
inline double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

struct summary {
  double ttft_p50_s = 0, ttft_p90_s = 0, ttft_p99_s = 0, ttft_mean_s = 0;
  double hit_token_fraction = 0;   ///< cached / prompt tokens: an input when the replay is fully primed
  double busy_fraction = 0;        ///< modeled compute / makespan (not a GPU-utilisation figure)
  double max_io_stall_s = 0;       ///< longest modeled wait of one step on store I/O
  double prompt_tokens_per_s = 0;  ///< completed prompt tokens / makespan
  double predicted_p50_s = 0;      ///< median of the cost model's per-request time (requests it predicted)
  double rho = 0;                  ///< offered load on the modeled L2 path (>= 1: overloaded); 0 if none
  std::uint64_t errors = 0;
  std::uint64_t failed_l2_calls = 0;
  // Shown in the table, not in the JSON line.
  std::size_t requests = 0;
  std::uint64_t failed_loads = 0;
  double makespan_s = 0;
};

inline summary summarize(const run_result& r) {
  summary s;
  std::vector<double> t;
  double prompt = 0, cached = 0, sum = 0;
  std::vector<double> pred;
  for (const auto& q : r.requests) {
    if (q.predicted_s > 0) pred.push_back(q.predicted_s);
    t.push_back(q.ttft_s);
    sum += q.ttft_s;
    prompt += static_cast<double>(q.prompt_tokens);
    cached += static_cast<double>(q.cached_tokens);
  }
  std::sort(t.begin(), t.end());
  s.requests = t.size();
  s.ttft_p50_s = percentile(t, 0.50);
  s.ttft_p90_s = percentile(t, 0.90);
  s.ttft_p99_s = percentile(t, 0.99);
  s.ttft_mean_s = t.empty() ? 0 : sum / static_cast<double>(t.size());
  s.hit_token_fraction = prompt > 0 ? cached / prompt : 0;
  s.busy_fraction = r.makespan_s > 0 ? r.busy_s / r.makespan_s : 0;
  s.max_io_stall_s = r.max_io_stall_s;
  s.prompt_tokens_per_s = r.makespan_s > 0 ? prompt / r.makespan_s : 0;
  std::sort(pred.begin(), pred.end());
  s.predicted_p50_s = percentile(pred, 0.5);
  s.failed_l2_calls = r.failed_l2_calls;
  s.errors = r.mismatched_chunks + (r.fatal.empty() ? 0 : 1);
  s.failed_loads = r.failed_loads;
  s.makespan_s = r.makespan_s;
  return s;
}

/// The replay's TTFT percentiles beside the model's: the same percentiles of every request's
/// closed-form TTFT alone (timing_model::predicted_ttft_s at this granularity: T0, B, R, the
/// interconnect, the per-layer split; no queue, no lookup, L1 hits not counted apart). A request
/// that loaded (hit, partial or mismatch) is predicted with its agreed lookup as the hit; any
/// other with the whole prompt computed. The gap between the two is what the replay adds: the
/// queue behind other requests, the busiest rank's share, the lookups.
struct ttft_beside_model {
  double ttft_p50_s = 0, ttft_p99_s = 0, predicted_p50_s = 0, predicted_p99_s = 0;
};

inline ttft_beside_model ttft_with_prediction(const run_result& r, const timing_model& tm,
                                              std::uint32_t world, load_granularity g) {
  std::vector<double> t, p;
  for (const auto& q : r.requests) {
    const bool loaded = q.status == "hit" || q.status == "partial" || q.status == "mismatch";
    t.push_back(q.ttft_s);
    p.push_back(tm.predicted_ttft_s(g, loaded ? static_cast<double>(q.lookup_tokens) : 0.0,
                                    static_cast<double>(q.prompt_tokens), world));
  }
  std::sort(t.begin(), t.end());
  std::sort(p.begin(), p.end());
  return {percentile(t, 0.5), percentile(t, 0.99), percentile(p, 0.5), percentile(p, 0.99)};
}

inline std::string ttft_beside_model_json(const ttft_beside_model& m, load_granularity g) {
  return json_object_writer()
      .field("granularity", std::string(to_string(g)))
      .field("ttft_p50_s", m.ttft_p50_s)
      .field("predicted_p50_s", m.predicted_p50_s)
      .field("ttft_p99_s", m.ttft_p99_s)
      .field("predicted_p99_s", m.predicted_p99_s)
      .str();
}

/// The JSON line's time and fraction fields, in order; `errors` (an integer) follows them.
/// One list, so the writer and the reader cannot drift apart.
inline constexpr std::pair<const char*, double summary::*> summary_fields[] = {
    {"ttft_p50_s", &summary::ttft_p50_s},
    {"ttft_p90_s", &summary::ttft_p90_s},
    {"ttft_p99_s", &summary::ttft_p99_s},
    {"ttft_mean_s", &summary::ttft_mean_s},
    {"hit_token_fraction", &summary::hit_token_fraction},
    {"busy_fraction", &summary::busy_fraction},
    {"max_io_stall_s", &summary::max_io_stall_s},
    {"prompt_tokens_per_s", &summary::prompt_tokens_per_s},
    {"predicted_p50_s", &summary::predicted_p50_s},
    {"rho", &summary::rho},
};

inline std::string summary_json(const summary& s) {
  json_object_writer w;
  for (const auto& [key, member] : summary_fields) w.field(key, s.*member);
  return w.field("errors", s.errors).field("failed_l2_calls", s.failed_l2_calls).str();
}

/// Reads a summary back from its JSON line; false if a field is missing.
inline bool parse_summary(std::string_view line, summary& s, std::string& err) {
  json_value v;
  if (!parse_json(line, v, err)) return false;
  auto num = [&](const char* k, double& out) {
    const json_value* x = v.find(k);
    if (!x || x->kind != json_value::number) {
      err = std::string("field \"") + k + "\" missing or not a number";
      return false;
    }
    out = x->num;
    return true;
  };
  for (const auto& [key, member] : summary_fields)
    if (!num(key, s.*member)) return false;
  double errors = 0;
  if (!num("errors", errors)) return false;
  s.errors = static_cast<std::uint64_t>(errors);
  double failed = 0;
  if (!num("failed_l2_calls", failed)) return false;
  s.failed_l2_calls = static_cast<std::uint64_t>(failed);
  return true;
}

inline std::string request_json(const request_result& q) {
  return json_object_writer()
      .field("id", q.id)
      .field("arrival_s", q.arrival_s)
      .field("prompt_tokens", q.prompt_tokens)
      .field("cached_tokens", q.cached_tokens)
      .field("l1_tokens", q.l1_tokens)
      .field("l2_tokens", q.l2_tokens)
      .field("queue_s", q.queue_s)
      .field("load_s", q.load_s)
      .field("split_tokens", q.split_tokens)
      .field("predicted_s", q.predicted_s)
      .field("ttft_s", q.ttft_s)
      .field("status", q.status)
      .str();
}

inline void print_table(std::ostream& os, const std::vector<std::pair<std::string, summary>>& rows) {
  char buf[320];
  std::snprintf(buf, sizeof buf, "%-28s %9s %9s %9s %9s %8s %8s %10s %7s", "config", "p50 s", "p90 s",
                "p99 s", "mean s", "hit tok", "compute", "io stall s", "errors");
  os << buf << '\n';
  for (const auto& [name, s] : rows) {
    std::snprintf(buf, sizeof buf, "%-28s %9.3f %9.3f %9.3f %9.3f %7.1f%% %7.1f%% %10.3f %7llu", name.c_str(),
                  s.ttft_p50_s, s.ttft_p90_s, s.ttft_p99_s, s.ttft_mean_s, 100 * s.hit_token_fraction,
                  100 * s.busy_fraction, s.max_io_stall_s, static_cast<unsigned long long>(s.errors));
    os << buf << '\n';
  }
}

/// Draws TTFT against arrival time (left) and the TTFT CDF (right) of one or
/// more runs with gnuplot. Returns false with a message when gnuplot fails.
inline bool plot_runs(const std::string& png,
                      const std::vector<std::pair<std::string, std::vector<request_result>>>& runs,
                      std::string& err) {
  const std::string data = png + ".dat";
  {
    std::ofstream out(data);
    if (!out) return err = "cannot write " + data, false;
    for (const auto& [name, reqs] : runs) {
      out << "# " << name << "\n";
      std::vector<double> t;
      for (const auto& q : reqs) t.push_back(q.ttft_s);
      std::vector<double> sorted = t;
      std::sort(sorted.begin(), sorted.end());
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        const double cdf = static_cast<double>(i + 1) / static_cast<double>(sorted.size());
        out << reqs[i].arrival_s << ' ' << std::max(1e-3, reqs[i].ttft_s) << ' ' << std::max(1e-3, sorted[i])
            << ' ' << cdf << '\n';
      }
      out << "\n\n";
    }
  }
  const std::string script = png + ".gp";
  {
    std::ofstream gp(script);
    if (!gp) return err = "cannot write " + script, false;
    gp << "set terminal pngcairo size 1400,560 noenhanced\n"
       << "set output '" << png << "'\n"
       << "set multiplot layout 1,2\n"
       << "set logscale y\nset grid\nset key top left\n"
       << "set xlabel 'arrival time (s, modeled)'\nset ylabel 'TTFT (s, modeled)'\n"
       << "set title 'TTFT against arrival time'\n"
       << "plot ";
    for (std::size_t k = 0; k < runs.size(); ++k)
      gp << (k ? ", " : "") << "'" << data << "' index " << k << " using 1:2 with points pt 7 ps 0.4 title '"
         << runs[k].first << "'";
    gp << "\nunset logscale y\nset logscale x\nset key bottom right\n"
       << "set xlabel 'TTFT (s, modeled)'\nset ylabel 'fraction of requests'\nset yrange [0:1]\n"
       << "set title 'TTFT CDF'\nplot ";
    for (std::size_t k = 0; k < runs.size(); ++k)
      gp << (k ? ", " : "") << "'" << data << "' index " << k << " using 3:4 with lines lw 2 title '"
         << runs[k].first << "'";
    gp << "\nunset multiplot\n";
  }
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) return err = "gnuplot failed (is it installed?) running: " + cmd, false;
  return true;
}

/// Reads the per-request JSON lines that --out wrote.
inline bool read_requests(const std::string& path, std::vector<request_result>& out, std::string& err) {
  std::ifstream in(path);
  if (!in) return err = path + ": cannot open", false;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    json_value v;
    std::string e;
    if (!parse_json(line, v, e)) return err = path + ":" + std::to_string(n) + ": " + e, false;
    request_result q;
    const json_value* a = v.find("arrival_s");
    const json_value* t = v.find("ttft_s");
    if (!a || a->kind != json_value::number)
      return err = path + ":" + std::to_string(n) + ": field \"arrival_s\" missing", false;
    if (!t || t->kind != json_value::number)
      return err = path + ":" + std::to_string(n) + ": field \"ttft_s\" missing", false;
    q.arrival_s = a->num;
    q.ttft_s = t->num;
    out.push_back(q);
  }
  return true;
}

}  // namespace pcp
