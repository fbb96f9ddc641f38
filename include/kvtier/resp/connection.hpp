// kvtier/resp/connection.hpp: what every RESP connection shares, whatever its transport.
//
// A connection executes one pipelined `batch` of commands at a time, synchronously, on the
// calling thread, and returns by the caller's deadline. Replies come back in order; a reply
// registered with add_into() has its bulk payload read straight into the caller's span (no
// growing buffer, no second copy). Two transports satisfy the `connection` concept:
// kvtier::resp::asio_connection (Boost.Asio, TCP and Unix sockets; kvtier/resp/asio_connection.hpp)
// and kvtier::resp::uring_connection (io_uring via liburing; kvtier/resp/uring_connection.hpp).
//
//   kvtier::resp::connection_options opt{.server = kvtier::resp::parse_url(url).value};
//   kvtier::resp::asio_connection conn(opt);                  // connects lazily
//   kvtier::resp::batch b;
//   b.add({"SET", "k", "v"});
//   b.add_into({"GET", "big"}, std::span<std::byte>(dst));     // payload lands in dst
//   std::error_code ec = conn.execute(b, kvtier::deadline_after(std::chrono::milliseconds(50)));
//   if (!ec && b.reply(1).into_destination) { /* dst holds the value */ }
//
// Semantics (both transports):
//  - execute() returns by its deadline. When the deadline passes first, it returns
//    errc::timeout, closes the connection (the stream position is unknown) and the next call
//    reconnects. Replies that arrived before that are in the batch (completed()).
//  - A lost connection mid-batch returns errc::connection_lost (or protocol_error/too_large on
//    bad bytes); the connection is closed and re-established by the next call. A batch is
//    never retried once any of it was sent (commands need not be idempotent).
//  - Before each batch, a connection that the peer closed while idle is detected (a
//    non-blocking peek) and re-established; after `health_check_idle` without traffic a PING
//    round trip checks it first.
//  - Connecting: resolve, connect (TCP_NODELAY), then HELLO 3 (protocol 3) or AUTH, CLIENT
//    SETNAME, SELECT, all pipelined in one round trip. Failed connects back off exponentially
//    (reconnect_backoff_min doubling up to reconnect_backoff_max). While in backoff the
//    connection is a tripped circuit breaker: every call fails at once with the last attempt's
//    error (e.g. errc::connection_refused, errc::auth_failed, errc::tls_failed), whatever its
//    deadline, instead of sleeping until the next attempt; down_until() says until when, and
//    stats().down_refusals counts those calls. The first call after the backoff tries again.
//    So a down server (or a wrong password or CA) costs a call one connect attempt per backoff
//    period, not the backoff itself.
//  - last_error() says in words what failed last, with the server's own error text where it
//    sent one ("SELECT 99: ERR DB index is out of range") and the server's address.
//  - Server error replies are replies, not failures: check reply(i).is_error().
//  - A batch holding a command with no arguments is refused whole (errc::invalid_argument).
//  - Not thread-safe: one thread at a time per connection (use one connection per worker).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/encoder.hpp"
#include "kvtier/resp/parser.hpp"
#include "kvtier/resp/types.hpp"
#include "kvtier/resp/url.hpp"

namespace kvtier::resp {

/// TLS settings for rediss:// and resp+tls:// endpoints (OpenSSL on either transport:
/// kvtier/resp/asio_tls_connection.hpp, kvtier/resp/uring_tls_connection.hpp). Peer
/// verification is on unless turned off.
struct tls_options {
  std::string ca_file{};      ///< PEM file of trusted CAs; empty: the system's default CA paths
  std::string cert_file{};    ///< client certificate (PEM), for servers that ask for one
  std::string key_file{};     ///< the client certificate's private key (PEM)
  std::string server_name{};  ///< name to verify and send as SNI; empty: the endpoint's host
  bool verify_peer = true;    ///< check the server's certificate chain and name
};

/// How a connection reaches and talks to its server.
struct connection_options {
  endpoint server{};  ///< where (from parse_url)
  std::chrono::milliseconds connect_timeout{
      2000};  ///< cap per connect + handshake (also bounded by the call's deadline)
  std::chrono::milliseconds reconnect_backoff_min{10};    ///< first wait after a failed connect
  std::chrono::milliseconds reconnect_backoff_max{2000};  ///< cap of the doubling backoff
  std::chrono::milliseconds health_check_idle{5000};      ///< PING first when idle this long; 0 = never
  int protocol = 2;                                       ///< 2: AUTH; 3: HELLO 3 (with AUTH inside)
  std::string client_name{};                              ///< CLIENT SETNAME when non-empty
  parser_limits limits{};                                 ///< reply limits (bulk, aggregate, depth, buffer)
  int socket_buffer_bytes = 0;  ///< SO_RCVBUF/SO_SNDBUF when > 0 (else kernel autotuning)
  tls_options tls{};            ///< used when server.tls (rediss://, resp+tls://)
};

/// Counters of one connection (monotonic since construction).
struct connection_stats {
  std::uint64_t batches = 0;           ///< execute() calls with at least one command
  std::uint64_t commands = 0;          ///< commands sent
  std::uint64_t connects = 0;          ///< successful connects (first one included)
  std::uint64_t connect_failures = 0;  ///< failed connect or handshake attempts
  std::uint64_t timeouts = 0;          ///< batches that hit their deadline
  std::uint64_t failures = 0;          ///< batches lost to connection or protocol errors
  std::uint64_t health_checks = 0;     ///< idle PINGs sent
  std::uint64_t down_refusals = 0;     ///< calls failed at once while in reconnect backoff
  std::uint64_t bytes_written = 0;
  std::uint64_t bytes_read = 0;
};

/// One pipelined batch of commands and, after execute(), their replies.
///
/// Arguments are copied when added; payloads (add_with_payload) and destinations (add_into)
/// stay the caller's and must outlive the execute() call. Reuse a batch (clear()) to keep its
/// allocations.
class batch {
 public:
  /// A command whose reply is parsed into a value.
  void add(std::initializer_list<std::string_view> args) { add(std::span(args.begin(), args.size())); }
  void add(std::span<const std::string_view> args) {
    empty_command_ |= args.empty();
    req_.command(args);
    slots_.push_back(slot{});
  }

  /// A command whose bulk-string reply (GET) is read straight into `destination_parts` (their
  /// total size is the expected length). See reply(): into_destination tells whether it did.
  void add_into(std::initializer_list<std::string_view> args,
                std::span<const std::span<std::byte>> destination_parts, destination_gate gate = {}) {
    add_into(std::span(args.begin(), args.size()), destination_parts, gate);
  }
  void add_into(std::initializer_list<std::string_view> args, std::span<std::byte> destination) {
    add_into(std::span(args.begin(), args.size()), std::span<const std::span<std::byte>>(&destination, 1));
  }
  /// With a `gate` (see parser::expect_destination): once the first part is filled the gate
  /// decides whether the payload continues into the later parts; a refused reply comes back
  /// with into_destination = false and refused_by_gate = true, later parts untouched.
  void add_into(std::span<const std::string_view> args,
                std::span<const std::span<std::byte>> destination_parts, destination_gate gate = {}) {
    empty_command_ |= args.empty();
    req_.command(args);
    slots_.push_back(slot{true, parts_.size(), destination_parts.size(), gate});
    parts_.insert(parts_.end(), destination_parts.begin(), destination_parts.end());
  }

  /// A command whose last argument is the concatenation of `payload_parts` (e.g. SET key with
  /// header + value), written to the socket from the caller's memory without a copy.
  void add_with_payload(std::initializer_list<std::string_view> args,
                        std::span<const std::span<const std::byte>> payload_parts) {
    add_with_payload(std::span(args.begin(), args.size()), payload_parts);
  }
  void add_with_payload(std::span<const std::string_view> args,
                        std::span<const std::span<const std::byte>> payload_parts) {
    req_.command_with_payload(args, payload_parts);
    slots_.push_back(slot{});
  }

  /// Commands in the batch.
  std::size_t size() const noexcept { return slots_.size(); }
  bool empty() const noexcept { return slots_.empty(); }

  /// Replies received by the last execute(): reply(i) is valid for i < completed().
  std::size_t completed() const noexcept { return completed_; }
  const value& reply(std::size_t i) const noexcept { return replies_[i]; }
  std::span<const value> replies() const noexcept { return {replies_.data(), completed_}; }

  /// Empties the batch (commands, destinations, replies); keeps capacity.
  void clear() noexcept {
    req_.clear();
    slots_.clear();
    parts_.clear();
    completed_ = 0;
    empty_command_ = false;
  }

  /// Bytes the batch puts on the wire.
  std::size_t request_bytes() const noexcept { return req_.total_bytes(); }

 private:
  template <class>
  friend class connection_base;

  struct slot {
    bool into = false;
    std::size_t first = 0, count = 0;  // range in parts_
    destination_gate gate;
  };

  request_builder req_;
  std::vector<slot> slots_;
  std::vector<std::span<std::byte>> parts_;
  std::vector<value> replies_;
  std::size_t completed_ = 0;
  bool empty_command_ = false;  // a command without arguments: execute() refuses the batch
};

/// True when `v` is a server error reply; `ec` then is errc::server_error.
inline std::error_code reply_error(const value& v) noexcept {
  return v.is_error() ? make_error_code(errc::server_error) : std::error_code{};
}

/// The interface both transports satisfy (what stores and tools are written against).
template <class C>
concept connection = requires(C& c, const C& cc, batch& b, deadline dl) {
  { c.execute(b, dl) } -> std::same_as<std::error_code>;  // pipelined batch, returns by dl
  { c.connect(dl) } -> std::same_as<std::error_code>;     // optional eager connect
  { c.ping(dl) } -> std::same_as<std::error_code>;        // one PING round trip
  { c.close() } -> std::same_as<void>;
  { cc.connected() } -> std::same_as<bool>;
  { cc.options() } -> std::same_as<const connection_options&>;
  { cc.stats() } -> std::same_as<connection_stats>;
};

/// The transport-neutral half of a connection (CRTP). A transport provides:
///   std::error_code transport_connect(deadline);         // socket connected, options set
///   std::error_code transport_exchange(deadline);        // drive write_buffers()/read_span()
///                                                        // until replies_done(); see below
///   void transport_close() noexcept;                     // close; no I/O pending afterwards
///   bool transport_peer_closed() noexcept;               // idle socket: peer closed or sent junk
/// transport_exchange() writes the spans of write_buffers() (reporting progress with
/// on_written()), reads into read_span() (reporting with on_read(), which parses), and returns
/// once replies_done() and nothing is left to write, on error, or at the deadline (errc::timeout) with no I/O
/// left pending into caller memory.
template <class Derived>
class connection_base {
 public:
  explicit connection_base(connection_options opt)
      : opt_(std::move(opt)), parser_(opt_.limits), backoff_(opt_.reconnect_backoff_min) {}

  const connection_options& options() const noexcept { return opt_; }
  connection_stats stats() const noexcept { return stats_; }
  /// The last failure in words (empty before any): address, what failed, and the server's own
  /// error text when it sent one. Kept until the next failure.
  const std::string& last_error() const noexcept { return last_error_; }
  bool connected() const noexcept { return connected_; }
  /// While in reconnect backoff after a failed connect: when the next attempt is allowed (calls
  /// before it fail at once with last_connect_error()); empty when connected or free to try.
  std::optional<clock::time_point> down_until() const noexcept {
    if (connected_ || next_attempt_ <= clock::now()) return std::nullopt;
    return next_attempt_;
  }
  /// The last failed connect attempt's error (empty before any); kept after a later success.
  std::error_code last_connect_error() const noexcept { return last_connect_error_; }

  /// Connects now (otherwise the first execute() does). No-op when connected.
  std::error_code connect(deadline dl) {
    if (connected_) return {};
    return establish(dl);
  }

  /// Closes the connection; the next call reconnects (without backoff).
  void close() noexcept {
    self().transport_close();
    connected_ = false;
    parser_.reset();
  }

  /// One PING round trip (connecting first if needed).
  std::error_code ping(deadline dl) {
    ping_.clear();
    ping_.add({"PING"});
    std::error_code ec = execute(ping_, dl);
    if (!ec && !(ping_.reply(0).kind == type::simple_string && ping_.reply(0).str == "PONG"))
      ec = make_error_code(errc::unexpected_reply);
    return ec;
  }

  /// Sends the batch and reads every reply, by `dl`. See the header comment for semantics.
  std::error_code execute(batch& b, deadline dl) {
    b.completed_ = 0;
    if (b.empty()) return {};
    // The server answers nothing to an empty command, so each later reply would be taken for
    // the reply of the command before it: refuse the batch before sending any of it.
    if (b.empty_command_) return note_error(errc::invalid_argument, "a command without arguments");
    if (expired(dl)) return note_error(errc::timeout, "deadline passed before the batch was sent");
    if (std::error_code ec = ensure_ready(dl)) return ec;
    ++stats_.batches;
    stats_.commands += b.size();
    return run(b, dl);
  }

 protected:
  // ---- used by transports ---------------------------------------------------------------
  /// Spans still to be written, in order (first one possibly partly written already).
  std::span<const std::span<const std::byte>> write_buffers() const noexcept {
    return std::span<const std::span<const std::byte>>(out_).subspan(out_index_);
  }
  bool write_pending() const noexcept { return out_index_ < out_.size(); }
  void on_written(std::size_t n) noexcept {
    stats_.bytes_written += n;
    while (n > 0 && out_index_ < out_.size()) {
      auto& s = out_[out_index_];
      const std::size_t k = std::min(n, s.size());
      s = s.subspan(k);
      n -= k;
      if (s.empty()) ++out_index_;
    }
    while (out_index_ < out_.size() && out_[out_index_].empty()) ++out_index_;
  }
  /// Where the next bytes read go (internal buffer or the current destination).
  std::span<std::byte> read_span() {
    const std::span<std::byte> s = parser_.prepare();
    payload_read_ = parser_.prepared_payload();
    return s;
  }
  /// True when the span read_span() returned is a payload of known length the transport may
  /// fill completely in one go (e.g. MSG_WAITALL) without reading past the reply.
  bool read_span_is_payload() const noexcept { return payload_read_; }
  /// `n` bytes were read into the last read_span(); parses them. n == 0 means EOF.
  std::error_code on_read(std::size_t n) {
    if (n == 0) return make_error_code(errc::connection_lost);
    stats_.bytes_read += n;
    parser_.commit(n);
    std::error_code ec;
    // Stop at the batch's last reply: bytes after it were never asked for, stay buffered, and
    // run() closes the connection for them (never counted as replies of this batch).
    while (!replies_done()) {
      auto v = parser_.next(ec);
      if (!v) break;
      if (v->kind == type::push) continue;  // RESP3 out-of-band message: not a reply
      cur_->replies_[cur_->completed_++] = std::move(*v);
    }
    return ec;
  }
  /// Every reply of the batch has arrived.
  bool replies_done() const noexcept { return cur_->completed_ >= cur_->size(); }
  const connection_options& opts() const noexcept { return opt_; }
  /// Why transport_connect() failed, in words (e.g. "TLS: certificate has expired").
  void set_transport_text(std::string text) { transport_text_ = std::move(text); }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  // Writes b and reads its replies; closes the connection on any failure.
  std::error_code run(batch& b, deadline dl) {
    cur_ = &b;
    if (b.replies_.size() < b.size()) b.replies_.resize(b.size());
    const auto request = b.req_.buffers();
    out_.assign(request.begin(), request.end());
    out_index_ = 0;
    for (const auto& s : b.slots_) {
      if (s.into)
        parser_.expect_destination(std::span<const std::span<std::byte>>(b.parts_).subspan(s.first, s.count),
                                   s.gate);
      else
        parser_.expect_no_destination();
    }
    std::error_code ec = self().transport_exchange(dl);
    cur_ = nullptr;
    out_.clear();
    if (!ec) {
      last_used_ = clock::now();
      // Bytes beyond the last reply were never asked for: the stream cannot be trusted.
      if (parser_.buffered() != 0) close();
      return {};
    }
    if (ec == errc::timeout)
      ++stats_.timeouts;
    else
      ++stats_.failures;
    close();
    note_error(ec, ec == errc::protocol_error
                       ? "reply is not RESP (is a Redis-protocol server listening there?)"
                       : closed_before_reply_hint(ec));
    return ec;
  }

  // A plaintext TCP connection that the server closed before sending a byte: what a TLS port
  // does with a plaintext command.
  std::string_view closed_before_reply_hint(std::error_code ec) const noexcept {
    if (ec != errc::connection_lost || opt_.server.tls || opt_.server.kind != endpoint::transport::tcp ||
        stats_.bytes_read != bytes_read_at_connect_)
      return {};
    return "the server closed the connection before any reply (is it a TLS port? use rediss:// or "
           "resp+tls://)";
  }

  // Connected, handshaken and (as far as a cheap check tells) alive.
  std::error_code ensure_ready(deadline dl) {
    if (connected_ && self().transport_peer_closed()) close();
    if (connected_ && opt_.health_check_idle.count() > 0 &&
        clock::now() - last_used_ >= opt_.health_check_idle) {
      ++stats_.health_checks;
      probe_.clear();
      probe_.add({"PING"});
      if (run(probe_, dl)) {
        if (expired(dl)) return make_error_code(errc::timeout);
        // the idle connection was dead: fall through and reconnect once
      }
    }
    if (connected_) return {};
    return establish(dl);
  }

  std::error_code establish(deadline dl) {
    const auto now = clock::now();
    if (now < next_attempt_) {
      // In backoff: fail at once with why the last attempt failed (never sleep the caller's
      // deadline away waiting for the next one).
      ++stats_.down_refusals;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_attempt_ - now).count();
      last_error_ = last_connect_text_;
      last_error_ += " [server down: next connect attempt in ";
      last_error_ += std::to_string(left);
      last_error_ += " ms]";
      return last_connect_error_;
    }
    const deadline cdl =
        std::min(dl, clock::now() + std::chrono::duration_cast<clock::duration>(opt_.connect_timeout));
    transport_text_.clear();
    std::error_code ec = self().transport_connect(cdl);
    std::string server_text = transport_text_;  // e.g. a TLS failure's reason
    if (!ec) {
      connected_ = true;
      parser_.reset();
      bytes_read_at_connect_ = stats_.bytes_read;
      ec = handshake(cdl, server_text);
      if (server_text.empty()) server_text = closed_before_reply_hint(ec);  // a TLS port hung up
      // run() closed the stream for bytes after the handshake's replies: this attempt failed.
      if (!ec && !connected_) ec = make_error_code(errc::protocol_error);
    }
    if (ec) {
      ++stats_.connect_failures;
      self().transport_close();
      connected_ = false;
      parser_.reset();
      if (ec == errc::timeout && cdl < dl)
        ec = make_error_code(errc::connection_refused);  // connect_timeout, not the caller's
      last_connect_error_ = ec;
      note_error(ec, server_text.empty() ? "connect" : server_text);
      last_connect_text_ = last_error_;
      next_attempt_ = clock::now() + std::chrono::duration_cast<clock::duration>(backoff_);
      backoff_ = std::min(backoff_ * 2, opt_.reconnect_backoff_max);
      return ec;
    }
    ++stats_.connects;
    backoff_ = opt_.reconnect_backoff_min;
    next_attempt_ = {};
    last_used_ = clock::now();
    return {};
  }

  // "host:port: what (message)" into last_error_; returns ec.
  std::error_code note_error(std::error_code ec, std::string_view what) {
    last_error_ = opt_.server.describe();
    last_error_ += ": ";
    if (!what.empty()) {
      last_error_ += what;
      last_error_ += " (";
      last_error_ += ec.message();
      last_error_ += ")";
    } else {
      last_error_ += ec.message();
    }
    return ec;
  }

  // HELLO/AUTH, CLIENT SETNAME, SELECT in one round trip. A refusal's text (command name and
  // the server's words) goes to `server_text`.
  std::error_code handshake(deadline dl, std::string& server_text) {
    probe_.clear();
    const endpoint& ep = opt_.server;
    const std::string db = std::to_string(ep.db);
    const std::string user = ep.user.empty() ? std::string("default") : ep.user;
    enum step : std::uint8_t { auth, name, select };
    step steps[3];
    std::size_t n = 0;
    if (opt_.protocol == 3) {
      std::vector<std::string_view> args = {"HELLO", "3"};
      if (!ep.password.empty()) args.insert(args.end(), {"AUTH", user, ep.password});
      if (!opt_.client_name.empty()) args.insert(args.end(), {"SETNAME", opt_.client_name});
      probe_.add(args);
      steps[n++] = auth;
    } else {
      if (!ep.password.empty()) {
        if (ep.user.empty())
          probe_.add({"AUTH", ep.password});
        else
          probe_.add({"AUTH", ep.user, ep.password});
        steps[n++] = auth;
      }
      if (!opt_.client_name.empty()) {
        probe_.add({"CLIENT", "SETNAME", opt_.client_name});
        steps[n++] = name;
      }
    }
    if (ep.db != 0) {
      probe_.add({"SELECT", db});
      steps[n++] = select;
    }
    if (n == 0) return {};
    if (std::error_code ec = run(probe_, dl)) return ec;
    for (std::size_t i = 0; i < n; ++i) {
      const value& r = probe_.reply(i);
      if (!r.is_error()) continue;
      static constexpr std::string_view names[] = {"AUTH", "CLIENT SETNAME", "SELECT"};
      server_text = std::string(opt_.protocol == 3 && steps[i] == auth ? "HELLO" : names[steps[i]]);
      server_text += ": ";
      server_text += r.str;
      if (steps[i] != auth) return make_error_code(errc::server_error);
      // AUTH: any refusal is a failed login. HELLO: only the login errors are; NOPROTO or an
      // unknown command (a server older than RESP3) is the server's answer to the protocol.
      const bool login = opt_.protocol != 3 || r.str.rfind("WRONGPASS", 0) == 0 ||
                         r.str.rfind("NOAUTH", 0) == 0 || r.str.rfind("NOPERM", 0) == 0;
      return make_error_code(login ? errc::auth_failed : errc::server_error);
    }
    return {};
  }

  connection_options opt_;
  parser parser_;
  connection_stats stats_{};
  bool connected_ = false;
  clock::time_point last_used_{};
  clock::time_point next_attempt_{};
  std::chrono::milliseconds backoff_;
  std::error_code last_connect_error_;
  std::string last_connect_text_;  // last_error_ of the last failed connect attempt
  std::string last_error_;
  std::string transport_text_;
  batch ping_;   // ping()
  batch probe_;  // health checks and the handshake (never at the same time as a caller's batch)
  batch* cur_ = nullptr;
  std::vector<std::span<const std::byte>> out_;
  std::size_t out_index_ = 0;
  bool payload_read_ = false;
  std::uint64_t bytes_read_at_connect_ = 0;  // stats_.bytes_read when the socket connected
};

}  // namespace kvtier::resp
