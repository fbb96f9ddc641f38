// examples/pcp_prefill/commands.hpp: pcp_prefill's commands besides the replay:
// gen-trace (write a generated stream), table (replays side by side, beside the
// reference's published figures, with the ratios and targets, and one JSON line),
// plot, fit-t0 and instance-gbps (the cost model's calibrations).
//
//   pcp_prefill table recompute=out/recompute.txt l2_partitioned_async=out/async.txt
//   pcp_prefill fit-t0 --measured-s 0.40 --tokens 16384 --gbps 10.76      # prints T0 in ms
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "kvtier/cost_model.hpp"
#include "report.hpp"
#include "trace.hpp"

namespace pcp::cli {

// T0 from the cost model's one-point fit: a measured hit time at a known bandwidth.
inline int run_fit_t0(int argc, char** argv) {
  double measured = 0.40, tokens = 16384, gbps = 10.76, s = 48.4e3;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw usage_error(a + ": missing value");
    const std::string v = argv[++i];
    if (a == "--measured-s")
      measured = parse_double(a, v, 0, 1e6);
    else if (a == "--tokens")
      tokens = parse_double(a, v, 1, 1e9);
    else if (a == "--gbps")
      gbps = parse_double(a, v, 1e-6, 1e6);
    else if (a == "--bytes-per-token")
      s = parse_double(a, v, 1, 1e9);
    else
      throw usage_error("fit-t0: unknown option '" + a + "'");
  }
  const double t0 = kvtier::fit_fixed_cost_s(measured, kvtier::kv_gb(tokens, s), gbps);
  std::printf("%.1f\n", t0 * 1e3);  // milliseconds, for --l2-model-t0-ms (a calibration, not a prediction)
  return 0;
}

inline int run_gen_trace(int argc, char** argv) {
  options o;
  std::string out, kind;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(a + ": missing value");
      return argv[++i];
    };
    if (a == "--kind")
      kind = val();
    else if (stream_flag(o, a, val))
      continue;
    else if (a == "--out")
      out = val();
    else
      throw usage_error("gen-trace: unknown option '" + a + "'");
  }
  const pcp::trace_spec spec = generated_spec(kind, o);
  if (out.empty()) throw usage_error("gen-trace: --out FILE is required");
  std::ofstream f(out);
  if (!f) throw usage_error("gen-trace: cannot write " + out);
  pcp::write_trace(f, pcp::generate_trace(spec));
  return f ? 0 : 1;
}

// An instance's rate beside a separate T0, from the rate it sustained per hit.
inline int run_instance_gbps(int argc, char** argv) {
  double sustained = 0, t0_ms = -1, tokens = 16384, s = 48.4e3;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw usage_error(a + ": missing value");
    const std::string v = argv[++i];
    if (a == "--sustained-gbps")
      sustained = parse_double(a, v, 1e-6, 1e6);
    else if (a == "--t0-ms")
      t0_ms = parse_double(a, v, 0, 1e7);
    else if (a == "--tokens")
      tokens = parse_double(a, v, 1, 1e9);
    else if (a == "--bytes-per-token")
      s = parse_double(a, v, 1, 1e9);
    else
      throw usage_error("instance-gbps: unknown option '" + a + "'");
  }
  if (!(sustained > 0) || t0_ms < 0)
    throw usage_error("instance-gbps: --sustained-gbps and --t0-ms are required");
  const double r = kvtier::instance_rate_gb_per_s(sustained, kvtier::kv_gb(tokens, s), t0_ms / 1e3);
  if (!std::isfinite(r)) throw usage_error("instance-gbps: T0 is longer than a whole hit at that rate");
  std::printf("%.4f\n", r);
  return 0;
}

inline bool last_line(const std::string& path, std::string& line) {
  std::ifstream in(path);
  std::string l;
  bool any = false;
  while (std::getline(in, l))
    if (!l.empty()) line = l, any = true;
  return any;
}

// The reference's published hit-heavy figures, where its text gives them.
struct ref_row {
  const char* p99;
  const char* note;
};
inline const std::map<std::string, ref_row> reference = {
    {"recompute", {"-", "cold run: a 16k prompt recomputes in 0.31 s"}},
    {"l1", {"-", "L1 hit slightly faster than recompute"}},
    {"l2_single_sync", {"83.32", "p50 52.30 s (3.52 s at the start)"}},
    {"l2_single_async", {"-", ""}},
    {"l2_partitioned_sync", {"-", "rho ~ 0.09"}},
    {"l2_partitioned_async", {"0.67", "124x below single sync"}},
    {"l2_partitioned_async_policy", {"-", ""}},
};

/// Reads the summary on the last line of a replay's output.
inline pcp::summary read_summary(const std::string& file) {
  std::string line, err;
  if (!last_line(file, line)) throw usage_error("table: " + file + ": empty or unreadable");
  pcp::summary s;
  if (!pcp::parse_summary(line, s, err)) throw usage_error("table: " + file + ": last line: " + err);
  return s;
}

inline int run_table(int argc, char** argv) {
  std::vector<std::pair<std::string, pcp::summary>> rows;
  std::vector<std::pair<std::string, std::vector<double>>> repeats;  // NAME -> p99 of each run
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("repeat:", 0) == 0) {  // repeat:NAME=FILE,FILE,...
      const auto eq = a.find('=');
      if (eq == std::string::npos || eq == 7)
        throw usage_error("table: expected repeat:NAME=FILE,FILE,..., got '" + a + "'");
      std::vector<double> p99;
      std::string files = a.substr(eq + 1);
      for (std::size_t at = 0; at <= files.size();) {
        const auto comma = std::min(files.find(',', at), files.size());
        p99.push_back(read_summary(files.substr(at, comma - at)).ttft_p99_s);
        at = comma + 1;
      }
      std::sort(p99.begin(), p99.end());
      repeats.emplace_back(a.substr(7, eq - 7), std::move(p99));
      continue;
    }
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) throw usage_error("table: expected NAME=FILE, got '" + a + "'");
    rows.emplace_back(a.substr(0, eq), read_summary(a.substr(eq + 1)));
  }
  pcp::print_table(std::cout, rows);
  std::cout
      << "(hit tok: cached / prompt tokens; after priming with the whole trace it is an input, set by the\n"
         " chunking: mean of floor((n-1)/256)*256/n. compute: modeled compute / makespan, not the GPU\n"
         " utilisation the reference sampled, so it is not shown beside its 7%.)\n";
  char buf[320];
  bool any_ref = false;
  for (const auto& [name, s] : rows) {
    auto it = reference.find(name);
    if (it == reference.end()) continue;
    if (!any_ref) std::cout << "\nreference (hit-heavy subset, 98.5% of prompt tokens from L2):\n";
    any_ref = true;
    std::snprintf(buf, sizeof buf, "  %-28s measured p50 %8.3f p99 %8.3f s   reference p99 %6s s   %s",
                  name.c_str(), s.ttft_p50_s, s.ttft_p99_s, it->second.p99, it->second.note);
    std::cout << buf << "\n";
  }
  auto find = [&](const char* n) -> const pcp::summary* {
    for (const auto& [name, s] : rows)
      if (name == n) return &s;
    return nullptr;
  };
  const auto* pa = find("l2_partitioned_async");
  const auto* pp = find("l2_partitioned_async_policy");
  const auto* rc = find("recompute");
  std::cout << "\nratios:\n";
  for (const auto& [name, s] : rows) {  // l2_single_sync and its sensitivity rows
    if (name.rfind("l2_single_sync", 0) != 0 || !pa || !(pa->ttft_p99_s > 0)) continue;
    const double ratio = s.ttft_p99_s / pa->ttft_p99_s;
    if (name == "l2_single_sync")
      std::snprintf(
          buf, sizeof buf,
          "  p99 %s / l2_partitioned_async = %.1fx (reference 83.32 / 0.67 = 124x; target >= 60x)%s",
          name.c_str(), ratio,
          s.rho >= 1 ? "; rho >= 1 as in the reference: it grows with the trace length" : "");
    else if (s.rho >= 1)
      std::snprintf(
          buf, sizeof buf,
          "  p99 %s / l2_partitioned_async = %.1fx  UNSTABLE (rho = %.2f >= 1: no steady state; the "
          "ratio grows with the trace length; no target)",
          name.c_str(), ratio, s.rho);
    else
      std::snprintf(buf, sizeof buf,
                    "  p99 %s / l2_partitioned_async = %.1fx (rho = %.2f; sensitivity, no target)",
                    name.c_str(), ratio, s.rho);
    std::cout << buf << "\n";
  }
  if (pa && rc && rc->ttft_p99_s > 0) {
    std::snprintf(buf, sizeof buf, "  p99 l2_partitioned_async / recompute = %.3f (target <= 1.3)",
                  pa->ttft_p99_s / rc->ttft_p99_s);
    std::cout << buf << "\n";
  }
  if (pp && rc && rc->ttft_p99_s > 0) {
    std::snprintf(
        buf, sizeof buf,
        "  p99 l2_partitioned_async_policy / recompute = %.3f (target <= 1.05); modeled compute %.1f%% "
        "of the makespan vs recompute %.1f%%",
        pp->ttft_p99_s / rc->ttft_p99_s, 100 * pp->busy_fraction, 100 * rc->busy_fraction);
    std::cout << buf << "\n";
  }
  // The long stream: split against the better of load and recompute, and the model beside it.
  bool long_header = false;
  for (const char* inst : {"1", "8"}) {
    const auto* sp = find((std::string("long_split_") + inst).c_str());
    const auto* ld = find((std::string("long_load_") + inst).c_str());
    const auto* lr = find("long_recompute");
    if (!sp || !ld || !lr) continue;
    if (!long_header) std::cout << "\nlong stream (64k-200k tokens, slow arrivals), p50:\n";
    long_header = true;
    const double better = std::min(ld->ttft_p50_s, lr->ttft_p50_s);
    std::snprintf(
        buf, sizeof buf,
        "  %s instance(s): split %.3f s (model %.3f s) vs load %.3f s (model %.3f s), recompute %.3f s: "
        "split / better = %.3f (target <= %s)",
        inst, sp->ttft_p50_s, sp->predicted_p50_s, ld->ttft_p50_s, ld->predicted_p50_s, lr->ttft_p50_s,
        better > 0 ? sp->ttft_p50_s / better : 0.0, std::string(inst) == "1" ? "0.8" : "0.9");
    std::cout << buf << "\n";
  }
  // Closed-loop saturated throughput.
  for (const char* prefix : {"", "mixed_"}) {
    const auto* tr = find((std::string(prefix) + "throughput_recompute").c_str());
    const auto* ta = find((std::string(prefix) + "throughput_partitioned_async").c_str());
    if (!tr || !ta || !(tr->prompt_tokens_per_s > 0)) continue;
    std::snprintf(
        buf, sizeof buf,
        "%s  saturated throughput (%s stream): partitioned async %.0f vs recompute %.0f prompt tokens/s = "
        "%.2fx%s (reference: the sharded store +14-34%%)",
        *prefix ? "" : "\n", *prefix ? "mixed, about half cached" : "hit-heavy", ta->prompt_tokens_per_s,
        tr->prompt_tokens_per_s, ta->prompt_tokens_per_s / tr->prompt_tokens_per_s,
        *prefix ? "" : " (target >= 1.14)");
    std::cout << buf << "\n";
  }
  if (!repeats.empty())
    std::cout << "\nrepeated runs (p99 min / median / max, target: within +-10% of the median):\n";
  for (const auto& [name, p] : repeats) {
    const double med = p[p.size() / 2];
    std::snprintf(buf, sizeof buf, "  %-28s %zu runs: %.3f / %.3f / %.3f s (spread %+.1f%% / %+.1f%%)",
                  name.c_str(), p.size(), p.front(), med, p.back(),
                  med > 0 ? 100 * (p.front() / med - 1) : 0.0, med > 0 ? 100 * (p.back() / med - 1) : 0.0);
    std::cout << buf << "\n";
  }
  std::string json = "{\"configs\": {";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    if (k) json += ", ";
    pcp::append_json_string(json, rows[k].first);
    json += ": " + pcp::summary_json(rows[k].second);
  }
  json += "}";
  if (!repeats.empty()) {
    json += ", \"repeat\": {";
    for (std::size_t k = 0; k < repeats.size(); ++k) {
      const auto& p = repeats[k].second;
      if (k) json += ", ";
      pcp::append_json_string(json, repeats[k].first);
      json += ": " + pcp::json_object_writer()
                         .field("runs", static_cast<std::uint64_t>(p.size()))
                         .field("p99_min_s", p.front())
                         .field("p99_median_s", p[p.size() / 2])
                         .field("p99_max_s", p.back())
                         .str();
    }
    json += "}";
  }
  std::cout << json << "}" << std::endl;
  return 0;
}

inline int run_plot(int argc, char** argv) {
  if (argc < 4) throw usage_error("plot: expected OUT.png NAME=REQUESTS_FILE ...");
  std::vector<std::pair<std::string, std::vector<pcp::request_result>>> runs;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) throw usage_error("plot: expected NAME=FILE, got '" + a + "'");
    std::vector<pcp::request_result> reqs;
    std::string err;
    if (!pcp::read_requests(a.substr(eq + 1), reqs, err)) throw usage_error("plot: " + err);
    runs.emplace_back(a.substr(0, eq), std::move(reqs));
  }
  std::string err;
  if (!pcp::plot_runs(argv[2], runs, err)) {
    std::cerr << "pcp_prefill: " << err << "\n";
    return 1;
  }
  std::cout << "plot: " << argv[2] << "\n";
  return 0;
}

}  // namespace pcp::cli
