// kvtier/resp/asio_connection.hpp: a RESP connection over Boost.Asio (TCP or Unix socket).
//
// Satisfies kvtier::resp::connection (see kvtier/resp/connection.hpp for the semantics shared
// with the io_uring transport). Each connection owns a private io_context that runs only on
// the calling thread inside execute(); the write of the batch (scatter-gather, sendmsg) and the
// reads of the replies proceed at the same time, so neither side can stall the other.
//
//   #include "kvtier/resp/asio_connection.hpp"        // link kvtier::asio
//   kvtier::resp::asio_connection conn({.server = kvtier::resp::parse_url("resp://127.0.0.1:6379").value});
//   kvtier::resp::batch b;
//   b.add_into({"GET", key}, std::span<std::byte>(dst));
//   std::error_code ec = conn.execute(b, kvtier::deadline_after(std::chrono::milliseconds(100)));
//
// TLS (rediss://, resp+tls://) is the same class with OpenSSL plugged in:
// kvtier::resp::asio_tls_connection (kvtier/resp/asio_tls_connection.hpp, target kvtier::tls).
// asio_connection refuses a TLS endpoint with errc::invalid_argument and says so in last_error().
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/detail/conn_socket.hpp"

namespace kvtier::resp {

namespace detail {
/// The TLS policy of a plain asio_connection: none (see asio_tls_connection.hpp for OpenSSL's).
struct asio_no_tls {
  static constexpr bool enabled = false;
  asio_no_tls(boost::asio::io_context&, const connection_options&) {}
};
}  // namespace detail

/// RESP connection over Boost.Asio: resp:// (TCP) and resp+unix:// (Unix socket) endpoints, and
/// with a TLS policy also rediss:// / resp+tls://. Use the aliases asio_connection and
/// asio_tls_connection.
template <class Tls>
class basic_asio_connection : public connection_base<basic_asio_connection<Tls>> {
  using base = connection_base<basic_asio_connection<Tls>>;

 public:
  explicit basic_asio_connection(connection_options opt) : base(std::move(opt)), tls_(ctx_, this->opts()) {}
  basic_asio_connection(const basic_asio_connection&) = delete;
  basic_asio_connection& operator=(const basic_asio_connection&) = delete;
  ~basic_asio_connection() { this->close(); }

 private:
  friend base;
  using base::on_read;
  using base::on_written;
  using base::opts;
  using base::read_span;
  using base::read_span_is_payload;
  using base::replies_done;
  using base::write_buffers;
  using base::write_pending;
  using tcp = boost::asio::ip::tcp;
  using local = boost::asio::local::stream_protocol;
  using asio_ec = boost::system::error_code;

  bool is_unix() const noexcept { return opts().server.kind == endpoint::transport::unix_socket; }

  // Calls f with the active stream: the Unix socket, the TLS stream, or the TCP socket.
  template <class F>
  void with_stream(F&& f) {
    if (is_unix()) return f(unix_);
    if constexpr (Tls::enabled) {
      if (tls_.active()) return f(tls_.stream());
    }
    f(tcp_);
  }
  int fd() {
    return is_unix() ? static_cast<int>(unix_.native_handle()) : static_cast<int>(tcp_.native_handle());
  }

  // Runs the io_context until `pending_` operations are done or `dl` passes; at the deadline
  // the socket is closed (cancelling everything) and the aborted handlers are drained, so no
  // operation touches caller memory after return. Returns true if the deadline hit.
  bool run_until(deadline dl) {
    bool timed_out = false;
    while (pending_ > 0) {
      if (ctx_.stopped()) ctx_.restart();
      if (timed_out) {
        ctx_.run_one();
      } else if (ctx_.run_one_until(dl) == 0 && clock::now() >= dl) {
        timed_out = true;
        close_socket();
      }
    }
    return timed_out;
  }

  void close_socket() noexcept {
    asio_ec ignore;
    if (tcp_.is_open()) tcp_.close(ignore);
    if (unix_.is_open()) unix_.close(ignore);
  }

  static std::error_code map_connect_error(const asio_ec& e) {
    if (e == boost::asio::error::host_not_found || e == boost::asio::error::host_not_found_try_again ||
        e == boost::asio::error::no_data || e == boost::asio::error::no_recovery)
      return make_error_code(errc::resolve_failed);
    return make_error_code(errc::connection_refused);
  }

  // ---- transport interface for connection_base ----------------------------------------

  std::error_code transport_connect(deadline dl) {
    close_socket();
    if constexpr (Tls::enabled) tls_.reset();
    ctx_.restart();
    if (opts().server.tls && !Tls::enabled) {
      this->set_transport_text(
          "a TLS endpoint needs asio_tls_connection (kvtier/resp/asio_tls_connection.hpp)");
      return make_error_code(errc::invalid_argument);
    }
    asio_ec result;
    pending_ = 1;
    const endpoint& ep = opts().server;
    if (is_unix()) {
      unix_.async_connect(local::endpoint(ep.path), [this, &result](const asio_ec& e) {
        --pending_;
        result = e;
      });
    } else {
      asio_ec e;
      const auto addr = boost::asio::ip::make_address(ep.host, e);
      if (!e) {
        tcp_.async_connect(tcp::endpoint(addr, ep.port), [this, &result](const asio_ec& e2) {
          --pending_;
          result = e2;
        });
      } else {
        // A host name: Asio's resolver runs getaddrinfo on a thread that a cancel cannot
        // interrupt (the aborted handler waits for the lookup), so resolve by `dl` with the
        // helper the io_uring transport uses, then connect to each address in turn.
        detail::conn_addresses addrs;
        if (std::error_code rec = detail::conn_resolve(ep.host, ep.port, dl, addrs)) {
          pending_ = 0;
          return rec;
        }
        endpoints_.clear();
        for (const auto& a : addrs) {
          tcp::endpoint te;
          if ((a.addr.ss_family != AF_INET && a.addr.ss_family != AF_INET6) || a.len > te.capacity())
            continue;
          std::memcpy(te.data(), &a.addr, a.len);
          te.resize(a.len);
          endpoints_.push_back(te);
        }
        if (endpoints_.empty()) {
          pending_ = 0;
          return make_error_code(errc::resolve_failed);
        }
        boost::asio::async_connect(tcp_, endpoints_,
                                   [this, &result](const asio_ec& ce, const tcp::endpoint&) {
                                     --pending_;
                                     result = ce;
                                   });
      }
    }
    if (run_until(dl)) return make_error_code(errc::timeout);
    if (result) {
      close_socket();
      return map_connect_error(result);
    }
    detail::conn_tune_socket(fd(), !is_unix(), opts().socket_buffer_bytes);
    wake_mark_ = 1;
    if constexpr (Tls::enabled) {
      if (opts().server.tls) return tls_handshake(dl);
    }
    return {};
  }

  // The TLS handshake on the connected socket, by `dl`; a failure's reason goes to the base.
  std::error_code tls_handshake(deadline dl) {
    std::string why;
    if (std::error_code ec = tls_.start(tcp_, opts(), why)) {
      this->set_transport_text("TLS: " + why);
      close_socket();
      return ec;
    }
    asio_ec result;
    pending_ = 1;
    tls_.stream().async_handshake(Tls::client, [this, &result](const asio_ec& e) {
      --pending_;
      result = e;
    });
    if (run_until(dl)) {
      this->set_transport_text(detail::tls_silent_peer_text);
      tls_.reset();
      return make_error_code(errc::timeout);
    }
    if (result) {
      this->set_transport_text("TLS handshake: " + tls_.explain(result));
      close_socket();
      tls_.reset();
      return make_error_code(errc::tls_failed);
    }
    return {};
  }

  std::error_code transport_exchange(deadline dl) {
    ctx_.restart();
    error_ = {};
    pending_ = 0;
    start_write();
    start_read();
    if (run_until(dl)) return make_error_code(errc::timeout);
    if constexpr (Tls::enabled) {
      // After the last reply, records already received (in the TLS stream's buffers, where the
      // idle check's peek cannot see them) are decrypted now: stray application data goes to
      // the base, which closes the connection for it; a session ticket is consumed.
      if (!error_ && tls_.active()) {
        std::size_t n = 0;
        const bool alive = tls_read_now(read_span(), n);
        if (n > 0) (void)on_read(n);  // after the last reply: buffered only, never a reply
        if (!alive) close_socket();   // the session ended: the next batch reconnects
      }
    }
    return error_;
  }

  void transport_close() noexcept {
    close_socket();
    if constexpr (Tls::enabled) tls_.reset();  // no operation is pending on it any more
  }

  bool transport_peer_closed() noexcept {
    const bool open = is_unix() ? unix_.is_open() : tcp_.is_open();
    if (!open) return true;
    if constexpr (Tls::enabled) {
      // Over TLS, bytes on an idle socket may be a TLS record that is not data (a session
      // ticket): decrypt what is there, and only application data (a reply nobody asked for)
      // or the session's end means the stream is unusable.
      if (tls_.active()) {
        if (!tls_.has_buffered() && !detail::conn_peer_closed(fd())) return false;  // nothing came
        std::size_t n = 0;
        const bool alive = tls_read_now(idle_scratch_, n);
        return !alive || n > 0;
      }
    }
    return detail::conn_peer_closed(fd());
  }

  // Over TLS: one read of whatever the session holds or the socket has now, without waiting.
  // Handshake records (a session ticket, a key update) are consumed by OpenSSL; application
  // data lands in `into` (n > 0). False when the session ended or failed.
  bool tls_read_now(std::span<std::byte> into, std::size_t& n) noexcept {
    n = 0;
    bool finished = false, cancelled = false;
    asio_ec result;
    ctx_.restart();
    ++pending_;
    tls_.stream().async_read_some(boost::asio::buffer(into.data(), into.size()),
                                  [this, &finished, &result, &n](const asio_ec& e, std::size_t got) {
                                    --pending_;
                                    finished = true;
                                    result = e;
                                    n = got;
                                  });
    // Run what is ready now (poll never waits), then cancel the read that would wait for more.
    for (int i = 0; i < max_poll_rounds && !finished && ctx_.poll() > 0; ++i) {
    }
    if (!finished) {
      cancelled = true;
      asio_ec ignore;
      tcp_.cancel(ignore);
      while (pending_ > 0) {
        if (ctx_.stopped()) ctx_.restart();
        ctx_.run_one();
      }
    }
    if (cancelled && n == 0) return result == boost::asio::error::operation_aborted;
    return !result;
  }
  bool tls_active() const noexcept {
    if constexpr (Tls::enabled) return tls_.active();
    return false;
  }

  // ---- the exchange ---------------------------------------------------------------------

  void fail(std::error_code e) {
    if (!error_) error_ = e;
    close_socket();  // cancels the other direction; its handler sees operation_aborted
  }

  void start_write() {
    if (error_ || !write_pending()) return;
    wbufs_.clear();
    for (const auto& s : write_buffers()) {
      wbufs_.emplace_back(s.data(), s.size());
      if (wbufs_.size() == max_write_buffers) break;
    }
    ++pending_;
    with_stream([this](auto& s) {
      s.async_write_some(wbufs_, [this](const asio_ec& e, std::size_t n) {
        --pending_;
        if (e) return fail(make_error_code(errc::connection_lost));
        on_written(n);
        start_write();
      });
    });
  }

  void start_read() {
    if (error_ || replies_done()) return;
    if (!tls_active()) return read_plain();
    const std::span<std::byte> into = read_span();
    wake_at(read_span_is_payload() ? into.size() : 1);
    ++pending_;
    with_stream([this, into](auto& s) {
      s.async_read_some(boost::asio::buffer(into.data(), into.size()),
                        [this](const asio_ec& e, std::size_t n) {
                          --pending_;
                          if (e) return fail(make_error_code(errc::connection_lost));  // eof, reset, aborted
                          if (std::error_code pe = on_read(n)) return fail(pe);
                          start_read();
                        });
    });
  }

  // A plain socket's receive loop: read what the kernel holds now with non-blocking recv()s,
  // straight from here (no reactor round trip, no handler dispatch per read), and ask the
  // reactor only to wait when nothing is there. So a reply whose bytes are already queued (the
  // CRLF after a payload, the next reply of a pipelined batch) costs one recv(), and the wake
  // mark (SO_RCVLOWAT) changes only before a wait, not before every read. Bounded per call: a
  // socket that keeps delivering hands the loop back to the io_context after max_reads_inline.
  void read_plain() {
    for (std::size_t round = 0; round < max_reads_inline; ++round) {
      if (error_ || replies_done()) return;
      const std::span<std::byte> into = read_span();
      const ssize_t n = ::recv(fd(), into.data(), into.size(), MSG_DONTWAIT);
      if (n > 0) {
        if (std::error_code pe = on_read(static_cast<std::size_t>(n))) return fail(pe);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
        return fail(make_error_code(errc::connection_lost));  // eof, reset
      // Nothing queued: wait until the span's bytes (a payload) or any byte (else) are in. The
      // descriptor stays registered with the reactor (edge-triggered), and this wait is queued
      // before the io_context polls again, so bytes that land from now on wake it.
      wake_at(read_span_is_payload() ? into.size() : 1);
      ++pending_;
      auto resume = [this](const asio_ec& e) {
        --pending_;
        if (e) return fail(make_error_code(errc::connection_lost));  // aborted at the deadline
        read_plain();
      };
      if (is_unix())
        unix_.async_wait(local::socket::wait_read, resume);
      else
        tcp_.async_wait(tcp::socket::wait_read, resume);
      return;
    }
    // Still delivering after max_reads_inline reads: continue from the io_context (the write's
    // handler and the deadline get their turn; no wait, the bytes may be queued already).
    ++pending_;
    boost::asio::post(ctx_, [this] {
      --pending_;
      read_plain();
    });
  }

  // A payload read wants all of its span: SO_RCVLOWAT makes the kernel wake this connection once
  // that many bytes are queued (or the peer closed, or memory is short), not on every segment,
  // as MSG_WAITALL does for a blocking read. Plain TCP only (TLS bytes are not payload bytes).
  // Never more than the span: the reply's remaining bytes always reach the mark.
  void wake_at(std::size_t bytes) noexcept {
    if (is_unix() || tls_active()) return;
    const int mark = static_cast<int>(std::min<std::size_t>(bytes, max_wake_mark));
    if (mark == wake_mark_) return;
    if (::setsockopt(fd(), SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof mark) == 0) wake_mark_ = mark;
  }

  static constexpr std::size_t max_wake_mark = 1u << 20;
  static constexpr std::size_t max_write_buffers = 64;  // Asio gathers at most 64 per call
  static constexpr int max_poll_rounds = 64;            // handlers per idle TLS read (records)
  static constexpr std::size_t max_reads_inline = 64;   // plain reads per turn of the io_context

  boost::asio::io_context ctx_{1};
  tcp::socket tcp_{ctx_};
  local::socket unix_{ctx_};
  std::vector<tcp::endpoint> endpoints_;  // a host name's addresses, tried in order
  std::vector<boost::asio::const_buffer> wbufs_;
  std::size_t pending_ = 0;
  int wake_mark_ = 1;  // the socket's SO_RCVLOWAT (1 on a fresh socket)
  std::error_code error_;
  std::byte idle_scratch_[64];  // where the idle check's TLS read puts stray data (then closes)
  Tls tls_;                     // after ctx_: built from it
};

/// Plain TCP and Unix sockets.
using asio_connection = basic_asio_connection<detail::asio_no_tls>;
static_assert(connection<asio_connection>);

}  // namespace kvtier::resp
