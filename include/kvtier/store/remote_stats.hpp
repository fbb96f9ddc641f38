// kvtier/store/remote_stats.hpp: the counters of the Redis-protocol stores (remote_store,
// cluster_store).
//
//   const kvtier::remote_store_stats s = l2.stats();
//   std::cout << s.hits << " hits, " << s.corrupt << " corrupt, " << s.redirects << " redirects\n";
#pragma once

#include <cstdint>

namespace kvtier {

/// Counters of a remote store (monotonic since construction; read with relaxed loads).
struct remote_store_stats {
  std::uint64_t hits = 0;           ///< get: verified values delivered
  std::uint64_t misses = 0;         ///< get: key absent
  std::uint64_t corrupt = 0;        ///< get: all rejected values (sum of the four below)
  std::uint64_t wrong_length = 0;   ///< get: stored length differs from the destination's
  std::uint64_t bad_header = 0;     ///< get: magic/version/header checksum/namespace/key mismatch
  std::uint64_t bad_checksum = 0;   ///< get: payload (or a group's) checksum mismatch
  std::uint64_t other_format = 0;   ///< get: a version-1 value read by a version-2 store
  std::uint64_t timeouts = 0;       ///< calls that hit their deadline
  std::uint64_t errors = 0;         ///< calls lost to connection/protocol errors, and error replies
  std::uint64_t bytes_fetched = 0;  ///< payload bytes of hits
  std::uint64_t bytes_stored = 0;   ///< payload bytes of successful puts
  std::uint64_t redirects = 0;      ///< cluster: MOVED and ASK replies followed
  std::uint64_t retries = 0;        ///< cluster: TRYAGAIN / CLUSTERDOWN / lost-node rounds retried
  std::uint64_t map_refreshes = 0;  ///< cluster: slot map reloads
  /// Calls failed at once, without I/O, because their server was down (a refused connect in
  /// backoff, or the breaker tripped on timeouts in a row: resp/pool.hpp); counted in timeouts
  /// or errors too. A skipped save is one of them.
  std::uint64_t down_refusals = 0;
  std::uint64_t breaker_trips = 0;  ///< times a server's breaker tripped on silence (timeouts in a row)
};

}  // namespace kvtier
