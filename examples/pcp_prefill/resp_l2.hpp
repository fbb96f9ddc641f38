// examples/pcp_prefill/resp_l2.hpp: L2 on real Redis-protocol servers. `--l2` takes:
//   resp://host:{rank+6400}                  one server per rank (or one shared resp://host:6379)
//   resp://h:{rank+6400},resp://h:{rank+6500} a rank's partition over K servers (rendezvous hash)
//   resp+cluster://h:p,h:p[?placement=pinned] a Redis/Valkey Cluster (spread over every master, or
//                                             one master per rank with a hash tag per rank)
//   rediss://, resp+tls://, resp+cluster+tls:// the same over TLS (PCP_HAVE_TLS builds: link
//                                             kvtier::tls), with the CA and client certificate
//                                             from `tls`; plain and TLS servers may not be mixed
// Every store has a connection pool per server (kvtier/resp/pool.hpp), so each concurrent user
// (fetch workers, the step, the write-behind thread) gets a connection of its own.
//
//   auto l2 = pcp::make_resp_l2s("resp+cluster://127.0.0.1:7000", 2, ns, 4);
//   auto l2 = pcp::make_resp_l2s("resp+tls://10.0.0.5:{rank+6400}", 8, ns, 4, {.ca_file = "ca.pem"});
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#if defined(PCP_HAVE_TLS)
#include "kvtier/resp/asio_tls_connection.hpp"
#endif
#include "kvtier/resp/cluster.hpp"
#include "kvtier/resp/url.hpp"
#include "kvtier/store/cluster_store.hpp"
#include "kvtier/store/remote_store.hpp"
#include "kvtier/store/rendezvous_store.hpp"

namespace pcp {

/// One rank's L2: a server, K servers, or a cluster, behind the chunk_store interface.
class resp_l2 {
 public:
#if defined(PCP_HAVE_TLS)
  // Speaks TLS to rediss:// endpoints and plain RESP to resp:// ones (the TLS context is made at
  // the first TLS connect), so one type serves both.
  using connection_t = kvtier::resp::asio_tls_connection;
  static constexpr bool has_tls = true;
#else
  using connection_t = kvtier::resp::asio_connection;
  static constexpr bool has_tls = false;
#endif
  using single_t = kvtier::remote_store<connection_t>;
  using cluster_t = kvtier::cluster_store<connection_t>;
  using spread_t = kvtier::rendezvous_store<single_t>;

  /// Rank `rank`'s store for `url` (see the header comment), `connections` per server, `tls` for
  /// TLS endpoints. Throws std::invalid_argument with the URL parser's message, or when the URL
  /// asks for TLS that this build lacks or mixes TLS and plain servers. `format`: the values'
  /// format; version 2 (layer groups, read group-major by get_by_group) needs one server.
  resp_l2(const std::string& url, int rank, const kvtier::key_namespace& ns, std::size_t connections,
          const kvtier::resp::tls_options& tls = {}, kvtier::value_format format = kvtier::value_format::v1())
      : format_(format) {
    const bool grouped = format.version != 1;
    const kvtier::resp::pool_options pool{.connections = connections};
    const kvtier::resp::connection_options base{.tls = tls};
    if (kvtier::resp::is_cluster_url(url)) {
      const auto u = kvtier::resp::parse_cluster_url(url);
      if (!u) throw std::invalid_argument("--l2: " + u.message);
      if (grouped)
        throw std::invalid_argument("--l2: layer-group reads need one server per rank, not a cluster");
      require_tls_support(!u.seeds.empty() && u.seeds.front().tls, url);
      auto opt = kvtier::cluster_options_for(u, rank, base);
      opt.pool = pool;
      store_ = std::make_unique<cluster_t>(ns, std::move(opt));
      return;
    }
    bool first_tls = false;
    for (std::size_t from = 0;;) {
      const std::size_t comma = url.find(',', from);
      const auto parsed = kvtier::resp::parse_url(url.substr(from, comma - from), rank);
      if (!parsed) throw std::invalid_argument("--l2: " + parsed.message);
      require_tls_support(parsed.value.tls, url);
      if (singles_.empty()) first_tls = parsed.value.tls;
      if (parsed.value.tls != first_tls)
        throw std::invalid_argument("--l2 '" + kvtier::resp::redact_url(url) +
                                    "': mixes TLS and plain servers in one list (use one kind)");
      auto opt = base;
      opt.server = parsed.value;
      singles_.push_back(std::make_unique<single_t>(ns, std::move(opt), pool, format));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
    if (singles_.size() == 1) return;
    if (grouped) throw std::invalid_argument("--l2: layer-group reads need one server per rank, not a list");
    std::vector<single_t*> parts;
    for (auto& s : singles_) parts.push_back(s.get());
    store_ = std::make_unique<spread_t>(std::move(parts));
  }

  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline dl) {
    return visit([&](auto& s) { return s.exists(keys, status, dl); });
  }
  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    return visit([&](auto& s) { return s.get(keys, dst, status, dl); });
  }
  std::error_code put(std::span<const kvtier::chunk_key> keys,
                      std::span<const std::span<const std::byte>> src, std::span<kvtier::chunk_status> status,
                      kvtier::deadline dl) {
    return visit([&](auto& s) { return s.put(keys, src, status, dl); });
  }

  /// get(), read group-major (one server: remote_store::get_by_group; see the constructor).
  std::error_code get_by_group(std::span<const kvtier::chunk_key> keys,
                               std::span<const std::span<std::byte>> dst,
                               std::span<kvtier::chunk_status> status, kvtier::deadline dl,
                               const std::function<void(std::span<const std::size_t>)>& on_round = {}) {
    ++grouped_gets_;
    return singles_.front()->get_by_group(keys, dst, status, dl, on_round);
  }
  kvtier::value_format format() const { return format_; }
  /// get_by_group calls so far (a load that streamed by layer group made at least one).
  std::uint64_t grouped_gets() const { return grouped_gets_.load(); }

  /// The last failure in words, with the server's own text where it sent one.
  std::string last_error() const {
    if (const auto* c = std::get_if<std::unique_ptr<cluster_t>>(&store_)) return (*c)->last_error();
    std::string e;
    for (const auto& one : singles_)
      if (e.empty()) e = one->last_error();
    return e;
  }

  /// Counters summed over the servers.
  kvtier::remote_store_stats stats() const {
    if (const auto* c = std::get_if<std::unique_ptr<cluster_t>>(&store_)) return (*c)->stats();
    kvtier::remote_store_stats s;
    for (const auto& one : singles_) {
      const auto x = one->stats();
      s.hits += x.hits, s.misses += x.misses, s.corrupt += x.corrupt, s.timeouts += x.timeouts;
      s.errors += x.errors, s.bytes_fetched += x.bytes_fetched, s.bytes_stored += x.bytes_stored;
    }
    return s;
  }

 private:
  static void require_tls_support(bool tls, const std::string& url) {
    if (tls && !has_tls)
      throw std::invalid_argument("--l2 '" + kvtier::resp::redact_url(url) +
                                  "': TLS needs a build with kvtier::tls (install libssl-dev and rebuild)");
  }

  template <class F>
  std::error_code visit(F&& f) {
    if (auto* c = std::get_if<std::unique_ptr<cluster_t>>(&store_)) return f(**c);
    if (auto* r = std::get_if<std::unique_ptr<spread_t>>(&store_)) return f(**r);
    return f(*singles_.front());
  }

  kvtier::value_format format_;
  std::atomic<std::uint64_t> grouped_gets_{0};
  std::vector<std::unique_ptr<single_t>> singles_;
  std::variant<std::monostate, std::unique_ptr<cluster_t>, std::unique_ptr<spread_t>> store_;
};
static_assert(kvtier::group_streaming_store<resp_l2>);

/// One store per rank (rank r's URL templates expanded with r); null for a rank that `hosted`
/// says lives in another process (ranks as processes: each builds only its own).
inline std::vector<std::unique_ptr<resp_l2>> make_resp_l2s(
    const std::string& url, std::uint32_t world, const kvtier::key_namespace& ns, std::size_t connections,
    const kvtier::resp::tls_options& tls = {},
    const std::function<bool(std::uint32_t)>& hosted = [](std::uint32_t) { return true; },
    kvtier::value_format format = kvtier::value_format::v1()) {
  std::vector<std::unique_ptr<resp_l2>> out;
  for (std::uint32_t r = 0; r < world; ++r)
    out.push_back(hosted(r)
                      ? std::make_unique<resp_l2>(url, static_cast<int>(r), ns, connections, tls, format)
                      : nullptr);
  return out;
}

}  // namespace pcp
