// examples/pcp_prefill/resp_l2.hpp: L2 on real Redis-protocol servers
// (`--l2 resp://host:{rank+6400}` or one shared `resp://host:6379`).
//
// Each rank gets one kvtier::remote_store<asio_connection>; its connection pool
// (kvtier/resp/pool.hpp) gives every concurrent user (fetch workers, the step, the
// write-behind thread) a connection of its own, one kept for small calls.
//
//   auto l2 = pcp::make_resp_l2s("resp://127.0.0.1:{rank+6400}", 2, ns, 4);
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/url.hpp"
#include "kvtier/store/remote_store.hpp"

namespace pcp {

using resp_l2 = kvtier::remote_store<kvtier::resp::asio_connection>;

/// One store per rank: rank r's URL is `url` with {rank} / {rank+N} expanded, and its pool has
/// `connections` connections. Throws std::invalid_argument with the URL parser's message.
inline std::vector<std::unique_ptr<resp_l2>> make_resp_l2s(const std::string& url, std::uint32_t world,
                                                           const kvtier::key_namespace& ns,
                                                           std::size_t connections) {
  std::vector<std::unique_ptr<resp_l2>> out;
  for (std::uint32_t r = 0; r < world; ++r) {
    const auto parsed = kvtier::resp::parse_url(url, static_cast<int>(r));
    if (!parsed) throw std::invalid_argument("--l2: " + parsed.message);
    out.push_back(std::make_unique<resp_l2>(ns, kvtier::resp::connection_options{.server = parsed.value},
                                            kvtier::resp::pool_options{.connections = connections}));
  }
  return out;
}

}  // namespace pcp
