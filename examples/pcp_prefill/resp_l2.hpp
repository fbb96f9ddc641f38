// examples/pcp_prefill/resp_l2.hpp: L2 on real Redis-protocol servers
// (`--l2 resp://host:{rank+6400}` or one shared `resp://host:6379`).
//
// Each rank gets a small pool of kvtier::remote_store<asio_connection>, one
// connection per concurrent user (fetch workers, the step, the write-behind
// thread), because a remote_store serialises the calls on its connection.
//
//   auto pools = pcp::make_resp_pools("resp://127.0.0.1:{rank+6400}", 2, ns, 4);
#pragma once

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/url.hpp"
#include "kvtier/store/remote_store.hpp"

namespace pcp {

class resp_pool {
 public:
  using store_t = kvtier::remote_store<kvtier::resp::asio_connection>;
  resp_pool(const kvtier::key_namespace& ns, const kvtier::resp::endpoint& server, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      stores_.push_back(std::make_unique<store_t>(ns, kvtier::resp::connection_options{.server = server}));
  }
  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline dl) {
    return next().exists(keys, status, dl);
  }
  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    return next().get(keys, dst, status, dl);
  }
  std::error_code put(std::span<const kvtier::chunk_key> keys,
                      std::span<const std::span<const std::byte>> src, std::span<kvtier::chunk_status> status,
                      kvtier::deadline dl) {
    return next().put(keys, src, status, dl);
  }
  kvtier::remote_store_stats stats() const {
    kvtier::remote_store_stats s;
    for (const auto& st : stores_) {
      const auto x = st->stats();
      s.hits += x.hits, s.misses += x.misses, s.corrupt += x.corrupt, s.timeouts += x.timeouts;
      s.errors += x.errors, s.bytes_fetched += x.bytes_fetched, s.bytes_stored += x.bytes_stored;
    }
    return s;
  }

 private:
  store_t& next() { return *stores_[k_.fetch_add(1, std::memory_order_relaxed) % stores_.size()]; }
  std::vector<std::unique_ptr<store_t>> stores_;
  std::atomic<std::size_t> k_{0};
};
static_assert(kvtier::chunk_store<resp_pool>);

/// One pool per rank: rank r's URL is `url` with {rank} / {rank+N} expanded.
/// Throws std::invalid_argument with the URL parser's message.
inline std::vector<std::unique_ptr<resp_pool>> make_resp_pools(const std::string& url, std::uint32_t world,
                                                               const kvtier::key_namespace& ns,
                                                               std::size_t per_rank) {
  std::vector<std::unique_ptr<resp_pool>> out;
  for (std::uint32_t r = 0; r < world; ++r) {
    const auto parsed = kvtier::resp::parse_url(url, static_cast<int>(r));
    if (!parsed) throw std::invalid_argument("--l2: " + parsed.message);
    out.push_back(std::make_unique<resp_pool>(ns, parsed.value, per_rank));
  }
  return out;
}

}  // namespace pcp
