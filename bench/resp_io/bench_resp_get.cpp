// bench_resp_get: batched GETs of 12.4 MB values (one 256-token MLA chunk) from redis-server on
// loopback, kvtier's connections against hiredis measured in the same run.
//
//   bench_resp_get [--reps N] [--seconds S] [--value-bytes B] [--batch K] [--scale N,...]
//
// Clients (each in its own forked child, so CPU time, page faults and peak RSS are its own):
//   kvtier_asio, kvtier_uring     pipelined GETs read straight into the caller's spans (the
//                                 probe's clients, tools/probe/probe_io.hpp)
//   kvtier_store_asio             the whole L2 path: remote_store get, header + XXH3 checked
//   raw_socket_floor              blocking socket, recv(MSG_WAITALL) into the spans: the floor
//   hiredis                       stock: redisAppendCommand x K, redisGetReply x K, memcpy into the span
//   hiredis_maxbuf0               the same with reader->maxbuf = 0 (keep the reader buffer)
//   hiredis_maxbuf0_mallopt       ... plus mallopt: 12.4 MB blocks from the heap, never trimmed
// The server's CPU per GB over the same interval shows when its one thread is the limit.
// Every client delivers the same bytes into the same caller-owned destination buffers (pre-touched,
// not counted in the RSS delta). Clients run interleaved, --reps times; the table shows medians.
// The headline compares each kvtier client with the best hiredis variant of the same run. Tail
// latency: the maximum over all repetitions' batches, and a p99 only from 100 batches up (the
// default run has about 10 batches per client and repetition: use --seconds for a real p99).
// Then N clients -> 1 instance and N clients -> N instances, as a ratio to 1 -> 1 (each client on
// its own connection and process).
// The last stdout line is one JSON object.
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "floor_clients.hpp"
#include "measure.hpp"
#include "support/machine.hpp"
#include "support/redis_server.hpp"

#if KVTIER_BENCH_HAS_HIREDIS
#include <hiredis/hiredis.h>
#endif
#if KVTIER_BENCH_HAS_ASIO
#include "kvtier/store/remote_store.hpp"
#include "probe_io.hpp"  // tools/probe: the probe's clients, so both measure the same code
#endif

namespace kb = kvtier_bench;
using steady = std::chrono::steady_clock;

namespace {

double now_s() { return std::chrono::duration<double>(steady::now().time_since_epoch()).count(); }

/// One way of fetching a batch of keys into caller spans. Errors are reported as text: a
/// benchmark that fails says so and exits non-zero.
class batch_client {
 public:
  virtual ~batch_client() = default;
  virtual bool get(const std::vector<std::string>& keys, std::span<const std::span<std::byte>> dst,
                   std::string& err) = 0;
};

using client_factory = std::function<std::unique_ptr<batch_client>(std::uint16_t port, std::string& err)>;

/// The physical limit of one connection: pipelined GETs on a blocking socket, each payload
/// received with MSG_WAITALL straight into its destination (one kernel copy, no parser; the
/// raw_pipelined floor of bench_l2_floor, floor_clients.hpp). No deadlines, no reconnects, no
/// checks beyond the length: a floor, not a client.
class raw_socket_client final : public batch_client {
 public:
  explicit raw_socket_client(std::uint16_t port) : floor_(port) {}
  bool ok() const noexcept { return floor_.ok(); }
  bool get(const std::vector<std::string>& keys, std::span<const std::span<std::byte>> dst,
           std::string& err) override {
    return floor_.get(keys, dst, err);
  }

 private:
  kb::raw_pipelined floor_;
};

client_factory raw_socket_factory() {
  return [](std::uint16_t port, std::string& err) -> std::unique_ptr<batch_client> {
    auto c = std::make_unique<raw_socket_client>(port);
    if (!c->ok()) {
      err = "raw: connect failed";
      return nullptr;
    }
    return c;
  };
}

#if KVTIER_BENCH_HAS_HIREDIS
class hiredis_client final : public batch_client {
 public:
  hiredis_client(redisContext* c, bool keep_buffer) : c_(c) {
    if (keep_buffer) c_->reader->maxbuf = 0;
  }
  ~hiredis_client() override { redisFree(c_); }
  bool get(const std::vector<std::string>& keys, std::span<const std::span<std::byte>> dst,
           std::string& err) override {
    for (const auto& k : keys) redisAppendCommand(c_, "GET %b", k.data(), k.size());
    bool ok = true;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) {
        err = std::string("hiredis: ") + c_->errstr;
        return false;
      }
      auto* reply = static_cast<redisReply*>(r);
      if (reply->type != REDIS_REPLY_STRING || reply->len != dst[i].size()) {
        err = "hiredis: unexpected reply for " + keys[i];
        ok = false;
      } else {
        std::memcpy(dst[i].data(), reply->str, reply->len);
      }
      freeReplyObject(reply);
    }
    return ok;
  }

 private:
  redisContext* c_;
};

client_factory hiredis_factory(bool keep_buffer, bool tune_malloc) {
  return [=](std::uint16_t port, std::string& err) -> std::unique_ptr<batch_client> {
    if (tune_malloc) {
      // Large values from the heap instead of a fresh mmap (and its page faults) per reply, and
      // never hand freed memory back: the usual tuning for a large-value hiredis client.
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
      mallopt(M_TRIM_THRESHOLD, 512 << 20);
    }
    redisContext* c = redisConnect("127.0.0.1", port);
    if (c == nullptr || c->err) {
      err = c ? std::string("hiredis connect: ") + c->errstr : "hiredis connect: out of memory";
      if (c) redisFree(c);
      return nullptr;
    }
    return std::make_unique<hiredis_client>(c, keep_buffer);
  };
}
#endif

#if KVTIER_BENCH_HAS_ASIO
class kvtier_client final : public batch_client {
 public:
  explicit kvtier_client(std::unique_ptr<kvtier_probe::instance_client> c) : c_(std::move(c)) {}
  bool get(const std::vector<std::string>& keys, std::span<const std::span<std::byte>> dst,
           std::string& err) override {
    outcome_.resize(keys.size());
    std::error_code ec = c_->get(keys, dst, outcome_, kvtier::deadline_after(std::chrono::seconds(30)));
    if (ec) {
      err = "kvtier: " + ec.message() + " " + c_->detail();
      return false;
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (outcome_[i] != kvtier_probe::get_outcome::ok) {
        err = "kvtier: GET " + keys[i] + ": " + std::string(kvtier_probe::to_string(outcome_[i]));
        return false;
      }
    }
    return true;
  }

 private:
  std::unique_ptr<kvtier_probe::instance_client> c_;
  std::vector<kvtier_probe::get_outcome> outcome_;
};

/// The whole L2 path: kvtier::remote_store (value header + XXH3-64 checksum checked per value).
/// Chunk keys 0..K-1 in bench_namespace(), stored by make_server() with the same bytes.
kvtier::key_namespace bench_namespace() {
  return {.model = "bench_resp_get", .kv_format = "random-bytes", .chunk_tokens = 256, .ownership = "mod:1"};
}

class store_client final : public batch_client {
 public:
  explicit store_client(std::uint16_t port) : store_(bench_namespace(), options(port)) {}
  bool get(const std::vector<std::string>& keys, std::span<const std::span<std::byte>> dst,
           std::string& err) override {
    chunk_keys_.resize(keys.size());
    status_.resize(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) chunk_keys_[i] = {0, i};
    std::error_code ec =
        store_.get(chunk_keys_, dst, status_, kvtier::deadline_after(std::chrono::seconds(30)));
    for (std::size_t i = 0; !ec && i < keys.size(); ++i) {
      if (status_[i] != kvtier::chunk_status::hit) {
        err = "kvtier store: chunk " + std::to_string(i) + ": " + std::string(kvtier::to_string(status_[i]));
        return false;
      }
    }
    if (ec) err = "kvtier store: " + ec.message();
    return !ec;
  }
  static kvtier::resp::connection_options options(std::uint16_t port) {
    kvtier::resp::connection_options o;
    o.server.host = "127.0.0.1";
    o.server.port = port;
    return o;
  }
  kvtier::remote_store<kvtier::resp::asio_connection>& store() { return store_; }

 private:
  kvtier::remote_store<kvtier::resp::asio_connection> store_;
  std::vector<kvtier::chunk_key> chunk_keys_;
  std::vector<kvtier::chunk_status> status_;
};

client_factory store_factory() {
  return [](std::uint16_t port, std::string&) -> std::unique_ptr<batch_client> {
    return std::make_unique<store_client>(port);
  };
}

client_factory kvtier_factory(const char* transport) {
  return [transport](std::uint16_t port, std::string& err) -> std::unique_ptr<batch_client> {
    kvtier::resp::endpoint ep;
    ep.host = "127.0.0.1";
    ep.port = port;
    auto c = kvtier_probe::make_instance_client(transport, ep, std::chrono::seconds(10));
    if (std::error_code ec = c->connect(kvtier::deadline_after(std::chrono::seconds(10)))) {
      err = "kvtier connect: " + ec.message() + " " + c->detail();
      return nullptr;
    }
    return std::make_unique<kvtier_client>(std::move(c));
  };
}
#endif

struct config {
  int reps = 3;
  double seconds = 1.5;
  std::size_t value_bytes = 12'400'000;
  std::size_t batch = 8;
  std::vector<int> scale = {2, 4};
};

/// What a child reports back through its pipe (plain bytes, fixed size).
struct child_result {
  static constexpr std::size_t max_batches = 4096;
  int ok = 0;
  char err[256] = {};
  double t_start = 0, t_end = 0;
  std::uint64_t bytes = 0;
  std::uint32_t batches = 0;
  double cpu_s = 0;
  double server_cpu_s = 0;  // the redis-server's CPU over the same interval
  long minor_faults = 0;
  long peak_rss_delta_kib = 0;
  double latency_s[max_batches] = {};
};

// Moves all n bytes through read() or write(), resuming after EINTR and short transfers.
template <class Byte, class Syscall>
bool transfer_full(Syscall io, int fd, Byte* b, std::size_t n) {
  while (n > 0) {
    ssize_t r = io(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}
bool read_full(int fd, void* p, std::size_t n) { return transfer_full(::read, fd, static_cast<char*>(p), n); }
bool write_full(int fd, const void* p, std::size_t n) {
  return transfer_full(::write, fd, static_cast<const char*>(p), n);
}

/// Body of one child: connect, warm up and verify, report ready, wait for go, fetch for
/// cfg.seconds, report. Never returns.
[[noreturn]] void child_main(const config& cfg, const client_factory& make, std::uint16_t port, pid_t server,
                             const std::vector<std::string>& keys, const std::vector<std::uint64_t>& sums,
                             int ready_fd, int go_fd, int result_fd) {
  auto res = std::make_unique<child_result>();
  auto fail = [&](const std::string& m) {
    std::snprintf(res->err, sizeof res->err, "%s", m.c_str());
    write_full(result_fd, res.get(), sizeof *res);
    _exit(1);
  };
  // Caller-owned destinations, touched before the meter starts: not the client's memory.
  std::vector<std::vector<std::byte>> buffers(keys.size(), std::vector<std::byte>(cfg.value_bytes));
  std::vector<std::span<std::byte>> dst(buffers.begin(), buffers.end());
  std::string err;
  char token = 'r';
  // The client's memory counts from before it exists; its CPU and faults only in the timed part
  // (connect and warm-up happen once in a long-lived engine).
  kb::peak_rss_meter rss;
  auto client = make(port, err);
  if (!client) fail(err);
  for (int w = 0; w < 2; ++w) {
    for (auto& b : buffers) std::memset(b.data(), 0, b.size());
    if (!client->get(keys, dst, err)) fail(err);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (XXH3_64bits(dst[i].data(), dst[i].size()) != sums[i]) fail("wrong bytes for " + keys[i]);
    }
  }
  write_full(ready_fd, &token, 1);
  if (!read_full(go_fd, &token, 1)) fail("parent went away");

  kb::usage_meter meter;
  const double server_cpu0 = kb::process_cpu_s(server);
  res->t_start = now_s();
  const double until = res->t_start + cfg.seconds;
  double t = res->t_start;
  do {
    const double t0 = now_s();
    if (!client->get(keys, dst, err)) fail(err);
    t = now_s();
    if (res->batches < child_result::max_batches) res->latency_s[res->batches] = t - t0;
    ++res->batches;
    res->bytes += keys.size() * cfg.value_bytes;
  } while (t < until);
  res->t_end = t;
  res->server_cpu_s = kb::process_cpu_s(server) - server_cpu0;
  kb::process_usage u = meter.stop();
  res->cpu_s = u.cpu_s;
  res->minor_faults = u.minor_faults;
  res->peak_rss_delta_kib = rss.delta_kib();
  res->ok = 1;
  write_full(result_fd, res.get(), sizeof *res);
  _exit(0);
}

struct server_data {
  std::unique_ptr<kvtier::test::redis_server> srv;
  std::vector<std::string> keys;
  std::vector<std::uint64_t> sums;
};

/// Starts one server and stores `batch` values of deterministic pseudo-random bytes.
server_data make_server(const config& cfg, int index) {
  server_data d;
  d.srv = std::make_unique<kvtier::test::redis_server>();
  std::string value(cfg.value_bytes, '\0');
  for (std::size_t k = 0; k < cfg.batch; ++k) {
    std::uint64_t x = 0x9E3779B97F4A7C15ull * (k + 1) + static_cast<std::uint64_t>(index);
    for (std::size_t i = 0; i + 8 <= value.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(value.data() + i, &x, 8);
    }
    std::string key = "bench:resp_get:" + std::to_string(k);
    std::string r = d.srv->call({"SET", key, value});
    if (r != "OK") throw std::runtime_error("SET failed: " + r);
#if KVTIER_BENCH_HAS_ASIO
    {  // the same bytes as chunk k of the remote_store row (a short-lived connection, closed before forks)
      store_client writer(d.srv->port());
      const kvtier::chunk_key ck{0, k};
      const std::span<const std::byte> src(reinterpret_cast<const std::byte*>(value.data()), value.size());
      kvtier::chunk_status st{};
      std::error_code ec = writer.store().put(std::span(&ck, 1), std::span(&src, 1), std::span(&st, 1),
                                              kvtier::deadline_after(std::chrono::seconds(30)));
      if (ec || st != kvtier::chunk_status::stored) throw std::runtime_error("remote_store put failed");
    }
#endif
    d.keys.push_back(key);
    d.sums.push_back(XXH3_64bits(value.data(), value.size()));
  }
  return d;
}

/// Runs `n` children of one client at once, child i against servers[i % servers.size()].
std::vector<child_result> run_group(const config& cfg, const client_factory& make, int n,
                                    std::span<const server_data> servers) {
  struct kid {
    pid_t pid;
    int ready, go, result;
  };
  std::vector<kid> kids;
  std::fflush(nullptr);
  for (int i = 0; i < n; ++i) {
    int ready[2], go[2], result[2];
    if (::pipe(ready) || ::pipe(go) || ::pipe(result)) throw std::runtime_error("pipe failed");
    const server_data& s = servers[static_cast<std::size_t>(i) % servers.size()];
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(ready[0]), ::close(go[1]), ::close(result[0]);
      child_main(cfg, make, s.srv->port(), s.srv->pid(), s.keys, s.sums, ready[1], go[0], result[1]);
    }
    ::close(ready[1]), ::close(go[0]), ::close(result[1]);
    kids.push_back({pid, ready[0], go[1], result[0]});
  }
  // Everyone connected and warmed up, then everyone starts together.
  char token = 0;
  for (auto& k : kids) read_full(k.ready, &token, 1);
  for (auto& k : kids) write_full(k.go, "g", 1);
  std::vector<child_result> out(kids.size());
  std::string failure;
  for (std::size_t i = 0; i < kids.size(); ++i) {
    if (!read_full(kids[i].result, &out[i], sizeof out[i])) out[i].ok = 0;
    int st = 0;
    ::waitpid(kids[i].pid, &st, 0);
    ::close(kids[i].ready), ::close(kids[i].go), ::close(kids[i].result);
    if (!out[i].ok && failure.empty()) failure = out[i].err[0] ? out[i].err : "child died";
  }
  if (!failure.empty()) throw std::runtime_error(failure);
  return out;
}

struct client_stats {
  std::vector<double> gbps, p50_ms, cpu_s_per_gb, faults_per_4k, rss_kib, server_cpu_s_per_gb;
  std::vector<double> all_latency_s;  // every batch of every repetition, for the tail
};

// A p99 needs enough batches to mean more than the maximum: 100 or more.
constexpr std::size_t p99_min_batches = 100;

std::vector<double> latencies(const child_result& r) {
  std::size_t n = std::min<std::size_t>(r.batches, child_result::max_batches);
  return std::vector<double>(r.latency_s, r.latency_s + n);
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_resp_get: %s\nusage: bench_resp_get [--reps N] [--seconds S] [--value-bytes B] "
               "[--batch K] [--scale N,N...]\n",
               why.c_str());
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value after " + a);
    std::string v = argv[++i];
    try {
      if (a == "--reps")
        c.reps = std::stoi(v);
      else if (a == "--seconds")
        c.seconds = std::stod(v);
      else if (a == "--value-bytes")
        c.value_bytes = std::stoull(v);
      else if (a == "--batch")
        c.batch = std::stoull(v);
      else if (a == "--scale") {
        c.scale.clear();
        std::stringstream ss(v);
        for (std::string part; std::getline(ss, part, ',');) c.scale.push_back(std::stoi(part));
      } else
        usage("unknown flag " + a);
    } catch (const std::logic_error&) {
      usage("bad value '" + v + "' for " + a);
    }
  }
  if (c.reps < 1 || c.seconds <= 0 || c.value_bytes < 8 || c.batch < 1) usage("values must be positive");
  return c;
}

}  // namespace

int main(int argc, char** argv) try {
  const config cfg = parse(argc, argv);
  std::vector<std::pair<std::string, client_factory>> clients;
#if KVTIER_BENCH_HAS_ASIO
  clients.emplace_back("kvtier_asio", kvtier_factory("asio"));
  clients.emplace_back("kvtier_store_asio", store_factory());
#endif
#if KVTIER_BENCH_HAS_URING
  clients.emplace_back("kvtier_uring", kvtier_factory("uring"));
#endif
#if KVTIER_BENCH_HAS_HIREDIS
  clients.emplace_back("hiredis", hiredis_factory(false, false));
  clients.emplace_back("hiredis_maxbuf0", hiredis_factory(true, false));
  clients.emplace_back("hiredis_maxbuf0_mallopt", hiredis_factory(true, true));
#endif
  if (clients.empty()) usage("built without any client (needs kvtier::asio, kvtier::uring or hiredis)");
  clients.emplace_back("raw_socket_floor", raw_socket_factory());

  int max_instances = 1;
  for (int n : cfg.scale) max_instances = std::max(max_instances, n);
  std::vector<server_data> servers;
  for (int i = 0; i < max_instances; ++i) servers.push_back(make_server(cfg, i));
  const double batch_gb = static_cast<double>(cfg.batch * cfg.value_bytes) / 1e9;
  std::fprintf(stderr,
               "bench_resp_get: %zu x %zu-byte values per batch (%.1f MB), %d reps x %.1f s, %zu clients\n",
               cfg.batch, cfg.value_bytes, batch_gb * 1e3, cfg.reps, cfg.seconds, clients.size());

  // ---- one client against one instance, the clients interleaved within each repetition -------
  std::map<std::string, client_stats> stats;
  for (int rep = 0; rep < cfg.reps; ++rep) {
    // Rotate the order every repetition so that no client always runs first or last.
    for (std::size_t c = 0; c < clients.size(); ++c) {
      const auto& [name, make] = clients[(c + static_cast<std::size_t>(rep)) % clients.size()];
      child_result r = run_group(cfg, make, 1, std::span(servers).first(1)).front();
      const double secs = r.t_end - r.t_start, gb = static_cast<double>(r.bytes) / 1e9;
      std::vector<double> lat = latencies(r);
      client_stats& s = stats[name];
      s.gbps.push_back(gb / secs);
      s.p50_ms.push_back(kb::percentile(lat, 0.5) * 1e3);
      s.all_latency_s.insert(s.all_latency_s.end(), lat.begin(), lat.end());
      s.cpu_s_per_gb.push_back(r.cpu_s / gb);
      s.faults_per_4k.push_back(static_cast<double>(r.minor_faults) /
                                (static_cast<double>(r.bytes) / 4096.0));
      s.rss_kib.push_back(static_cast<double>(r.peak_rss_delta_kib));
      s.server_cpu_s_per_gb.push_back(r.server_cpu_s / gb);
      std::fprintf(stderr, "  rep %d %-24s %6.2f GB/s  p50 %7.1f ms  %.3f CPU-s/GB\n", rep + 1, name.c_str(),
                   gb / secs, s.p50_ms.back(), s.cpu_s_per_gb.back());
    }
  }

  // ---- table ------------------------------------------------------------------------------
  const double load1 = kvtier_bench::load_average();
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::printf(
      "GET %zu x %.1f MB per batch, 1 client -> 1 redis-server on loopback, median of %d reps "
      "(%ld CPUs, 1-min load %.1f at the end)\n",
      cfg.batch, static_cast<double>(cfg.value_bytes) / 1e6, cfg.reps, cpus, load1);
  std::printf(
      "every client delivers into the same caller-owned buffers (hiredis: memcpy from its reply); "
      "CPU, faults and peak RSS are the client process's own; max and p99 over all repetitions' "
      "batches (p99 only from %zu batches up: raise --seconds or --reps)\n",
      p99_min_batches);
  std::printf("%-24s %8s %9s %9s %9s %8s %10s %12s %12s %11s\n", "client", "GB/s", "p50 ms", "max ms",
              "p99 ms", "batches", "CPU-s/GB", "faults/4KiB", "peakRSS KiB", "srv CPU/GB");
  std::ostringstream json;
  json << "{\"bench\":\"resp_get\",\"value_bytes\":" << cfg.value_bytes << ",\"batch\":" << cfg.batch
       << ",\"reps\":" << cfg.reps << ",\"cpus\":" << cpus << ",\"loadavg_1m\":" << fmt("%.2f", load1)
       << ",\"clients\":{";
  bool first_client = true;
  for (const auto& [name, make] : clients) {
    (void)make;
    const client_stats& s = stats[name];
    const std::size_t n_lat = s.all_latency_s.size();
    const double max_ms = kb::percentile(s.all_latency_s, 1.0) * 1e3;
    const bool has_p99 = n_lat >= p99_min_batches;
    const double p99_ms = kb::percentile(s.all_latency_s, 0.99) * 1e3;
    std::printf("%-24s %8.3f %9.1f %9.1f %9s %8zu %10.3f %12.5f %12.0f %11.3f\n", name.c_str(),
                kb::median(s.gbps), kb::median(s.p50_ms), max_ms, has_p99 ? fmt("%.1f", p99_ms).c_str() : "-",
                n_lat, kb::median(s.cpu_s_per_gb), kb::median(s.faults_per_4k), kb::median(s.rss_kib),
                kb::median(s.server_cpu_s_per_gb));
    json << (first_client ? "" : ",") << "\"" << name << "\":{\"gbps\":" << fmt("%.4f", kb::median(s.gbps))
         << ",\"p50_ms\":" << fmt("%.2f", kb::median(s.p50_ms)) << ",\"max_ms\":" << fmt("%.2f", max_ms)
         << ",\"p99_ms\":" << (has_p99 ? fmt("%.2f", p99_ms) : std::string("null"))
         << ",\"batches\":" << n_lat << ",\"cpu_s_per_gb\":" << fmt("%.4f", kb::median(s.cpu_s_per_gb))
         << ",\"minor_faults_per_4k\":" << fmt("%.5f", kb::median(s.faults_per_4k))
         << ",\"peak_rss_delta_kib\":" << fmt("%.0f", kb::median(s.rss_kib))
         << ",\"server_cpu_s_per_gb\":" << fmt("%.4f", kb::median(s.server_cpu_s_per_gb)) << "}";
    first_client = false;
  }
  json << "}";

  // ---- ratios: each kvtier transport against each hiredis variant ---------------------------
  json << ",\"ratios\":{";
  bool first_ratio = true;
  for (const auto& [k, mk] : clients) {
    if (k.rfind("kvtier", 0) != 0) continue;
    for (const auto& [h, mh] : clients) {
      if (h.rfind("hiredis", 0) != 0 && h != "raw_socket_floor") continue;
      const double g = kb::median(stats[k].gbps) / kb::median(stats[h].gbps);
      const double c = kb::median(stats[k].cpu_s_per_gb) / kb::median(stats[h].cpu_s_per_gb);
      std::printf("%s vs %s: GB/s x%.2f, CPU-s/GB x%.2f\n", k.c_str(), h.c_str(), g, c);
      json << (first_ratio ? "" : ",") << "\"" << k << "/" << h << "\":{\"gbps\":" << fmt("%.3f", g)
           << ",\"cpu_per_gb\":" << fmt("%.3f", c) << "}";
      first_ratio = false;
    }
  }
  json << "}";

  // ---- headline: each kvtier client against the best hiredis variant of this run -------------
  std::string best_h;
  for (const auto& [h, mh] : clients)
    if (h.rfind("hiredis", 0) == 0 &&
        (best_h.empty() || kb::median(stats[h].gbps) > kb::median(stats[best_h].gbps)))
      best_h = h;
  if (!best_h.empty()) {
    json << ",\"best_hiredis\":\"" << best_h << "\",\"vs_best_hiredis\":{";
    bool first_best = true;
    for (const auto& [k, mk] : clients) {
      if (k.rfind("kvtier", 0) != 0) continue;
      const double g = kb::median(stats[k].gbps) / kb::median(stats[best_h].gbps);
      const double c = kb::median(stats[k].cpu_s_per_gb) / kb::median(stats[best_h].cpu_s_per_gb);
      std::printf("headline: %s vs the best hiredis variant of this run (%s): GB/s x%.2f, CPU-s/GB x%.2f\n",
                  k.c_str(), best_h.c_str(), g, c);
      json << (first_best ? "" : ",") << "\"" << k << "\":{\"gbps\":" << fmt("%.3f", g)
           << ",\"cpu_per_gb\":" << fmt("%.3f", c) << "}";
      first_best = false;
    }
    json << "}";
  }

  // ---- scaling: N clients -> 1 instance and N clients -> N instances ------------------------
  const auto& [scale_name, scale_make] = clients.front();
  auto aggregate = [&](int n, int instances) {
    std::vector<double> g;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      auto rs = run_group(cfg, scale_make, n, std::span(servers).first(static_cast<std::size_t>(instances)));
      double t0 = rs[0].t_start, t1 = rs[0].t_end, bytes = 0;
      for (auto& r : rs) t0 = std::min(t0, r.t_start), t1 = std::max(t1, r.t_end), bytes += r.bytes;
      g.push_back(bytes / 1e9 / (t1 - t0));
    }
    return kb::median(g);
  };
  if (!cfg.scale.empty()) {
    const double base = aggregate(1, 1);
    std::printf("scaling (%s, aggregate GB/s, median of %d reps): 1 -> 1: %.3f\n", scale_name.c_str(),
                cfg.reps, base);
    json << ",\"scaling\":{\"client\":\"" << scale_name << "\",\"1to1_gbps\":" << fmt("%.4f", base);
    for (int n : cfg.scale) {
      const double to_one = aggregate(n, 1), to_n = aggregate(n, n);
      std::printf("  %d -> 1: %.3f (x%.2f)   %d -> %d: %.3f (x%.2f)\n", n, to_one, to_one / base, n, n, to_n,
                  to_n / base);
      json << ",\"" << n << "to1_ratio\":" << fmt("%.3f", to_one / base) << ",\"" << n << "to" << n
           << "_ratio\":" << fmt("%.3f", to_n / base);
    }
    json << "}";
  }
  json << "}";
  std::printf("%s\n", json.str().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_resp_get: %s\n", e.what());
  return 1;
}
