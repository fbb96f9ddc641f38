// kvtier-probe: measures a deployment's RESP tier (Redis/Valkey instances, one per rank) and says
// whether remote KV hits pay off on it. See probe_options.hpp for the flags, or run with --help.
//
//   kvtier-probe --url 'resp://valkey-{rank}:6379' --instances 8 --chunk-bytes 12400000 --batch 8
//                --rounds 20 --timeout-ms 2000 --bytes-per-token 48400 --prefill-tokens-per-s 52200
//
// Exit status: 0 measured, 1 an instance failed (message names it), 2 bad flags, 130 interrupted.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/resp/url.hpp"
#include "probe_fit.hpp"
#include "probe_io.hpp"
#include "probe_options.hpp"
#include "probe_stats.hpp"

namespace kp = kvtier_probe;

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

using kvtier_probe::percentile;

std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else
      out += c;
  }
  return out;
}

std::string num(double v, int digits = 4) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

/// Deterministic bytes for one value, different for every (prefix, instance, key).
void fill_value(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t x = seed | 1;
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
}

/// Progress on stderr: rewritten in place on a terminal, one line per phase otherwise.
class progress {
 public:
  progress() : tty_(::isatty(2) != 0) {}
  void phase(const std::string& text) {
    std::lock_guard lock(mu_);
    if (tty_)
      std::fprintf(stderr, "\r\033[K%s", text.c_str());
    else
      std::fprintf(stderr, "%s\n", text.c_str());
    last_ = std::chrono::steady_clock::now();
  }
  // Frequent updates: only on a terminal, at most 10 per second.
  void tick(const std::string& text) {
    if (!tty_) return;
    std::lock_guard lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
  }
  void done() {
    if (tty_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool tty_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};
};

/// Everything one instance's thread owns.
struct instance {
  int rank = 0;
  kvtier::resp::endpoint ep;
  std::unique_ptr<kp::instance_client> client;
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> expected;
  std::vector<std::vector<std::byte>> dst;
  bool wrote = false;                          // SET was attempted: clean up here
  kvtier::deadline dl{};                       // deadline of the latest call (of the failing one, on failure)
  std::vector<std::vector<double>> latency_s;  // per batch size of the ladder ([0]: K)
  std::string failure;                         // first failure, names what happened
};

std::string describe(const instance& in) {
  return "instance " + std::to_string(in.rank) + " (" + in.ep.describe() + ")";
}

// `limit` says what the deadline was, for a timeout: "--timeout-ms 2000".
std::string what_failed(const std::string& doing, std::error_code ec, const std::string& detail,
                        const std::string& limit) {
  std::string m = doing + ": " + ec.message();
  if (ec == kvtier::errc::timeout) m += " (no answer within " + limit + ")";
  if (!detail.empty()) m += ": " + detail;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  kp::probe_options opt;
  if (std::string err = kp::parse_probe_options(argc, argv, opt); !err.empty()) {
    std::fprintf(stderr, "kvtier-probe: %s\n\n%.*s", err.c_str(), static_cast<int>(kp::probe_usage.size()),
                 kp::probe_usage.data());
    return 2;
  }
  if (opt.help) {
    std::printf("%.*s", static_cast<int>(kp::probe_usage.size()), kp::probe_usage.data());
    return 0;
  }
  if (!kp::transport_available(opt.transport)) {
    std::fprintf(stderr, "kvtier-probe: --transport %s is not available in this build (liburing missing)\n",
                 opt.transport.c_str());
    return 2;
  }

  // ---- instances and keys ----------------------------------------------------------------
  const kvtier::resp::tls_options tls{
      .ca_file = opt.tls_ca, .cert_file = opt.tls_cert, .key_file = opt.tls_key};
  const auto timeout = std::chrono::milliseconds(opt.timeout_ms);
  // A cluster: its masters are the instances, each probed through keys whose hash tag lands in a
  // slot that master serves; first every one of the 16384 slots must have a master.
  const bool cluster = kvtier::resp::is_cluster_url(opt.url);
  std::vector<std::string> tags;
  std::size_t slots_served = 0;
  std::vector<instance> inst;
  if (cluster) {
    auto u = kvtier::resp::parse_cluster_url(opt.url);
    if (!u) {
      std::fprintf(stderr, "kvtier-probe: --url: %s\n", u.message.c_str());
      return 2;
    }
    // The password may come from --password-file or KVTIER_PASSWORD instead of argv.
    for (auto& seed : u.seeds) {
      if (std::string err = kvtier::resp::apply_password(seed, {.file = opt.password_file}); !err.empty()) {
        std::fprintf(stderr, "kvtier-probe: --url %s: %s\n", kvtier::resp::redact_url(opt.url).c_str(),
                     err.c_str());
        return 2;
      }
    }
    kvtier::resp::slot_map map;
    std::string why;
    if (kp::load_slot_map(u.seeds, timeout, tls, map, why)) {
      std::fprintf(stderr, "kvtier-probe: no slot map from the seed nodes: %s\n", why.c_str());
      return 1;
    }
    slots_served = map.covered();
    if (slots_served != kvtier::resp::cluster_slot_count) {
      std::size_t first = 0;
      while (map.owner(static_cast<std::uint16_t>(first)) != kvtier::resp::slot_map::no_node) ++first;
      std::fprintf(
          stderr,
          "kvtier-probe: the cluster serves %zu of 16384 slots (slot %zu and %zu more have no master); "
          "keys there would always miss\n",
          slots_served, first, kvtier::resp::cluster_slot_count - slots_served - 1);
      return 1;
    }
    opt.instances = static_cast<int>(map.nodes().size());
    inst.resize(map.nodes().size());
    tags.resize(map.nodes().size());
    for (std::size_t r = 0; r < map.nodes().size(); ++r) {
      inst[r].rank = static_cast<int>(r);
      inst[r].ep = u.seeds.front();
      inst[r].ep.host = map.nodes()[r].host;
      inst[r].ep.port = map.nodes()[r].port;
      for (int t = 0; tags[r].empty() && t < 1'000'000; ++t) {
        const std::string tag = "n" + std::to_string(t);
        if (map.owner(kvtier::resp::hash_slot(tag)) == r) tags[r] = tag;
      }
    }
  } else {
    inst.resize(static_cast<std::size_t>(opt.instances));
    for (int r = 0; r < opt.instances; ++r) {
      auto parsed = kvtier::resp::parse_url(opt.url, r);
      if (!parsed) {
        std::fprintf(stderr, "kvtier-probe: --url for instance %d: %s\n", r, parsed.message.c_str());
        return 2;
      }
      // The password may come from --password-file or KVTIER_PASSWORD instead of argv.
      if (std::string err = kvtier::resp::apply_password(parsed.value, {.file = opt.password_file});
          !err.empty()) {
        std::fprintf(stderr, "kvtier-probe: --url %s: %s\n", kvtier::resp::redact_url(opt.url).c_str(),
                     err.c_str());
        return 2;
      }
      inst[static_cast<std::size_t>(r)].rank = r;
      inst[static_cast<std::size_t>(r)].ep = parsed.value;
    }
  }
  const char* const unit = cluster ? "master" : "instance";
  for (std::size_t r = 1; r < inst.size(); ++r) {
    if (inst[r].ep.describe() == inst[0].ep.describe()) {
      std::fprintf(
          stderr,
          "kvtier-probe: warning: instances 0 and %zu are the same server (%s); without {rank} in --url "
          "the figures are %d clients on one instance, not a tier of %d\n",
          r, inst[0].ep.describe().c_str(), opt.instances, opt.instances);
      break;
    }
  }
  std::random_device rd;
  const std::uint64_t nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char prefix_buf[64];
  std::snprintf(prefix_buf, sizeof prefix_buf,
                "kvtier-probe:%016llx:", static_cast<unsigned long long>(nonce));
  const std::string prefix = prefix_buf;
  // Batch sizes for the fit: K, K/2, ... 1 (K = 1: 2 and 1), so the key count is max(K, 2).
  const std::vector<int> ladder = kp::batch_ladder(opt.batch);
  const int k_main = opt.batch;
  const int nkeys = *std::max_element(ladder.begin(), ladder.end());
  std::string ladder_text;
  for (int b : ladder) ladder_text += (ladder_text.empty() ? "" : ", ") + std::to_string(b);
  const std::uint64_t ttl_ms = 3'600'000;

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESETHAND;  // a second Ctrl-C ends the process at once (keys still expire)
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  progress prog;
  std::atomic<bool> stop{false};
  const int total_rounds = static_cast<int>(ladder.size()) * opt.rounds;
  const std::string limit = "--timeout-ms " + std::to_string(opt.timeout_ms);
  // All instances start each round together, so a round's aggregate is what a PCP load sees:
  // every rank fetches its own batch and the load ends with the slowest one.
  std::barrier round_start(opt.instances);
  // round_latency[round * instances + rank]: main rounds only (they give the aggregate).
  std::vector<double> round_latency(static_cast<std::size_t>(opt.rounds) * inst.size(), 0.0);

  prog.phase("kvtier-probe: connecting to " + std::to_string(opt.instances) + " instance(s), writing " +
             std::to_string(nkeys) + " x " + std::to_string(opt.chunk_bytes) + " bytes each under " + prefix);
  auto body = [&](instance& in) {
    auto fail = [&](std::string m) {
      in.failure = describe(in) + ": " + std::move(m);
      stop.store(true);
    };
    auto next_deadline = [&] { return in.dl = kvtier::deadline_after(timeout); };
    in.latency_s.assign(ladder.size(), {});
    in.client = kp::make_instance_client(opt.transport, in.ep, timeout, tls);
    std::error_code ec = in.client->connect(next_deadline());
    if (ec) return fail(what_failed("connect and PING", ec, in.client->detail(), limit));
    if (stop.load() || g_interrupted.load()) return;
    for (int k = 0; k < nkeys; ++k)
      in.keys.push_back(prefix + (cluster ? "{" + tags[static_cast<std::size_t>(in.rank)] + "}" : "") +
                        std::to_string(in.rank) + ":" + std::to_string(k));
    // A random 64-bit prefix practically never exists; checking makes "never touches other keys" exact.
    std::size_t present = 0;
    ec = in.client->exists(in.keys, present, next_deadline());
    if (ec) return fail(what_failed("EXISTS", ec, in.client->detail(), limit));
    if (present != 0)
      return fail("probe keys under " + prefix + " already exist; run again for a new prefix");
    in.expected.assign(static_cast<std::size_t>(nkeys), std::vector<std::byte>(opt.chunk_bytes));
    in.dst.assign(static_cast<std::size_t>(nkeys), std::vector<std::byte>(opt.chunk_bytes));
    for (int k = 0; k < nkeys; ++k)
      fill_value(in.expected[static_cast<std::size_t>(k)],
                 nonce * 0x9E3779B97F4A7C15ull + in.rank * 1000003ull + k);
    if (stop.load() || g_interrupted.load()) return;
    in.wrote = true;
    std::vector<std::span<const std::byte>> values(in.expected.begin(), in.expected.end());
    ec = in.client->set(in.keys, values, ttl_ms, next_deadline());
    if (ec) return fail(what_failed("SET", ec, in.client->detail(), limit));

    std::vector<kp::get_outcome> outcome(static_cast<std::size_t>(nkeys));
    for (int round = 0; round < total_rounds; ++round) {
      round_start.arrive_and_wait();
      if (stop.load() || g_interrupted.load()) return;
      const auto phase = static_cast<std::size_t>(round / opt.rounds);
      const auto k = static_cast<std::size_t>(ladder[phase]);
      // Rotate through the keys so smaller batches do not always read the same ones.
      std::vector<std::string> keys(k);
      std::vector<std::span<std::byte>> dst(k);
      std::vector<std::size_t> which(k);
      for (std::size_t i = 0; i < k; ++i) {
        which[i] = (static_cast<std::size_t>(round) * k + i) % in.keys.size();
        keys[i] = in.keys[which[i]];
        dst[i] = in.dst[which[i]];
      }
      for (auto& d : dst) std::memset(d.data(), 0, d.size());
      const auto t0 = std::chrono::steady_clock::now();
      ec = in.client->get(keys, dst, std::span(outcome).first(k), next_deadline());
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (ec) return fail(what_failed("GET batch of " + std::to_string(k), ec, in.client->detail(), limit));
      for (std::size_t i = 0; i < k; ++i) {
        if (outcome[i] != kp::get_outcome::ok)
          return fail("GET " + keys[i] + ": " + std::string(kp::to_string(outcome[i])) +
                      " (the server lost or changed a value the probe just wrote)");
        if (std::memcmp(dst[i].data(), in.expected[which[i]].data(), dst[i].size()) != 0)
          return fail("GET " + keys[i] + " returned different bytes than were written");
      }
      in.latency_s[phase].push_back(secs);
      if (phase == 0)
        round_latency[static_cast<std::size_t>(round) * inst.size() + static_cast<std::size_t>(in.rank)] =
            secs;
      if (in.rank == 0)
        prog.tick("kvtier-probe: round " + std::to_string(round + 1) + "/" + std::to_string(total_rounds));
    }
  };
  std::vector<std::thread> threads;
  for (auto& in : inst) {
    threads.emplace_back([&, p = &in] {
      body(*p);
      // A thread that leaves early must not hold the others at the barrier.
      std::size_t done = 0;
      for (const auto& l : p->latency_s) done += l.size();
      if (done < static_cast<std::size_t>(total_rounds)) round_start.arrive_and_drop();
    });
  }
  for (auto& t : threads) t.join();

  // ---- cleanup, also after a failure or Ctrl-C -------------------------------------------------
  // After a failure the run ends by the failing call's deadline: the cleanup gets what is left of
  // it, but at least a short grace (a tenth of --timeout-ms, at most 200 ms) so the keys on the
  // healthy instances still get deleted (the keys of a dead one expire within 1 h). Otherwise
  // (Ctrl-C) it gets a full --timeout-ms.
  const auto grace = std::min<kvtier::clock::duration>(timeout / 10, std::chrono::milliseconds(200));
  kvtier::deadline cleanup_dl = kvtier::deadline_after(timeout);
  std::string cleanup_limit = limit;
  for (const auto& in : inst) {
    if (in.failure.empty()) continue;
    cleanup_dl = std::min(cleanup_dl, std::max(in.dl, kvtier::deadline_after(grace)));
    cleanup_limit = "the time left after the failure";
  }
  if (std::any_of(inst.begin(), inst.end(), [](const instance& i) { return i.wrote; }))
    prog.phase("kvtier-probe: deleting the probe's keys");
  std::vector<std::thread> cleaners;
  std::vector<std::string> cleanup_errors(inst.size());
  for (auto& in : inst) {
    if (!in.wrote) continue;
    cleaners.emplace_back([&, p = &in] {
      instance& i = *p;
      std::error_code ec;
      if (!i.failure.empty()) {  // its connection may be dead: start a fresh one
        i.client = kp::make_instance_client(opt.transport, i.ep, timeout, tls);
        ec = i.client->connect(cleanup_dl);
      }
      if (!ec) ec = i.client->del(i.keys, cleanup_dl);
      if (ec)
        cleanup_errors[static_cast<std::size_t>(i.rank)] =
            describe(i) + ": " +
            what_failed("DEL of the probe's keys", ec, i.client->detail(), cleanup_limit) +
            " (they expire within 1 h)";
    });
  }
  for (auto& t : cleaners) t.join();
  prog.done();

  // Failures: messages on stderr; with --json also one object on stdout, as its last line.
  std::vector<std::string> errors;
  for (auto& in : inst)
    if (!in.failure.empty()) errors.push_back(in.failure);
  bool cleaned = true;
  for (auto& e : cleanup_errors)
    if (!e.empty()) errors.push_back(e), cleaned = false;
  for (auto& e : errors) std::fprintf(stderr, "kvtier-probe: %s\n", e.c_str());
  const bool failed =
      std::any_of(inst.begin(), inst.end(), [](const instance& i) { return !i.failure.empty(); });
  const bool interrupted = !failed && g_interrupted.load();
  if (interrupted)
    std::fprintf(stderr, "kvtier-probe: interrupted; %s\n",
                 cleaned ? "the probe's keys were deleted" : "some probe keys remain until they expire");
  if (failed || interrupted) {
    if (opt.json) {
      std::string js = "{\"tool\":\"kvtier-probe\",\"ok\":false,\"interrupted\":";
      js += interrupted ? "true" : "false";
      js += ",\"errors\":[";
      for (std::size_t i = 0; i < errors.size(); ++i)
        js += (i ? ",\"" : "\"") + json_escape(errors[i]) + "\"";
      std::printf("%s]}\n", js.c_str());
    }
    return interrupted ? 130 : 1;
  }

  // ---- results ---------------------------------------------------------------------------
  const double chunk_gb = static_cast<double>(opt.chunk_bytes) / kvtier::bytes_per_gb;
  const double batch_gb = chunk_gb * k_main;
  std::vector<double> per_inst_gbps;
  std::vector<kp::batch_sample> samples;
  for (auto& in : inst) {
    per_inst_gbps.push_back(batch_gb / percentile(in.latency_s[0], 0.5));
    for (std::size_t ph = 0; ph < ladder.size(); ++ph)
      for (double s : in.latency_s[ph]) samples.push_back({ladder[ph], chunk_gb * ladder[ph], s});
  }
  std::vector<double> round_gbps, all_main_latency;
  for (int round = 0; round < opt.rounds; ++round) {
    const std::span<const double> l(round_latency.data() + static_cast<std::size_t>(round) * inst.size(),
                                    inst.size());
    round_gbps.push_back(batch_gb * opt.instances / *std::max_element(l.begin(), l.end()));
    all_main_latency.insert(all_main_latency.end(), l.begin(), l.end());
  }
  const double aggregate = percentile(round_gbps, 0.5);
  const double p50_ms = percentile(all_main_latency, 0.5) * 1e3,
               p99_ms = percentile(all_main_latency, 0.99) * 1e3;
  const std::optional<kp::fit_report> fit = kp::fit_batches(samples);

  const std::size_t lanes_per_instance =
      inst.empty() || !inst.front().client ? 0 : inst.front().client->connections();
  std::ostringstream out, js;
  if (cluster)
    out << "kvtier-probe: cluster: all " << slots_served << " slots served by " << opt.instances
        << " masters\n";
  out << "kvtier-probe: " << opt.instances << " " << unit << "(s), " << k_main << " x " << opt.chunk_bytes
      << "-byte values per batch, " << opt.rounds << " rounds, every byte verified, transport "
      << opt.transport << ", GET batches spread as the stores spread them over " << lanes_per_instance
      << " connection(s) per instance\n";
  js << "{\"tool\":\"kvtier-probe\",\"ok\":true,\"url\":\"" << json_escape(kvtier::resp::redact_url(opt.url))
     << "\",\"instances\":" << opt.instances << ",\"chunk_bytes\":" << opt.chunk_bytes
     << ",\"batch\":" << k_main << ",\"rounds\":" << opt.rounds
     << ",\"connections_per_instance\":" << lanes_per_instance << ",\"transport\":\"" << opt.transport
     << "\"";
  if (cluster)
    js << ",\"cluster\":{\"slots_served\":" << slots_served << ",\"masters\":" << opt.instances << "}";
  js << ",\"per_instance\":[";
  for (auto& in : inst) {
    const auto r = static_cast<std::size_t>(in.rank);
    char line[256];
    std::snprintf(line, sizeof line, "  %s %d (%s): %.3f GB/s, batch p50 %.1f ms, p99 %.1f ms\n", unit,
                  in.rank, in.ep.describe().c_str(), per_inst_gbps[r], percentile(in.latency_s[0], 0.5) * 1e3,
                  percentile(in.latency_s[0], 0.99) * 1e3);
    out << line;
    js << (r ? "," : "") << "{\"rank\":" << in.rank << ",\"endpoint\":\"" << json_escape(in.ep.describe())
       << "\",\"gbps\":" << num(per_inst_gbps[r])
       << ",\"p50_ms\":" << num(percentile(in.latency_s[0], 0.5) * 1e3, 2)
       << ",\"p99_ms\":" << num(percentile(in.latency_s[0], 0.99) * 1e3, 2) << "}";
  }
  js << "]";
  {
    char line[256];
    std::snprintf(line, sizeof line,
                  "  aggregate: %.3f GB/s (median over rounds of all bytes / slowest instance), "
                  "batch p50 %.1f ms, p99 %.1f ms\n",
                  aggregate, p50_ms, p99_ms);
    out << line;
  }
  js << ",\"aggregate_gbps\":" << num(aggregate) << ",\"p50_ms\":" << num(p50_ms, 2)
     << ",\"p99_ms\":" << num(p99_ms, 2);
  if (fit) {
    char line[512];
    std::snprintf(
        line, sizeof line,
        "  fit over batches of %s (least squares, %zu batches): T0 = %.2f ms per batch "
        "[95%%: %.2f .. %.2f], B = %.3f GB/s per instance [95%%: %.3f .. %s]\n",
        ladder_text.c_str(), fit->samples, fit->path.fixed_cost_s * 1e3, fit->t0_interval_s[0] * 1e3,
        fit->t0_interval_s[1] * 1e3, fit->path.bandwidth_gb_per_s, fit->b_interval_gbps[0],
        std::isfinite(fit->b_interval_gbps[1]) ? num(fit->b_interval_gbps[1], 3).c_str() : "unbounded");
    out << line;
    if (fit->clamped) {
      std::snprintf(line, sizeof line,
                    "  (least squares gave T0 = %.2f ms: below what this run resolves; T0 is taken as 0 "
                    "and B refitted through the origin)\n",
                    fit->fitted_t0_s * 1e3);
      out << line;
    }
    out << "  fit vs median measured:";
    for (const auto& c : fit->sizes) {
      std::snprintf(line, sizeof line, " batch %d %.1f vs %.1f ms (%+.0f%%);", c.batch, c.predicted_s * 1e3,
                    c.median_s * 1e3, c.error * 100);
      out << line;
    }
    std::snprintf(line, sizeof line, " rms residual %.2f ms\n", fit->rms_residual_s * 1e3);
    out << line;
    if (fit->max_abs_error > 0.1)
      out << "  (the fit misses a batch size by more than 10%: latency is not linear in batch bytes here; "
             "trust the verdict below only as far as that)\n";
    js << ",\"fit\":{\"t0_s\":" << num(fit->path.fixed_cost_s, 6)
       << ",\"t0_fitted_s\":" << num(fit->fitted_t0_s, 6)
       << ",\"t0_clamped\":" << (fit->clamped ? "true" : "false") << ",\"t0_interval_s\":["
       << num(fit->t0_interval_s[0], 6) << "," << num(fit->t0_interval_s[1], 6)
       << "],\"b_gbps\":" << num(fit->path.bandwidth_gb_per_s) << ",\"b_interval_gbps\":["
       << num(fit->b_interval_gbps[0]) << "," << num(fit->b_interval_gbps[1])
       << "],\"rms_residual_ms\":" << num(fit->rms_residual_s * 1e3, 3)
       << ",\"max_abs_error\":" << num(fit->max_abs_error, 3) << ",\"batch_sizes\":[";
    for (std::size_t i = 0; i < fit->sizes.size(); ++i) js << (i ? "," : "") << fit->sizes[i].batch;
    js << "],\"per_size\":[";
    for (std::size_t i = 0; i < fit->sizes.size(); ++i)
      js << (i ? "," : "") << "{\"batch\":" << fit->sizes[i].batch
         << ",\"median_ms\":" << num(fit->sizes[i].median_s * 1e3, 3)
         << ",\"predicted_ms\":" << num(fit->sizes[i].predicted_s * 1e3, 3)
         << ",\"error\":" << num(fit->sizes[i].error, 3) << "}";
    js << "]}";
  } else {
    out << "  fit over batches of " << ladder_text
        << (samples.size() < 3
                ? ": too few batches to fit (3 or more needed; use more --rounds)\n"
                : ": no positive slope (latency did not grow with batch size; more rounds may help)\n");
    js << ",\"fit\":null";
  }
  if (opt.bytes_per_token > 0) {
    const kvtier::prefill_node node{.kv_bytes_per_token = opt.bytes_per_token,
                                    .prefill_tokens_per_s = opt.prefill_tokens_per_s};
    const double b_star = kvtier::break_even_bandwidth_gb_per_s(node);
    // The tier: each rank loads its share from its own instance, all in parallel. B is the
    // measured aggregate; T0 the fitted fixed cost of a batch (0 when the fit failed).
    const kvtier::load_path tier{.fixed_cost_s = fit ? fit->path.fixed_cost_s : 0.0,
                                 .bandwidth_gb_per_s = aggregate};
    const double n_min = kvtier::min_profitable_tokens(node, tier);
    const double per_instance = aggregate / opt.instances;
    const int needed = static_cast<int>(std::floor(b_star / per_instance)) + 1;
    char line[512];
    std::snprintf(line, sizeof line,
                  "  break-even bandwidth B* = S*R = %.3f GB/s; this tier gives %.3f GB/s (%s)\n", b_star,
                  aggregate, aggregate > b_star ? "above: hits can pay off" : "below: no hit pays off");
    out << line;
    // The same threshold at both ends of T0's 95% interval: how far to trust it.
    double n_range[2] = {n_min, n_min};
    if (fit)
      for (int i = 0; i < 2; ++i)
        n_range[i] = kvtier::min_profitable_tokens(
            node, {.fixed_cost_s = fit->t0_interval_s[i], .bandwidth_gb_per_s = aggregate});
    if (std::isfinite(n_min)) {
      std::snprintf(line, sizeof line,
                    "  a hit pays off for prompts longer than %.0f tokens (T0 = %.1f ms; %.0f .. %.0f tokens "
                    "over T0's 95%% interval)\n",
                    n_min, tier.fixed_cost_s * 1e3, n_range[0], n_range[1]);
    } else {
      std::snprintf(line, sizeof line, "  no prompt length pays off at %.3f GB/s\n", aggregate);
    }
    out << line;
    std::snprintf(line, sizeof line,
                  "  %ss needed for B > B*: %d (at the measured %.3f GB/s per %s, scaling linearly)\n", unit,
                  needed, per_instance, unit);
    out << line;
    js << ",\"cost\":{\"bytes_per_token\":" << num(opt.bytes_per_token, 1)
       << ",\"prefill_tokens_per_s\":" << num(opt.prefill_tokens_per_s, 1)
       << ",\"b_star_gbps\":" << num(b_star) << ",\"pays_off\":" << (aggregate > b_star ? "true" : "false")
       << ",\"min_profitable_tokens\":" << num(n_min, 0) << ",\"min_profitable_tokens_interval\":["
       << num(n_range[0], 0) << "," << num(n_range[1], 0) << "],\"instances_needed\":" << needed << "}";
  }
  js << "}";
  std::fputs(out.str().c_str(), stdout);
  if (opt.json) std::printf("%s\n", js.str().c_str());
  return 0;
}
