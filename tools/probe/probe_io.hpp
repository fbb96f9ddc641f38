// tools/probe/probe_io.hpp: the RESP commands kvtier-probe (and bench_resp_get) issue, over either
// of kvtier's connections.
//
//   auto c = kvtier_probe::make_instance_client("asio", endpoint, std::chrono::seconds(2));
//   std::error_code ec = c->connect(dl);                   // connect + PING
//   ec = c->get(keys, destinations, outcomes, dl);          // a batch of GETs, spread as the stores do
//   if (ec) std::cerr << ec.message() << ": " << c->detail();
//
// A GET batch is batched the way remote_store batches it (kvtier/store/batch_spread.hpp): cut
// into pieces of at most batch_spread{}.max_reply_bytes, spread over as many connections as a
// store's pool uses for a large batch (connections(); 3 by default), one piece per connection at
// a time; so the probe's B is the B the stores get. Every other call is one pipelined batch on
// the first connection. Every call returns by its deadline (the connection's guarantee).
#pragma once

#include <atomic>
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
#include "kvtier/resp/pool.hpp"
#include "kvtier/resp/url.hpp"
#include "kvtier/store/batch_spread.hpp"
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
  /// Connections a GET batch is spread over (the stores' large connections).
  virtual std::size_t connections() const noexcept = 0;
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
      : ep_(ep), crew_(lanes()) {
    const kvtier::resp::connection_options o{.server = ep, .connect_timeout = connect_timeout, .tls = tls};
    for (std::size_t k = 0; k < lanes(); ++k) conns_.push_back(std::make_unique<Connection>(o));
    lane_batches_.resize(lanes());
  }

  std::error_code connect(kvtier::deadline dl) override {
    b_.clear();
    b_.add({"PING"});
    if (std::error_code ec = run(dl)) {
      detail_ = conn_().last_error();  // with the server's or OpenSSL's words
      return ec;
    }
    const auto& r = b_.reply(0);
    if (r.kind != kvtier::resp::type::simple_string || r.str != "PONG") return bad_reply("PING", r);
    for (std::size_t k = 1; k < conns_.size(); ++k) {  // the GET lanes, connected up front too
      if (std::error_code ec = conns_[k]->connect(dl)) {
        detail_ = conns_[k]->last_error();
        return ec;
      }
    }
    return {};
  }

  std::size_t connections() const noexcept override { return conns_.size(); }

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
    detail_.clear();
    std::vector<std::size_t> bytes(dst.size());
    for (std::size_t i = 0; i < dst.size(); ++i) bytes[i] = dst[i].size();
    const kvtier::detail::batch_pieces pieces =
        kvtier::detail::cut_batch(bytes, kvtier::batch_spread{}.max_reply_bytes);
    const std::size_t lanes_used = std::min(pieces.count(), conns_.size());
    std::atomic<std::size_t> next{0};
    std::vector<std::error_code> failed(lanes_used);
    std::vector<std::string> details(lanes_used);
    auto lane = [&](std::size_t k) noexcept {
      kvtier::resp::batch& b = lane_batches_[k];
      for (std::size_t p; (p = next.fetch_add(1)) < pieces.count();) {
        const std::size_t first = pieces.starts[p], last = pieces.starts[p + 1];
        try {
          b.clear();
          for (std::size_t i = first; i < last; ++i) b.add_into({"GET", keys[i]}, dst[i]);
        } catch (const std::bad_alloc&) {
          failed[k] = std::make_error_code(std::errc::not_enough_memory);
          return;
        }
        if (std::error_code ec = conns_[k]->execute(b, dl)) {
          failed[k] = ec;
          details[k] = conns_[k]->last_error();
          return;
        }
        for (std::size_t i = first; i < last; ++i)
          outcome[i] = judge(b.reply(i - first), dst[i].size(), details[k]);
      }
    };
    std::vector<std::size_t> ids(lanes_used);
    for (std::size_t k = 0; k < lanes_used; ++k) ids[k] = k;
    crew_.run(ids, lane);
    for (std::size_t k = 0; k < lanes_used; ++k)
      if (!details[k].empty()) detail_ = details[k];
    for (const auto& e : failed)
      if (e) return e;
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
  // The stores' large connections: a pool's default size less the one kept for small calls.
  static std::size_t lanes() noexcept {
    const kvtier::resp::pool_options p{};
    return p.connections > p.reserved_small ? p.connections - p.reserved_small : 1;
  }
  Connection& conn_() noexcept { return *conns_.front(); }
  std::error_code run(kvtier::deadline dl) {
    detail_.clear();
    return conn_().execute(b_, dl);
  }
  static get_outcome judge(const kvtier::resp::value& r, std::size_t want, std::string& detail) {
    using kvtier::resp::type;
    if (r.is_null()) return get_outcome::missing;
    if (r.is_error()) return detail = r.str, get_outcome::server_error;
    if (r.kind != type::bulk_string) return get_outcome::unexpected_reply;
    if (!r.into_destination || r.length != want) return get_outcome::wrong_length;
    return get_outcome::ok;
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
  std::vector<std::unique_ptr<Connection>> conns_;  // [0]: every call; all: GET lanes
  std::vector<kvtier::resp::batch> lane_batches_;
  kvtier::detail::lane_crew crew_;
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
