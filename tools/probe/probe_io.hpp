// tools/probe/probe_io.hpp: the RESP commands kvtier-probe (and bench_resp_get) issue, over either
// of kvtier's connections.
//
//   auto c = kvtier_probe::make_instance_client("asio", endpoint, std::chrono::seconds(2));
//   std::error_code ec = c->connect(dl);                   // connect + PING
//   ec = c->get(keys, destinations, outcomes, dl);          // one pipelined batch of GETs
//   if (ec) std::cerr << ec.message() << ": " << c->detail();
//
// Every call is one pipelined batch and returns by its deadline (the connection's guarantee).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/cluster.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/url.hpp"
#if KVTIER_PROBE_HAS_URING
#include "kvtier/resp/uring_connection.hpp"
#endif
#if KVTIER_PROBE_HAS_TLS
#include "kvtier/resp/asio_tls_connection.hpp"
#endif
#if KVTIER_PROBE_HAS_URING_TLS
#include "kvtier/resp/uring_tls_connection.hpp"
#endif

namespace kvtier_probe {

/// What one GET of a batch found.
enum class get_outcome : std::uint8_t { ok, missing, wrong_length, server_error, unexpected_reply };

constexpr std::string_view to_string(get_outcome o) noexcept {
  switch (o) {
    case get_outcome::ok:
      return "ok";
    case get_outcome::missing:
      return "missing";
    case get_outcome::wrong_length:
      return "wrong length";
    case get_outcome::server_error:
      return "server error";
    case get_outcome::unexpected_reply:
      return "unexpected reply";
  }
  return "unknown";
}

/// One instance's connection, as the probe uses it. Not thread-safe (one thread per instance).
class instance_client {
 public:
  virtual ~instance_client() = default;
  /// Connects (handshake included) and checks the server answers PING with PONG.
  virtual std::error_code connect(kvtier::deadline dl) = 0;
  /// How many of `keys` exist (one EXISTS with every key).
  virtual std::error_code exists(std::span<const std::string> keys, std::size_t& present,
                                 kvtier::deadline dl) = 0;
  /// SET keys[i] values[i], each followed by PEXPIRE ttl_ms, in one pipelined batch.
  virtual std::error_code set(std::span<const std::string> keys,
                              std::span<const std::span<const std::byte>> values, std::uint64_t ttl_ms,
                              kvtier::deadline dl) = 0;
  /// GET keys[i] straight into dst[i] (whose size is the expected length), one batch.
  virtual std::error_code get(std::span<const std::string> keys, std::span<const std::span<std::byte>> dst,
                              std::span<get_outcome> outcome, kvtier::deadline dl) = 0;
  /// UNLINK every key (one command).
  virtual std::error_code del(std::span<const std::string> keys, kvtier::deadline dl) = 0;
  /// The server's words when a call failed on a reply (error text, unexpected reply), else "".
  const std::string& detail() const noexcept { return detail_; }

 protected:
  std::string detail_;
};

template <kvtier::resp::connection Connection>
class connection_client final : public instance_client {
 public:
  connection_client(const kvtier::resp::endpoint& ep, std::chrono::milliseconds connect_timeout,
                    const kvtier::resp::tls_options& tls = {})
      // No CLIENT SETNAME: on a server that wants a password it would fail inside the handshake,
      // where the server's words are lost; PING then says NOAUTH itself.
      : ep_(ep),
        conn_(
            kvtier::resp::connection_options{.server = ep, .connect_timeout = connect_timeout, .tls = tls}) {}

  std::error_code connect(kvtier::deadline dl) override {
    b_.clear();
    b_.add({"PING"});
    if (std::error_code ec = run(dl)) {
      detail_ = conn_.last_error();  // with the server's or OpenSSL's words
      return ec;
    }
    const auto& r = b_.reply(0);
    if (r.kind != kvtier::resp::type::simple_string || r.str != "PONG") return bad_reply("PING", r);
    return {};
  }

  std::error_code exists(std::span<const std::string> keys, std::size_t& present,
                         kvtier::deadline dl) override {
    b_.clear();
    args_.assign({"EXISTS"});
    args_.insert(args_.end(), keys.begin(), keys.end());
    b_.add(args_);
    if (std::error_code ec = run(dl)) return ec;
    const auto& r = b_.reply(0);
    if (r.kind != kvtier::resp::type::integer) return bad_reply("EXISTS", r);
    present = static_cast<std::size_t>(r.integer);
    return {};
  }

  std::error_code set(std::span<const std::string> keys, std::span<const std::span<const std::byte>> values,
                      std::uint64_t ttl_ms, kvtier::deadline dl) override {
    b_.clear();
    const std::string ttl = std::to_string(ttl_ms);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      b_.add_with_payload({"SET", keys[i]}, values.subspan(i, 1));
      b_.add({"PEXPIRE", keys[i], ttl});
    }
    if (std::error_code ec = run(dl)) return ec;
    for (std::size_t i = 0; i < b_.size(); ++i) {
      const auto& r = b_.reply(i);
      if (r.is_error() || (i % 2 == 1 && r.kind != kvtier::resp::type::integer))
        return bad_reply(i % 2 ? "PEXPIRE" : "SET", r);
    }
    return {};
  }

  std::error_code get(std::span<const std::string> keys, std::span<const std::span<std::byte>> dst,
                      std::span<get_outcome> outcome, kvtier::deadline dl) override {
    b_.clear();
    for (std::size_t i = 0; i < keys.size(); ++i) b_.add_into({"GET", keys[i]}, dst[i]);
    if (std::error_code ec = run(dl)) return ec;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto& r = b_.reply(i);
      using kvtier::resp::type;
      if (r.is_null())
        outcome[i] = get_outcome::missing;
      else if (r.is_error())
        outcome[i] = get_outcome::server_error, detail_ = r.str;
      else if (r.kind != type::bulk_string)
        outcome[i] = get_outcome::unexpected_reply;
      else if (!r.into_destination || r.length != dst[i].size())
        outcome[i] = get_outcome::wrong_length;
      else
        outcome[i] = get_outcome::ok;
    }
    return {};
  }

  std::error_code del(std::span<const std::string> keys, kvtier::deadline dl) override {
    b_.clear();
    args_.assign({"UNLINK"});  // the server frees large values off its main thread
    args_.insert(args_.end(), keys.begin(), keys.end());
    b_.add(args_);
    if (std::error_code ec = run(dl)) return ec;
    if (b_.reply(0).kind != kvtier::resp::type::integer) return bad_reply("UNLINK", b_.reply(0));
    return {};
  }

 private:
  std::error_code run(kvtier::deadline dl) {
    detail_.clear();
    return conn_.execute(b_, dl);
  }
  std::error_code bad_reply(std::string_view command, const kvtier::resp::value& r) {
    detail_ = std::string(command) + " answered " + (r.is_error() ? "'" + r.str + "'" : describe(r));
    return make_error_code(r.is_error() ? kvtier::errc::server_error : kvtier::errc::unexpected_reply);
  }
  static std::string describe(const kvtier::resp::value& r) {
    using kvtier::resp::type;
    switch (r.kind) {
      case type::simple_string:
        return "'" + r.str + "'";
      case type::integer:
        return "the integer " + std::to_string(r.integer);
      case type::null:
        return "null";
      case type::bulk_string:
        return "a " + std::to_string(r.length) + "-byte string";
      default:
        return "a reply of another type";
    }
  }

  kvtier::resp::endpoint ep_;
  Connection conn_;
  kvtier::resp::batch b_;
  std::vector<std::string_view> args_;
};

inline bool transport_available(std::string_view transport) {
#if KVTIER_PROBE_HAS_URING
  if (transport == "uring") return true;
#endif
  return transport == "asio";
}

/// A client for `transport` ("asio" or "uring"; see transport_available()).
/// `connect_timeout` caps one connect + handshake (a call's deadline caps it too).
inline std::unique_ptr<instance_client> make_instance_client(std::string_view transport,
                                                             const kvtier::resp::endpoint& ep,
                                                             std::chrono::milliseconds connect_timeout,
                                                             const kvtier::resp::tls_options& tls = {}) {
#if KVTIER_PROBE_HAS_URING_TLS
  if (ep.tls && transport == "uring")
    return std::make_unique<connection_client<kvtier::resp::uring_tls_connection>>(ep, connect_timeout, tls);
#endif
#if KVTIER_PROBE_HAS_TLS
  if (ep.tls && transport == "asio")
    return std::make_unique<connection_client<kvtier::resp::asio_tls_connection>>(ep, connect_timeout, tls);
#endif
#if KVTIER_PROBE_HAS_URING
  if (transport == "uring")  // a TLS endpoint without kvtier::uring_tls is refused with a reason
    return std::make_unique<connection_client<kvtier::resp::uring_connection>>(ep, connect_timeout);
#endif
  (void)transport;
  return std::make_unique<connection_client<kvtier::resp::asio_connection>>(ep, connect_timeout);
}

/// The slot map of the cluster behind `seeds` (CLUSTER SLOTS from the first seed that answers).
/// On failure `why` names the seeds' errors.
inline std::error_code load_slot_map(const std::vector<kvtier::resp::endpoint>& seeds,
                                     std::chrono::milliseconds timeout, const kvtier::resp::tls_options& tls,
                                     kvtier::resp::slot_map& out, std::string& why) {
  std::error_code last = make_error_code(kvtier::errc::invalid_argument);
  for (const auto& ep : seeds) {
    auto ask = [&](auto& conn) {
      kvtier::resp::batch b;
      b.add({"CLUSTER", "SLOTS"});
      if (std::error_code ec = conn.execute(b, kvtier::deadline_after(timeout))) {
        why += (why.empty() ? "" : "; ") + conn.last_error();
        return ec;
      }
      std::string w;
      const kvtier::resp::cluster_node from{ep.host, ep.port};
      if (b.reply(0).is_error()) {
        why += (why.empty() ? "" : "; ") + ep.describe() + ": CLUSTER SLOTS: " + b.reply(0).str;
        return make_error_code(kvtier::errc::server_error);
      }
      if (std::error_code ec = kvtier::resp::parse_cluster_slots(b.reply(0), from, out, w)) {
        why += (why.empty() ? "" : "; ") + ep.describe() + ": " + w;
        return ec;
      }
      return std::error_code{};
    };
    const kvtier::resp::connection_options o{.server = ep, .connect_timeout = timeout, .tls = tls};
#if KVTIER_PROBE_HAS_TLS
    if (ep.tls) {
      kvtier::resp::asio_tls_connection conn(o);
      if (!(last = ask(conn))) return {};
      continue;
    }
#endif
    kvtier::resp::asio_connection conn(o);
    if (!(last = ask(conn))) return {};
  }
  return last;
}

}  // namespace kvtier_probe
