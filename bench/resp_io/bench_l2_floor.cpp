// bench_l2_floor: kvtier's L2 path (remote_store get/put, header and XXH3-64 checked) against the
// floors of the wire, for every value size and batch, on one local redis-server it starts.
//
//   bench_l2_floor [--quick] [--reps N] [--seconds S] [--sizes B,B,...] [--batches K,K,...]
//                  [--ops get,set] [--connections N] [--spread-bytes B (1: never spread)]
//                  [--clients NAME,...] (a subset, e.g. to profile one; the ratio rows need a floor)
//                  [--knee B,B,...] (also kvtier_asio_s<B>: the store with spread bound B, 1 = never)
//
// Clients, all in this process, one at a time, interleaved within each row (the order rotates
// every repetition), medians over --reps:
//   kvtier_asio, kvtier_uring  remote_store over asio_connection / uring_connection (its pool:
//                              --connections, one kept for small calls)
//   raw_pipelined              floor: one connection, the whole batch pipelined, recv straight
//                              into the buffers (floor_clients.hpp)
//   raw_per_rtt                floor: LMCache's pattern, one worker thread per connection over
//                              as many connections as kvtier uses for a batch, tiles, one GET
//                              (SET) per round trip
//   hiredis                    pipelined, memcpy from its reply (SET: %b, one copy into its buffer)
//   xxh3_only                  not a client: XXH3-64 of the batch's values alone (the checksum's own
//                              CPU-s/GB under the same load); SET rows then print issue 28's targets
//                              against raw_per_rtt: GB/s x1.10, CPU/GB <= floor + xxh3, srv <= floor
// Per client and row: GB/s, client CPU-s/GB (getrusage of this process: every thread), and
// redis-server CPU-s/GB (INFO cpu before and after). Per row: kvtier's ratio to the better floor
// (the floor with more median GB/s): GB/s, client CPU/GB and server CPU/GB, each the median over
// repetitions of that repetition's kvtier / floor ratio (paired turns; on a shared machine the
// ratio of two separate medians moves 2x between identical runs), GB/s with its middle half. Every GET row
// checks the bytes once before its timed part. Default: 256 KiB .. 64 MB x batches 1, 8, 16 (64 MB: 1 and 8,
// for memory), GET and SET, 3 reps; --quick: two sizes, batches 1 and 8, one rep.
// The last stdout line is one JSON object.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "floor_clients.hpp"
#include "kvtier/detail/xxhash.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "support/machine.hpp"
#include "support/redis_server.hpp"
#include "support/stats.hpp"
#if KVTIER_BENCH_HAS_URING
#include "kvtier/resp/uring_connection.hpp"
#endif
#if KVTIER_BENCH_HAS_HIREDIS
#include <hiredis/hiredis.h>
#endif

namespace kb = kvtier_bench;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct config {
  int reps = 3;
  double seconds = 0.2;
  std::vector<std::size_t> sizes = {256u << 10, 1u << 20, 2u << 20, 4u << 20, 12'400'000, 64'000'000};
  std::vector<std::size_t> batches = {1, 8, 16};
  std::vector<std::string> ops = {"get", "set"};
  std::vector<std::string> clients;    // empty: all
  std::size_t connections = 4;         // kvtier's pool; its large connections = connections - 1
  std::size_t spread_bytes = 0;        // 0: the store's default
  std::vector<std::size_t> knee;       // --knee: extra kvtier_asio clients, one per spread bound
  std::size_t big_value = 64'000'000;  // values this large: batches up to big_batch_max only
  std::size_t big_batch_max = 8;
};

/// One way of moving a batch. Keys are per client (each writes and reads its own).
class client {
 public:
  virtual ~client() = default;
  virtual bool get(std::size_t size_index, std::span<const std::span<std::byte>> dst, std::string& err) = 0;
  virtual bool set(std::size_t size_index, std::span<const std::span<const std::byte>> src,
                   std::string& err) = 0;
};

/// kvtier's remote_store: chunk keys {size_index, k}.
template <class Connection>
class store_client final : public client {
 public:
  store_client(std::uint16_t port, const config& cfg, std::size_t spread_bytes)
      : store_(ns(), options(port), kvtier::resp::pool_options{.connections = cfg.connections},
               kvtier::value_format::v1(), spread(spread_bytes)) {}
  bool get(std::size_t si, std::span<const std::span<std::byte>> dst, std::string& err) override {
    return check(
        si, dst.size(), err, [&] { return store_.get(keys_, dst, status_, dl()); },
        kvtier::chunk_status::hit);
  }
  bool set(std::size_t si, std::span<const std::span<const std::byte>> src, std::string& err) override {
    return check(
        si, src.size(), err, [&] { return store_.put(keys_, src, status_, dl()); },
        kvtier::chunk_status::stored);
  }

 private:
  static kvtier::key_namespace ns() {
    return {
        .model = "bench_l2_floor", .kv_format = "random-bytes", .chunk_tokens = 256, .ownership = "mod:1"};
  }
  static kvtier::batch_spread spread(std::size_t bytes) {
    kvtier::batch_spread s;
    if (bytes != 0) s.max_reply_bytes = bytes == 1 ? 0 : bytes;  // 1: never spread
    return s;
  }
  static kvtier::resp::connection_options options(std::uint16_t port) {
    kvtier::resp::connection_options o;
    o.server.host = "127.0.0.1";
    o.server.port = port;
    return o;
  }
  static kvtier::deadline dl() { return kvtier::deadline_after(std::chrono::seconds(60)); }
  template <class Call>
  bool check(std::size_t si, std::size_t n, std::string& err, Call&& call, kvtier::chunk_status want) {
    keys_.resize(n);
    status_.resize(n);
    for (std::size_t i = 0; i < n; ++i) keys_[i] = {si, i};
    const std::error_code ec = call();
    for (std::size_t i = 0; i < n; ++i)
      if (status_[i] != want) {
        err = "kvtier: chunk " + std::to_string(i) + ": " + std::string(kvtier::to_string(status_[i])) +
              " (" + (ec ? ec.message() : std::string("no call error")) + "; " + store_.last_error() + ")";
        return false;
      }
    return true;
  }
  kvtier::remote_store<Connection> store_;
  std::vector<kvtier::chunk_key> keys_;
  std::vector<kvtier::chunk_status> status_;
};

/// Raw keys "floor:<client>:<size_index>:<k>" for the floors and hiredis.
std::vector<std::string> raw_keys(const std::string& who, std::size_t si, std::size_t n) {
  std::vector<std::string> k(n);
  for (std::size_t i = 0; i < n; ++i)
    k[i] = "floor:" + who + ":" + std::to_string(si) + ":" + std::to_string(i);
  return k;
}

template <class Floor>
class floor_client final : public client {
 public:
  template <class... A>
  floor_client(std::string who, A&&... a) : who_(std::move(who)), f_(std::forward<A>(a)...) {}
  bool get(std::size_t si, std::span<const std::span<std::byte>> dst, std::string& err) override {
    const auto keys = raw_keys(who_, si, dst.size());
    return f_.get(keys, dst, err);
  }
  bool set(std::size_t si, std::span<const std::span<const std::byte>> src, std::string& err) override {
    const auto keys = raw_keys(who_, si, src.size());
    return f_.set(keys, src, err);
  }

 private:
  std::string who_;
  Floor f_;
};

#if KVTIER_BENCH_HAS_HIREDIS
class hiredis_client final : public client {
 public:
  explicit hiredis_client(std::uint16_t port) : c_(redisConnect("127.0.0.1", port)) {
    if (c_ == nullptr || c_->err) throw std::runtime_error("hiredis: connect failed");
  }
  ~hiredis_client() override { redisFree(c_); }
  bool get(std::size_t si, std::span<const std::span<std::byte>> dst, std::string& err) override {
    const auto keys = raw_keys("hiredis", si, dst.size());
    for (const auto& k : keys) redisAppendCommand(c_, "GET %b", k.data(), k.size());
    return replies(keys.size(), err, [&](redisReply* r, std::size_t i) {
      if (r->type != REDIS_REPLY_STRING || r->len != dst[i].size()) return false;
      std::memcpy(dst[i].data(), r->str, r->len);
      return true;
    });
  }
  bool set(std::size_t si, std::span<const std::span<const std::byte>> src, std::string& err) override {
    const auto keys = raw_keys("hiredis", si, src.size());
    for (std::size_t i = 0; i < keys.size(); ++i)
      redisAppendCommand(c_, "SET %b %b", keys[i].data(), keys[i].size(), src[i].data(), src[i].size());
    return replies(keys.size(), err,
                   [](redisReply* r, std::size_t) { return r->type == REDIS_REPLY_STATUS; });
  }

 private:
  template <class Use>
  bool replies(std::size_t n, std::string& err, Use&& use) {
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) {
      void* r = nullptr;
      if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr)
        return err = std::string("hiredis: ") + c_->errstr, false;
      if (!use(static_cast<redisReply*>(r), i)) ok = false, err = "hiredis: unexpected reply";
      freeReplyObject(r);
    }
    return ok;
  }
  redisContext* c_;
};
#endif

/// Not a client: the checksum alone (XXH3-64 of each value, what a put or get adds to the wire's
/// work), timed in the same rotation so its CPU-s/GB is measured under the same load.
class checksum_only final : public client {
 public:
  bool get(std::size_t, std::span<const std::span<std::byte>> dst, std::string&) override {
    for (const auto& v : dst) sink_ ^= kvtier::detail::xxh3_64(v.data(), v.size());
    return true;
  }
  bool set(std::size_t, std::span<const std::span<const std::byte>> src, std::string&) override {
    for (const auto& v : src) sink_ ^= kvtier::detail::xxh3_64(v.data(), v.size());
    return true;
  }
  std::uint64_t sink() const noexcept { return sink_; }

 private:
  std::uint64_t sink_ = 0;
};

struct cell {
  std::vector<double> gbps, cpu, srv;  // one entry per repetition, in repetition order
};

// Per-repetition ratios a[r] / b[r]: their median and middle half (25th and 75th percentiles).
struct paired {
  double median = 0, low = 0, high = 0;
};
paired pair_up(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(a[i] / std::max(b[i], 1e-12));
  if (r.empty()) return {};
  std::sort(r.begin(), r.end());
  auto at = [&](double q) {
    return r[static_cast<std::size_t>(q * static_cast<double>(r.size() - 1) + 0.5)];
  };
  return {kb::median(r), at(0.25), at(0.75)};
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_l2_floor: %s\nusage: bench_l2_floor [--quick] [--reps N] [--seconds S] [--sizes B,...] "
               "[--batches K,...] [--ops get,set] [--connections N] [--spread-bytes B] [--clients NAME,...] "
               "[--knee B,...]\n",
               why.c_str());
  std::exit(2);
}

template <class T, class Parse>
std::vector<T> list(const std::string& v, Parse p) {
  std::vector<T> out;
  std::stringstream ss(v);
  for (std::string part; std::getline(ss, part, ',');) out.push_back(p(part));
  return out;
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      c.reps = 1, c.seconds = 0.05, c.sizes = {256u << 10, 2u << 20}, c.batches = {1, 8};
      continue;
    }
    if (i + 1 >= argc) usage("missing value after " + a);
    const std::string v = argv[++i];
    try {
      if (a == "--reps")
        c.reps = std::stoi(v);
      else if (a == "--seconds")
        c.seconds = std::stod(v);
      else if (a == "--sizes")
        c.sizes = list<std::size_t>(v, [](const std::string& s) { return std::stoull(s); });
      else if (a == "--batches")
        c.batches = list<std::size_t>(v, [](const std::string& s) { return std::stoull(s); });
      else if (a == "--ops")
        c.ops = list<std::string>(v, [](const std::string& s) { return s; });
      else if (a == "--connections")
        c.connections = std::stoull(v);
      else if (a == "--clients")
        c.clients = list<std::string>(v, [](const std::string& s) { return s; });
      else if (a == "--knee")
        c.knee = list<std::size_t>(v, [](const std::string& s) { return std::stoull(s); });
      else if (a == "--spread-bytes")
        c.spread_bytes = std::stoull(v);
      else
        usage("unknown flag " + a);
    } catch (const std::logic_error&) {
      usage("bad value '" + v + "' for " + a);
    }
  }
  if (c.reps < 1 || c.reps > 1000 || c.seconds <= 0 || c.seconds > 30 || c.connections < 2)
    usage("bad values");
  for (const auto& o : c.ops)
    if (o != "get" && o != "set") usage("--ops takes get and set");
  return c;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) try {
  const config cfg = parse(argc, argv);
  kvtier::test::redis_server srv({.extra_args = {"--save", "", "--appendonly", "no"}});
  const std::uint16_t port = srv.port();
  const std::size_t lanes = cfg.connections - 1;  // the pool's large connections

  std::vector<std::pair<std::string, std::unique_ptr<client>>> clients;
  clients.emplace_back("kvtier_asio", std::make_unique<store_client<kvtier::resp::asio_connection>>(
                                          port, cfg, cfg.spread_bytes));
#if KVTIER_BENCH_HAS_URING
  clients.emplace_back("kvtier_uring", std::make_unique<store_client<kvtier::resp::uring_connection>>(
                                           port, cfg, cfg.spread_bytes));
#endif
  // The knee: the same store with other spread bounds, interleaved with the rest (paired ratios).
  for (std::size_t b : cfg.knee)
    clients.emplace_back("kvtier_asio_s" + std::to_string(b),
                         std::make_unique<store_client<kvtier::resp::asio_connection>>(port, cfg, b));
  clients.emplace_back("raw_pipelined", std::make_unique<floor_client<kb::raw_pipelined>>("pipe", port));
  clients.emplace_back("raw_per_rtt", std::make_unique<floor_client<kb::raw_per_rtt>>("rtt", port, lanes));
#if KVTIER_BENCH_HAS_HIREDIS
  clients.emplace_back("hiredis", std::make_unique<hiredis_client>(port));
#endif
  clients.emplace_back("xxh3_only", std::make_unique<checksum_only>());
  if (!cfg.clients.empty())
    std::erase_if(clients, [&](const auto& c) {
      return c.first.rfind("kvtier_asio_s", 0) != 0 &&  // --knee's clients stay
             std::find(cfg.clients.begin(), cfg.clients.end(), c.first) == cfg.clients.end();
    });
  if (clients.empty())
    usage("--clients names none of kvtier_asio, kvtier_uring, raw_pipelined, raw_per_rtt, hiredis");
  auto is_kvtier = [](const std::string& n) { return n.rfind("kvtier", 0) == 0; };  // xxh3_only: neither
  auto is_floor = [](const std::string& n) { return n.rfind("raw_", 0) == 0; };

  // Caller-owned buffers, touched once: large enough for the largest batch of any size.
  std::size_t most = 0;
  for (std::size_t s : cfg.sizes)
    for (std::size_t b : cfg.batches)
      if (s < cfg.big_value || b <= cfg.big_batch_max) most = std::max(most, s * b);
  std::vector<std::byte> arena(most);
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (std::size_t i = 0; i + 8 <= arena.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(arena.data() + i, &x, 8);
  }
  std::vector<std::byte> golden;  // the bytes written, to check what a GET brought back

  std::fprintf(stderr,
               "bench_l2_floor: redis-server on port %u, kvtier pool %zu connections (%zu for batches)\n",
               port, cfg.connections, lanes);
  std::printf("%-4s %10s %5s | %-14s %8s %9s %9s\n", "op", "value B", "batch", "client", "GB/s", "CPU-s/GB",
              "srvCPU/GB");
  std::ostringstream json;
  json << "{\"bench\":\"l2_floor\",\"reps\":" << cfg.reps << ",\"connections\":" << cfg.connections
       << ",\"rows\":[";
  bool first_row = true;
  double worst_gbps_ratio = 1e9;
  for (const std::string& op : cfg.ops) {
    for (std::size_t si = 0; si < cfg.sizes.size(); ++si) {
      const std::size_t size = cfg.sizes[si];
      for (std::size_t batch : cfg.batches) {
        if (size >= cfg.big_value && batch > cfg.big_batch_max) continue;
        std::vector<std::span<std::byte>> dst(batch);
        std::vector<std::span<const std::byte>> src(batch);
        for (std::size_t i = 0; i < batch; ++i) {
          dst[i] = std::span(arena).subspan(i * size, size);
          src[i] = dst[i];
        }
        const double batch_gb = static_cast<double>(size * batch) / 1e9;
        std::map<std::string, cell> cells;
        // Every client writes its keys once (the GET rows read them back, checked).
        golden.assign(arena.begin(), arena.begin() + static_cast<std::ptrdiff_t>(size * batch));
        for (auto& [name, c] : clients) {
          std::string err;
          if (!c->set(si, src, err)) throw std::runtime_error(name + ": " + err);
          if (op == "get" && name != "xxh3_only") {
            std::memset(arena.data(), 0, golden.size());  // so a GET that delivers nothing fails the check
            if (!c->get(si, dst, err)) throw std::runtime_error(name + ": " + err);
            if (std::memcmp(arena.data(), golden.data(), golden.size()) != 0)
              throw std::runtime_error(name + ": GET brought back other bytes");
          }
        }
        for (int rep = 0; rep < cfg.reps; ++rep) {
          for (std::size_t k = 0; k < clients.size(); ++k) {
            auto& [name, c] = clients[(k + static_cast<std::size_t>(rep)) % clients.size()];
            std::string err;
            const double s0 = kb::server_cpu_s(srv), c0 = kb::cpu_self_s(), t0 = now_s();
            double t = t0;
            std::size_t n = 0;
            // At least two batches (one of 256 MB or more), at most 10,000, for about --seconds.
            const std::size_t min_batches = size * batch >= (256u << 20) ? 1 : 2;
            while (n < min_batches || (t - t0 < cfg.seconds && n < 10000)) {
              const bool ok = op == "get" ? c->get(si, dst, err) : c->set(si, src, err);
              if (!ok) throw std::runtime_error(name + ": " + err);
              ++n;
              t = now_s();
            }
            const double c1 = kb::cpu_self_s(), s1 = kb::server_cpu_s(srv),
                         gb = batch_gb * static_cast<double>(n);
            cell& e = cells[name];
            e.gbps.push_back(gb / (t - t0));
            e.cpu.push_back((c1 - c0) / gb);
            e.srv.push_back((s1 - s0) / gb);
          }
        }
        // The better floor: the one with more GB/s in this row.
        std::string best;
        for (auto& [name, c] : clients)
          if (is_floor(name) && (best.empty() || kb::median(cells[name].gbps) > kb::median(cells[best].gbps)))
            best = name;
        json << (first_row ? "" : ",") << "{\"op\":\"" << op << "\",\"value_bytes\":" << size
             << ",\"batch\":" << batch << ",\"better_floor\":\"" << best << "\",\"clients\":{";
        first_row = false;
        bool first_client = true;
        for (auto& [name, c] : clients) {
          const cell& e = cells[name];
          std::printf("%-4s %10zu %5zu | %-14s %8.3f %9.4f %9.4f\n", op.c_str(), size, batch, name.c_str(),
                      kb::median(e.gbps), kb::median(e.cpu), kb::median(e.srv));
          json << (first_client ? "" : ",") << "\"" << name
               << "\":{\"gbps\":" << fmt("%.4f", kb::median(e.gbps))
               << ",\"cpu_s_per_gb\":" << fmt("%.4f", kb::median(e.cpu))
               << ",\"server_cpu_s_per_gb\":" << fmt("%.4f", kb::median(e.srv)) << "}";
          first_client = false;
        }
        json << "},\"ratio_to_better_floor\":{";
        bool first_ratio = true;
        const cell& f = cells[best];
        for (auto& [name, c] : clients) {
          if (!is_kvtier(name) || best.empty()) continue;  // --clients left no floor to compare with
          const cell& e = cells[name];
          // Paired: each repetition's kvtier turn against the floor's turn of the same repetition
          // (adjacent in time, so a neighbour's load burst moves both), median over repetitions.
          const paired g = pair_up(e.gbps, f.gbps), cp = pair_up(e.cpu, f.cpu), sv = pair_up(e.srv, f.srv);
          worst_gbps_ratio = std::min(worst_gbps_ratio, g.median);
          std::printf(
              "%-4s %10zu %5zu | %-14s x%.2f GB/s (middle half x%.2f-x%.2f), x%.2f CPU/GB, x%.2f srv CPU/GB "
              "vs %s\n",
              op.c_str(), size, batch, name.c_str(), g.median, g.low, g.high, cp.median, sv.median,
              best.c_str());
          json << (first_ratio ? "" : ",") << "\"" << name << "\":{\"gbps\":" << fmt("%.3f", g.median)
               << ",\"gbps_p25\":" << fmt("%.3f", g.low) << ",\"gbps_p75\":" << fmt("%.3f", g.high)
               << ",\"cpu_per_gb\":" << fmt("%.3f", cp.median)
               << ",\"server_cpu_per_gb\":" << fmt("%.3f", sv.median) << "}";
          first_ratio = false;
        }
        // Issue 28's targets against LMCache's pattern (one command per round trip over as many
        // connections), in this same interleaved run: GB/s >= 1.1x, client CPU/GB <= the floor's
        // plus the checksum's own, server CPU/GB <= the better floor's.
        if (cells.count("raw_per_rtt") && cells.count("xxh3_only")) {
          const cell& rtt = cells["raw_per_rtt"];
          const double sum_cpu = kb::median(cells["xxh3_only"].cpu);
          for (auto& [name, c] : clients) {
            if (!is_kvtier(name)) continue;
            const cell& e = cells[name];
            const paired g = pair_up(e.gbps, rtt.gbps);
            const double cpu = kb::median(e.cpu), budget = kb::median(rtt.cpu) + sum_cpu;
            const double srv = kb::median(e.srv),
                         srv_floor = std::min(kb::median(rtt.srv), kb::median(cells[best].srv));
            std::printf(
                "%-4s %10zu %5zu | %-14s x%.2f GB/s vs raw_per_rtt (target x1.10 %s) | CPU/GB %.4f vs floor "
                "%.4f + "
                "xxh3 %.4f = %.4f (%s) | srv CPU/GB %.4f vs %.4f (%s)\n",
                op.c_str(), size, batch, name.c_str(), g.median, g.median >= 1.1 ? "met" : "MISSED", cpu,
                kb::median(rtt.cpu), sum_cpu, budget, cpu <= budget ? "met" : "MISSED", srv, srv_floor,
                srv <= srv_floor ? "met" : "MISSED");
          }
        }
        json << "}}";
        std::fflush(stdout);
      }
    }
  }
  const double load = kb::load_average();
  std::printf("1-min load average at the end: %.2f; worst kvtier GB/s ratio to the better floor: x%.2f\n",
              load, worst_gbps_ratio);
  json << "],\"loadavg_1m\":" << fmt("%.2f", load)
       << ",\"worst_gbps_ratio\":" << fmt("%.3f", worst_gbps_ratio) << "}";
  std::printf("%s\n", json.str().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_l2_floor: %s\n", e.what());
  return 1;
}
