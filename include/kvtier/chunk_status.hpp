// kvtier/chunk_status.hpp: the per-key outcome of a batched store call.
//
// A top-level header (not in store/) so that detail/ helpers and the fetch
// queue's public types can use it without depending on store/ (store/ depends
// on detail/, never the other way).
//
//   std::vector<kvtier::chunk_status> st(keys.size());
//   store.get(keys, destinations, st, dl);
//   if (st[0] == kvtier::chunk_status::hit) use(destinations[0]);
#pragma once

#include <cstdint>
#include <string_view>

namespace kvtier {

/// Outcome for one key of a batched store call.
enum class chunk_status : std::uint8_t {
  hit,        ///< present (exists) / bytes delivered and verified (get)
  miss,       ///< not present
  corrupt,    ///< present but failed the header, length or checksum check
  timeout,    ///< the deadline passed before this key finished
  error,      ///< I/O or server error for this key
  cancelled,  ///< the request was cancelled before this key finished
  stored,     ///< put: the value was written
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
    case chunk_status::stored:
      return "stored";
  }
  return "unknown";
}

}  // namespace kvtier
