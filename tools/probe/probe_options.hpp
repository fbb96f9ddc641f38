// tools/probe/probe_options.hpp: kvtier-probe's command line.
//
//   probe_options o;
//   std::string err = parse_probe_options(argc, argv, o);   // empty on success
//   if (!err.empty()) { print err and probe_usage(); exit 2 }
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/resp/cluster.hpp"

namespace kvtier_probe {

struct probe_options {
  std::string url;                        ///< template, e.g. resp://127.0.0.1:{rank+6400}
  int instances = 0;                      ///< ranks 0..instances-1 substituted into url
  std::uint64_t chunk_bytes = 0;          ///< bytes per value
  int batch = 0;                          ///< keys per pipelined GET batch
  int rounds = 0;                         ///< batches per instance at each batch size
  int timeout_ms = 0;                     ///< deadline of every connect and batch
  double bytes_per_token = 0;             ///< S (0: not given)
  double prefill_tokens_per_s = 0;        ///< R (0: not given)
  std::string transport = "asio";         ///< asio | uring
  std::string tls_ca, tls_cert, tls_key;  ///< rediss:// / resp+tls://: CA file, client cert and key
  std::string password_file;              ///< the password's file (else KVTIER_PASSWORD, else the URL's)
  bool json = false;
  bool help = false;
};

inline constexpr std::string_view probe_usage =
    "usage: kvtier-probe --url TEMPLATE --instances N --chunk-bytes B --batch K --rounds M --timeout-ms T\n"
    "                    [--bytes-per-token S --prefill-tokens-per-s R] [--transport asio|uring]\n"
    "                    [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] [--password-file PATH] [--json]\n"
    "\n"
    "Measures a RESP tier (Redis or Valkey): writes its own keys under a random kvtier-probe: prefix on\n"
    "every instance, reads them back in batches from all instances in parallel, verifies every byte,\n"
    "and deletes them again (also on Ctrl-C; they also carry a 1 h expiry as a safety net).\n"
    "\n"
    "  --url TEMPLATE          resp://[user[:password]@]host:port[/db] or resp+unix:///path; {rank} is\n"
    "                          replaced by the instance number, {rank+N} as the port gives port N+rank;\n"
    "                          rediss:// or resp+tls:// for TLS; resp+cluster://host:port[,host:port...]\n"
    "                          for a Redis/Valkey Cluster: checks that all 16384 slots are served and\n"
    "                          measures each master (one thread each; --instances is then not needed);\n"
    "                          resp+cluster+tls:// for a cluster over TLS (--tls-cluster yes);\n"
    "                          the password is printed as *** everywhere\n"
    "  --password-file PATH    the password is the file's first line (keeps it out of argv); without\n"
    "                          it and without a password in --url, KVTIER_PASSWORD is used when set\n"
    "  --instances N           instances 0..N-1, one thread each\n"
    "  --chunk-bytes B         bytes per value (one KV chunk; 12400000 for a 256-token MLA chunk)\n"
    "  --batch K               keys per pipelined batch; batches of K, K/2, ... 1 are measured and T0\n"
    "                          and B fitted over all of them (least squares, with 95% intervals)\n"
    "  --rounds M              batches per instance at each batch size\n"
    "  --timeout-ms T          deadline for every connect and every batch; when one fails, the probe\n"
    "                          exits (status 1) by that call's deadline plus at most min(T/10, 200 ms)\n"
    "                          for deleting the keys on the other instances\n"
    "  --bytes-per-token S     KV bytes per token (e.g. 48400)      } both: break-even bandwidth, the\n"
    "  --prefill-tokens-per-s R  prefill speed of a node on a miss } profitable prompt length, instances\n"
    "  --transport asio|uring  connection implementation (default asio; both speak TLS)\n"
    "  --tls-ca FILE           CA certificates (PEM) that sign the servers' certificates (default: the\n"
    "                          system's); the server name is always verified\n"
    "  --tls-cert FILE, --tls-key FILE  a client certificate and its key, for servers that ask for one\n"
    "  --json                  the last stdout line is one JSON object\n";

namespace detail {

template <class T>
bool parse_number(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [p, e] = std::from_chars(s.data(), s.data() + s.size(), out);
  return e == std::errc{} && p == s.data() + s.size();
}

}  // namespace detail

/// Parses argv into `o`; returns an empty string or a message naming the bad flag.
inline std::string parse_probe_options(int argc, const char* const* argv, probe_options& o) {
  bool seen_url = false, seen_inst = false, seen_chunk = false, seen_batch = false, seen_rounds = false,
       seen_timeout = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--json") {
      o.json = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      return {};
    }
    auto is = [&](std::string_view name) { return flag == name; };
    const bool known = is("--url") || is("--instances") || is("--chunk-bytes") || is("--batch") ||
                       is("--rounds") || is("--timeout-ms") || is("--bytes-per-token") ||
                       is("--prefill-tokens-per-s") || is("--transport") || is("--tls-ca") ||
                       is("--tls-cert") || is("--tls-key") || is("--password-file");
    if (!known) return "unknown flag '" + std::string(flag) + "'";
    if (i + 1 >= argc) return std::string(flag) + " needs a value";
    std::string_view v = argv[++i];
    auto positive_int = [&](int& out, long long max) -> std::string {
      long long x = 0;
      if (!detail::parse_number(v, x) || x < 1 || x > max)
        return std::string(flag) + " needs a whole number in 1.." + std::to_string(max) + ", got '" +
               std::string(v) + "'";
      out = static_cast<int>(x);
      return {};
    };
    auto positive_real = [&](double& out) -> std::string {
      if (!detail::parse_number(v, out) || !(out > 0) || out > 1e18)
        return std::string(flag) + " needs a positive number, got '" + std::string(v) + "'";
      return {};
    };
    std::string err;
    if (is("--url")) {
      if (v.empty()) return "--url needs a non-empty URL template";
      o.url = std::string(v), seen_url = true;
    } else if (is("--instances")) {
      err = positive_int(o.instances, 1024), seen_inst = true;
    } else if (is("--chunk-bytes")) {
      std::uint64_t x = 0;
      // Redis's default proto-max-bulk-len is 512 MB; a larger value could never be stored.
      if (!detail::parse_number(v, x) || x < 1 || x > (512ull << 20))
        return "--chunk-bytes needs a whole number of bytes in 1..536870912, got '" + std::string(v) + "'";
      o.chunk_bytes = x, seen_chunk = true;
    } else if (is("--batch")) {
      err = positive_int(o.batch, 4096), seen_batch = true;
    } else if (is("--rounds")) {
      err = positive_int(o.rounds, 1000000), seen_rounds = true;
    } else if (is("--timeout-ms")) {
      err = positive_int(o.timeout_ms, 3600000), seen_timeout = true;
    } else if (is("--bytes-per-token")) {
      err = positive_real(o.bytes_per_token);
    } else if (is("--prefill-tokens-per-s")) {
      err = positive_real(o.prefill_tokens_per_s);
    } else if (is("--password-file")) {
      if (v.empty()) return "--password-file needs a path";
      o.password_file = std::string(v);
    } else if (is("--transport")) {
      if (v != "asio" && v != "uring")
        return "--transport must be asio or uring, got '" + std::string(v) + "'";
      o.transport = std::string(v);
    } else if (is("--tls-ca")) {
      o.tls_ca = std::string(v);
    } else if (is("--tls-cert")) {
      o.tls_cert = std::string(v);
    } else if (is("--tls-key")) {
      o.tls_key = std::string(v);
    }
    if (!err.empty()) return err;
  }
  std::string missing;
  auto need = [&](bool seen, const char* name) {
    if (!seen) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  // A cluster's masters are the instances: their number comes from its slot map.
  if (kvtier::resp::is_cluster_url(o.url) && !seen_inst) seen_inst = true, o.instances = 1;
  need(seen_url, "--url"), need(seen_inst, "--instances"), need(seen_chunk, "--chunk-bytes");
  need(seen_batch, "--batch"), need(seen_rounds, "--rounds"), need(seen_timeout, "--timeout-ms");
  if (!missing.empty()) return "missing required flag(s): " + missing;
  if ((o.bytes_per_token > 0) != (o.prefill_tokens_per_s > 0))
    return "--bytes-per-token and --prefill-tokens-per-s go together: give both or neither";
  if (static_cast<long long>(o.rounds) * o.instances > 10'000'000)
    return "--rounds x --instances must stay below 10,000,000 (latency samples are kept in memory)";
  // Memory: the expected values and the destinations, per instance.
  const double per_instance = 2.0 * static_cast<double>(o.chunk_bytes) * (o.batch < 2 ? 2 : o.batch);
  if (per_instance * o.instances > 64e9)
    return "--instances x --batch x --chunk-bytes needs over 64 GB of client memory; use fewer or smaller";
  return {};
}

}  // namespace kvtier_probe
