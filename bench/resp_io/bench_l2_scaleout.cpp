// bench_l2_scaleout: GET GB/s and client CPU per GB of the L2 stores at the scale-out settings,
// side by side in one run: one redis-server (remote_store, the baseline), a 3-master Redis Cluster
// (cluster_store, spread placement) and one redis-server over TLS (remote_store over
// asio_tls_connection, and over uring_tls_connection where kvtier::uring_tls is built). 12.4 MB values,
// batches of 8, every value verified (header + XXH3), the configurations interleaved rep by rep; medians.
// Then the cost of a redirect: a GET that meets a MOVED (patch + map refresh + retry on the new master)
// against the same GET on a fresh map. All servers are loopback children of this process (tests/support
// harness), stopped at exit.
//
//   bench_l2_scaleout [--reps N] [--batch K] [--value-bytes B]
// The last stdout line is one JSON object.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/resp/asio_tls_connection.hpp"
#if KVTIER_BENCH_URING_TLS
#include "kvtier/resp/uring_tls_connection.hpp"
#endif
#include "kvtier/store/cluster_store.hpp"
#include "kvtier/store/remote_store.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/stats.hpp"
#include "support/test_pki.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using kvtier::chunk_key;
using kvtier::chunk_status;

double cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v[i] = static_cast<std::byte>(x);
  }
  return v;
}

// One configuration: a store behind three calls, its samples.
struct config {
  std::string name;
  std::function<std::error_code(std::span<const chunk_key>, std::span<const std::span<const std::byte>>,
                                std::span<chunk_status>)>
      put;
  std::function<std::error_code(std::span<const chunk_key>, std::span<const std::span<std::byte>>,
                                std::span<chunk_status>)>
      get;
  std::function<std::string()> last_error;
  std::vector<double> gbps, cpu_per_gb;
};

template <class Store>
config make_config(std::string name, Store& s) {
  auto dl = [] { return kvtier::deadline_after(std::chrono::seconds(60)); };
  return config{std::move(name),
                [&s, dl](auto k, auto v, auto st) { return s.put(k, v, st, dl()); },
                [&s, dl](auto k, auto d, auto st) { return s.get(k, d, st, dl()); },
                [&s] { return s.last_error(); },
                {},
                {}};
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  std::size_t batch = 8, value_bytes = 12'400'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--reps") reps = std::atoi(argv[i + 1]);
    if (f == "--batch") batch = static_cast<std::size_t>(std::atol(argv[i + 1]));
    if (f == "--value-bytes") value_bytes = static_cast<std::size_t>(std::atol(argv[i + 1]));
  }
  const kvtier::key_namespace ns{.model = "bench-scaleout", .kv_format = "raw", .chunk_tokens = 256};
  std::fprintf(stderr, "bench_l2_scaleout: starting 1 server, a 3-master cluster, 1 TLS server ...\n");
  kvtier::test::redis_server plain;
  kvtier::test::redis_cluster cluster({.masters = 3, .replicas_per_master = 0});
  const kvtier::test::test_pki pki;
  kvtier::test::redis_server tls_srv({.tls_args = pki.server_args("server", /*client_certs=*/false)});

  kvtier::remote_store<kvtier::resp::asio_connection> single(
      ns, {.server = kvtier::resp::parse_url(plain.url()).value});
  auto cu = kvtier::resp::parse_cluster_url(cluster.url());
  kvtier::cluster_store<kvtier::resp::asio_connection> clustered(ns, kvtier::cluster_options_for(cu, 0));
  kvtier::resp::connection_options topt{
      .server = kvtier::resp::parse_url("rediss://127.0.0.1:" + std::to_string(tls_srv.tls_port())).value};
  topt.tls.ca_file = pki.path("ca.pem");
  kvtier::remote_store<kvtier::resp::asio_tls_connection> tls(ns, topt);
#if KVTIER_BENCH_URING_TLS
  kvtier::remote_store<kvtier::resp::uring_tls_connection> uring_tls(ns, topt);
#endif

  std::vector<config> cfgs;
  cfgs.push_back(make_config("standalone (baseline)", single));
  cfgs.push_back(make_config("cluster, 3 masters", clustered));
  cfgs.push_back(make_config("standalone over TLS", tls));
#if KVTIER_BENCH_URING_TLS
  cfgs.push_back(make_config("standalone over TLS, io_uring", uring_tls));
#endif

  std::vector<chunk_key> keys;
  std::vector<std::vector<std::byte>> src, dst;
  for (std::size_t i = 0; i < batch; ++i) {
    keys.push_back(chunk_key{0xbe7c4, i + 1});
    src.push_back(pattern(value_bytes, static_cast<unsigned>(i)));
    dst.emplace_back(value_bytes);
  }
  std::vector<std::span<const std::byte>> s(src.begin(), src.end());
  std::vector<std::span<std::byte>> d(dst.begin(), dst.end());
  std::vector<chunk_status> st(batch);
  for (auto& c : cfgs) {
    if (c.put(keys, s, st) ||
        std::any_of(st.begin(), st.end(), [](auto x) { return x != chunk_status::stored; })) {
      std::fprintf(stderr, "bench_l2_scaleout: %s: put failed: %s\n", c.name.c_str(), c.last_error().c_str());
      return 1;
    }
  }
  const double gb = static_cast<double>(batch * value_bytes) / 1e9;
  for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms the connections up
    for (auto& c : cfgs) {
      const double c0 = cpu_s();
      const auto t0 = clock_type::now();
      const std::error_code ec = c.get(keys, d, st);
      const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
      const double cpu = cpu_s() - c0;
      for (std::size_t i = 0; i < batch; ++i) {
        if (ec || st[i] != chunk_status::hit || dst[i] != src[i]) {
          std::fprintf(stderr, "bench_l2_scaleout: %s: key %zu not a verified hit: %s\n", c.name.c_str(), i,
                       c.last_error().c_str());
          return 1;
        }
      }
      if (rep == 0) continue;
      c.gbps.push_back(gb / secs);
      c.cpu_per_gb.push_back(cpu / gb);
    }
  }

  // Redirect cost: slot S (empty) moves between two masters; a store with the old map meets MOVED.
  const std::string tag = "bench-redirect";
  const unsigned slot = kvtier::resp::hash_slot(tag);
  auto opt = kvtier::cluster_options_for(cu, 0);
  opt.hash_tag = tag;
  kvtier::cluster_store<kvtier::resp::asio_connection> moved_store(ns, opt);
  std::vector<std::size_t> masters;
  for (std::size_t i = 0; i < cluster.size(); ++i) masters.push_back(i);
  std::vector<double> steady_ms, moved_ms;
  const chunk_key probe_key{0xbe7c5, 1};
  std::vector<std::byte> small(1000);
  std::span<std::byte> small_span(small);
  chunk_status one{};
  auto timed_get = [&] {
    const auto t0 = clock_type::now();
    (void)moved_store.get(std::span(&probe_key, 1), std::span(&small_span, 1), std::span(&one, 1),
                          kvtier::deadline_after(std::chrono::seconds(10)));
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  };
  for (int rep = 0; rep < 3 * reps; ++rep) {
    (void)timed_get();
    steady_ms.push_back(timed_get());  // the map is current: one round trip
    const std::size_t from = cluster.master_of_slot(slot);
    const std::size_t to = masters[(from + 1) % masters.size()];
    if (!cluster.move_empty_slot(static_cast<unsigned>(slot), to)) {
      std::fprintf(stderr, "bench_l2_scaleout: slot %u did not move\n", slot);
      return 1;
    }
    moved_ms.push_back(timed_get());  // MOVED, patch, refresh, retry
  }
  const auto rs = moved_store.stats();

  const double base = kvtier_bench::median(cfgs[0].gbps);
  std::printf("GET %zu x %.1f MB per batch, loopback, every value verified, median of %d reps\n", batch,
              static_cast<double>(value_bytes) / 1e6, reps);
  std::printf("%-32s %9s %12s %10s\n", "configuration", "GB/s", "CPU-s/GB", "vs base");
  std::string js = "{\"bench\":\"l2_scaleout\",\"batch\":" + std::to_string(batch) +
                   ",\"value_bytes\":" + std::to_string(value_bytes) + ",\"reps\":" + std::to_string(reps) +
                   ",\"configs\":{";
  for (std::size_t i = 0; i < cfgs.size(); ++i) {
    const double g = kvtier_bench::median(cfgs[i].gbps), c = kvtier_bench::median(cfgs[i].cpu_per_gb);
    std::printf("%-32s %9.3f %12.3f %9.2fx\n", cfgs[i].name.c_str(), g, c, g / base);
    char b[256];
    std::snprintf(b, sizeof b, "%s\"%s\":{\"gbps\":%.4f,\"cpu_s_per_gb\":%.4f,\"ratio\":%.3f}", i ? "," : "",
                  cfgs[i].name.c_str(), g, c, g / base);
    js += b;
  }
  const double st_ms = kvtier_bench::median(steady_ms), mv_ms = kvtier_bench::median(moved_ms);
  std::printf(
      "redirect: GET of 1 key on a current map %.3f ms, after a slot moved (MOVED + refresh + retry) "
      "%.3f ms: +%.3f ms (%llu redirects, %llu map loads)\n",
      st_ms, mv_ms, mv_ms - st_ms, static_cast<unsigned long long>(rs.redirects),
      static_cast<unsigned long long>(rs.map_refreshes));
  char b[256];
  std::snprintf(b, sizeof b, "},\"redirect\":{\"steady_ms\":%.4f,\"moved_ms\":%.4f,\"extra_ms\":%.4f}}",
                st_ms, mv_ms, mv_ms - st_ms);
  js += b;
  std::printf("%s\n", js.c_str());
  return 0;
}
