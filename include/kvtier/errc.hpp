// kvtier/errc.hpp: the error codes of every kvtier I/O path.
//
// Every operation that can fail without it being a programming error returns a
// std::error_code whose category is kvtier::error_category(). Compare with the
// enum directly:
//
//   std::error_code ec = store.get(keys, dst, status, deadline_after(50ms));
//   if (ec == kvtier::errc::timeout) { /* recompute from the first missing chunk */ }
#pragma once

#include <string>
#include <system_error>

namespace kvtier {

enum class errc : int {
  timeout = 1,          ///< the caller's deadline passed first
  connection_lost,      ///< the peer closed or reset the connection mid-request
  connection_refused,   ///< nothing listens at the address, or connect failed
  resolve_failed,       ///< the host name did not resolve
  not_connected,        ///< the operation needs a live connection and there is none
  protocol_error,       ///< the peer sent bytes that are not valid RESP
  server_error,         ///< the server answered with an error reply
  unexpected_reply,     ///< a valid reply of the wrong type or shape
  too_large,            ///< a length, count or depth exceeds a configured limit
  corrupt_value,        ///< a stored value failed its header or checksum check
  wrong_length,         ///< a stored value's length differs from the destination's
  auth_failed,          ///< AUTH or HELLO was rejected
  cancelled,            ///< the caller cancelled the request
  shutdown,             ///< the component is shutting down; the request was drained
  queue_full,           ///< back-pressure: too many requests or bytes in flight
  bad_url,              ///< a server URL could not be parsed
  invalid_argument,     ///< a caller-supplied argument is out of range
  collective_mismatch,  ///< ranks issued different collectives (would deadlock)
  backend_error,        ///< an error reported by NCCL, CUDA or the OS
  tls_failed,           ///< the TLS handshake or the peer's certificate check failed
  resource_exhausted,   ///< no free buffer: every slot of a pinned_arena is in use
  store_threw,          ///< a store's call threw an exception (its words, when kept, say which)
};

namespace detail {
class errc_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "kvtier"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::timeout:
        return "deadline exceeded";
      case errc::connection_lost:
        return "connection lost";
      case errc::connection_refused:
        return "connection refused";
      case errc::resolve_failed:
        return "host name did not resolve";
      case errc::not_connected:
        return "not connected";
      case errc::protocol_error:
        return "RESP protocol error";
      case errc::server_error:
        return "server replied with an error";
      case errc::unexpected_reply:
        return "reply of unexpected type or shape";
      case errc::too_large:
        return "length, count or depth over the configured limit";
      case errc::corrupt_value:
        return "stored value failed its integrity check";
      case errc::wrong_length:
        return "stored value has the wrong length";
      case errc::auth_failed:
        return "authentication failed";
      case errc::cancelled:
        return "cancelled";
      case errc::shutdown:
        return "shut down";
      case errc::queue_full:
        return "too many requests or bytes in flight";
      case errc::bad_url:
        return "malformed server URL";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::collective_mismatch:
        return "ranks issued mismatched collectives";
      case errc::backend_error:
        return "backend (NCCL/CUDA/OS) error";
      case errc::tls_failed:
        return "TLS handshake or certificate check failed";
      case errc::resource_exhausted:
        return "no free buffer (every pinned arena slot is in use)";
      case errc::store_threw:
        return "the store threw an exception";
    }
    return "unknown kvtier error " + std::to_string(value);
  }
};
}  // namespace detail

/// The category of every kvtier::errc value.
inline const std::error_category& error_category() noexcept {
  static const detail::errc_category category;
  return category;
}

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

}  // namespace kvtier

template <>
struct std::is_error_code_enum<kvtier::errc> : std::true_type {};
