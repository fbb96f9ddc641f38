// kvtier/store/chunk_store.hpp: the contract every chunk store meets.
//
// A store holds opaque chunk payloads under chunk keys. All calls are batched
// (one call per rank per request, not per chunk), take an absolute deadline, and
// report one status per key in a caller-provided span; they never throw on I/O.
//
//   std::vector<kvtier::chunk_status> st(keys.size());
//   std::error_code ec = store.get(keys, destinations, st, kvtier::deadline_after(50ms));
//   // st[i] == chunk_status::hit  -> destinations[i] holds exactly the stored bytes
//   // anything else               -> destinations[i] must not be used (recompute it)
//
// Contract for every implementation:
//  - status.size() == keys.size() (and == dst/src size); a size mismatch is
//    errc::invalid_argument and no key is touched.
//  - get: dst[i].size() is the payload length the caller expects. A stored value
//    of another length is chunk_status::corrupt, never a partial copy reported as
//    a hit. Bytes in a non-hit destination are unspecified and never reported.
//  - The returned error_code is empty when the call itself worked (misses are not
//    errors). A whole-batch failure (connection lost, deadline passed) returns the
//    code AND marks every unfinished key timeout or error: no key is left unset.
//  - The call returns by its deadline (plus scheduling noise), whatever the peer does.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"

namespace kvtier {

/// Outcome for one key of a batched store call.
enum class chunk_status : std::uint8_t {
  hit,        ///< present (exists) / bytes delivered and verified (get) / stored (put)
  miss,       ///< not present
  corrupt,    ///< present but failed the header, length or checksum check
  timeout,    ///< the deadline passed before this key finished
  error,      ///< I/O or server error for this key
  cancelled,  ///< the request was cancelled before this key finished
};

constexpr std::string_view to_string(chunk_status s) noexcept {
  switch (s) {
    case chunk_status::hit:
      return "hit";
    case chunk_status::miss:
      return "miss";
    case chunk_status::corrupt:
      return "corrupt";
    case chunk_status::timeout:
      return "timeout";
    case chunk_status::error:
      return "error";
    case chunk_status::cancelled:
      return "cancelled";
  }
  return "unknown";
}

/// The batched store interface: exists, get into caller spans, put from caller spans.
template <class S>
concept chunk_store = requires(S& s, std::span<const chunk_key> keys,
                               std::span<const std::span<std::byte>> dst,
                               std::span<const std::span<const std::byte>> src,
                               std::span<chunk_status> status, deadline dl) {
  { s.exists(keys, status, dl) } -> std::same_as<std::error_code>;
  { s.get(keys, dst, status, dl) } -> std::same_as<std::error_code>;
  { s.put(keys, src, status, dl) } -> std::same_as<std::error_code>;
};

}  // namespace kvtier
