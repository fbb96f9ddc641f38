// kvtier/resp/uring_connection.hpp: a RESP connection over io_uring (liburing), TCP or Unix.
//
// Satisfies kvtier::resp::connection (see kvtier/resp/connection.hpp for the semantics shared
// with the Asio transport). Each connection owns a small ring used only by the calling thread
// inside execute(): the batch goes out as one SENDMSG (scatter-gather, no copy of payloads)
// while a RECV is in flight; a RECV into a caller destination uses MSG_WAITALL, so a whole
// value arrives in one completion. At the deadline (or on an error) every operation still in
// flight is cancelled and reaped before returning, so the kernel never writes into caller
// memory after execute() returned.
//
//   #include "kvtier/resp/uring_connection.hpp"       // link kvtier::uring
//   kvtier::resp::uring_connection conn({.server = kvtier::resp::parse_url("resp://127.0.0.1:6379").value});
//   kvtier::resp::batch b;
//   b.add_into({"GET", key}, std::span<std::byte>(dst));
//   std::error_code ec = conn.execute(b, kvtier::deadline_after(std::chrono::milliseconds(100)));
//
// TLS (rediss://, resp+tls://) is the same class with OpenSSL's memory-BIO engine plugged in:
// kvtier::resp::uring_tls_connection (kvtier/resp/uring_tls_connection.hpp, target
// kvtier::uring_tls). uring_connection refuses a TLS endpoint with errc::invalid_argument and
// says so in last_error().
#pragma once

#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/detail/conn_socket.hpp"

namespace kvtier::resp {

namespace detail {
/// The TLS policy of a plain uring_connection: none (see uring_tls_connection.hpp for OpenSSL's).
struct uring_no_tls {
  static constexpr bool enabled = false;
  explicit uring_no_tls(const connection_options&) {}
};
}  // namespace detail

/// RESP connection over io_uring: resp:// (TCP) and resp+unix:// (Unix socket) endpoints, and
/// with a TLS engine (detail::tls_engine) also rediss:// / resp+tls://. Use the aliases
/// uring_connection and uring_tls_connection. A ring that cannot be created (old kernel,
/// seccomp) makes every connect fail with errc::backend_error.
template <class Tls>
class basic_uring_connection : public connection_base<basic_uring_connection<Tls>> {
  using base = connection_base<basic_uring_connection<Tls>>;

 public:
  explicit basic_uring_connection(connection_options opt) : base(std::move(opt)), tls_(this->opts()) {
    ring_ok_ = io_uring_queue_init(ring_entries, &ring_, 0) == 0;
  }
  basic_uring_connection(const basic_uring_connection&) = delete;
  basic_uring_connection& operator=(const basic_uring_connection&) = delete;
  ~basic_uring_connection() {
    this->close();
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }

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

  static constexpr unsigned ring_entries = 8;
  enum op : std::uint64_t { op_none = 0, op_send = 1, op_recv = 2, op_connect = 3, op_cancel = 4 };

  io_uring_sqe* sqe() {
    io_uring_sqe* s = io_uring_get_sqe(&ring_);
    if (s == nullptr) {  // the ring is tiny and we keep <= 4 in flight: cannot happen, but be safe
      io_uring_submit(&ring_);
      s = io_uring_get_sqe(&ring_);
    }
    return s;
  }

  // Waits for at least one completion until dl: 0 = got one, -ETIME = deadline, else -errno.
  int wait(deadline dl, io_uring_cqe** cqe) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(time_left(dl));
      *cqe = nullptr;
      __kernel_timespec ts{};
      ts.tv_sec = static_cast<long long>(left.count() / 1000000000);
      ts.tv_nsec = static_cast<long long>(left.count() % 1000000000);
      const int r = io_uring_submit_and_wait_timeout(&ring_, cqe, 1, &ts, nullptr);
      if (r == -EINTR) continue;
      // liburing may report success with no completion when the wait timed out after a submit.
      if (r == -ETIME || (r >= 0 && *cqe == nullptr)) {
        if (!expired(dl)) continue;  // woke early
        return -ETIME;
      }
      return r < 0 ? r : 0;
    }
  }

  // Cancels every operation in flight and reaps their completions (bounded: a cancelled
  // socket operation completes at once; shutdown() forces the rest).
  void cancel_all() {
    if (inflight_ == 0) return;
    for (std::uint64_t id : {std::uint64_t{op_send}, std::uint64_t{op_recv}, std::uint64_t{op_connect}}) {
      if (!(inflight_mask_ & (1u << id))) continue;
      io_uring_sqe* s = sqe();
      io_uring_prep_cancel64(s, id, 0);
      io_uring_sqe_set_data64(s, op_cancel);
      ++cancels_;
    }
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    const deadline guard = clock::now() + std::chrono::seconds(5);
    auto ignore = [](std::uint64_t, int) {};
    while (inflight_ > 0 || cancels_ > 0) {
      io_uring_cqe* cqe = nullptr;
      if (wait(guard, &cqe) != 0) break;  // never seen; the ring is torn down below if so
      reap(cqe, &ignore);
    }
    if (inflight_ > 0) {
      // Last resort: tearing the ring down cancels whatever the kernel still holds.
      io_uring_queue_exit(&ring_);
      ring_ok_ = io_uring_queue_init(ring_entries, &ring_, 0) == 0;
      inflight_ = cancels_ = 0;
      inflight_mask_ = 0;
    }
  }

  // Consumes one completion; for send/recv calls `handle(op, res)`.
  template <class H>
  void reap(io_uring_cqe* cqe, H* handle) {
    const std::uint64_t id = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (id == op_cancel) {
      --cancels_;
      return;
    }
    --inflight_;
    inflight_mask_ &= ~(1u << id);
    (*handle)(id, res);
  }

  void submit(std::uint64_t id) {
    ++inflight_;
    inflight_mask_ |= 1u << id;
  }

  // ---- transport interface for connection_base ----------------------------------------

  std::error_code transport_connect(deadline dl) {
    if (!ring_ok_) return make_error_code(errc::backend_error);
    transport_close();
    if (opts().server.tls && !Tls::enabled) {
      this->set_transport_text(
          "a TLS endpoint needs uring_tls_connection (kvtier/resp/uring_tls_connection.hpp)");
      return make_error_code(errc::invalid_argument);
    }
    const endpoint& ep = opts().server;
    const bool unix_socket = ep.kind == endpoint::transport::unix_socket;
    detail::conn_addresses addrs;
    if (unix_socket) {
      detail::conn_address ca;
      auto* un = reinterpret_cast<sockaddr_un*>(&ca.addr);
      un->sun_family = AF_UNIX;
      std::memcpy(un->sun_path, ep.path.c_str(), std::min(ep.path.size() + 1, sizeof un->sun_path - 1));
      ca.len = static_cast<socklen_t>(sizeof(sockaddr_un));
      addrs.push_back(ca);
    } else if (std::error_code ec = detail::conn_resolve(ep.host, ep.port, dl, addrs)) {
      return ec;  // a host name resolves on a helper thread, so dl bounds it
    }
    std::error_code last = make_error_code(errc::connection_refused);
    for (auto& [addr, len] : addrs) {
      // Blocking mode on purpose: io_uring would pass -EAGAIN through on an O_NONBLOCK socket.
      fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd_ < 0) return make_error_code(errc::backend_error);
      detail::conn_tune_socket(fd_, !unix_socket, opts().socket_buffer_bytes);
      io_uring_sqe* s = sqe();
      io_uring_prep_connect(s, fd_, reinterpret_cast<sockaddr*>(&addr), len);
      io_uring_sqe_set_data64(s, op_connect);
      submit(op_connect);
      int result = 0;
      auto on = [&result](std::uint64_t, int res) { result = res; };
      while (inflight_ > 0) {
        io_uring_cqe* cqe = nullptr;
        const int w = wait(dl, &cqe);
        if (w == -ETIME) {
          cancel_all();
          transport_close();
          return make_error_code(errc::timeout);
        }
        if (w != 0) {
          cancel_all();
          transport_close();
          return make_error_code(errc::backend_error);
        }
        reap(cqe, &on);
      }
      if (result == 0) {
        if constexpr (Tls::enabled) {
          if (opts().server.tls) return tls_handshake(dl);
        }
        return {};
      }
      last = make_error_code(errc::connection_refused);
      transport_close();
    }
    return last;
  }

  std::error_code transport_exchange(deadline dl) {
    if constexpr (Tls::enabled) {
      if (tls_.active()) return tls_exchange(dl);
    }
    std::error_code result;
    auto fail = [&](std::error_code e) {
      if (!result) result = e;
    };
    auto on = [&](std::uint64_t id, int res) {
      if (id == op_send) {
        if (res < 0) {
          if (res != -EINTR && res != -EAGAIN) fail(make_error_code(errc::connection_lost));
          return;
        }
        on_written(static_cast<std::size_t>(res));
      } else if (id == op_recv) {
        if (res < 0) {
          if (res != -EINTR && res != -EAGAIN) fail(make_error_code(errc::connection_lost));
          return;
        }
        if (std::error_code e = on_read(static_cast<std::size_t>(res))) fail(e);  // 0: EOF
      }
    };
    for (;;) {
      if (!result) {
        if (write_pending() && !(inflight_mask_ & (1u << op_send))) {
          iov_.clear();
          for (const auto& b : write_buffers()) {
            iov_.push_back(iovec{const_cast<std::byte*>(b.data()), b.size()});
            if (iov_.size() == IOV_MAX) break;
          }
          msg_ = msghdr{};
          msg_.msg_iov = iov_.data();
          msg_.msg_iovlen = iov_.size();
          io_uring_sqe* s = sqe();
          io_uring_prep_sendmsg(s, fd_, &msg_, MSG_NOSIGNAL | MSG_WAITALL);
          io_uring_sqe_set_data64(s, op_send);
          submit(op_send);
        }
        if (!replies_done() && !(inflight_mask_ & (1u << op_recv))) {
          const std::span<std::byte> into = read_span();
          io_uring_sqe* s = sqe();
          io_uring_prep_recv(s, fd_, into.data(), into.size(), read_span_is_payload() ? MSG_WAITALL : 0);
          io_uring_sqe_set_data64(s, op_recv);
          submit(op_recv);
        }
      }
      if (inflight_ == 0) break;
      if (result) {
        cancel_all();
        break;
      }
      io_uring_cqe* cqe = nullptr;
      const int w = wait(dl, &cqe);
      if (w == -ETIME) {
        fail(make_error_code(errc::timeout));
        continue;
      }
      if (w != 0) {
        fail(make_error_code(errc::backend_error));
        continue;
      }
      reap(cqe, &on);
      // Drain whatever else completed without another syscall.
      while (io_uring_peek_cqe(&ring_, &cqe) == 0) reap(cqe, &on);
    }
    return result;
  }

  void transport_close() noexcept {
    if (inflight_ > 0) cancel_all();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if constexpr (Tls::enabled) tls_.reset();  // after cancel_all: no I/O into its buffers left
  }

  bool transport_peer_closed() noexcept {
    if (fd_ < 0) return true;
    if constexpr (Tls::enabled) {
      if (tls_.active()) return tls_idle_unusable();
    }
    return detail::conn_peer_closed(fd_);
  }

  // Over TLS, bytes on an idle socket may be a TLS record that is not data (a session ticket):
  // take in what the socket has now (no waiting; no ring I/O is in flight between batches) and
  // decrypt it with what the engine holds. Application data nobody asked for, the session's
  // end or a socket error means the stream is unusable.
  bool tls_idle_unusable() noexcept {
    using st = typename Tls::status;
    std::byte scratch[64];
    for (int round = 0; round < max_idle_rounds; ++round) {
      for (;;) {  // decrypt whatever the engine holds
        std::size_t n = 0;
        const st s = tls_.read(scratch, n);
        if (s == st::ok) return true;  // application data: a reply nobody asked for
        if (s == st::closed || s == st::failed) return true;
        break;  // want_read (or want_write: its output goes out with the next batch)
      }
      const std::span<std::byte> in = tls_.recv_space();
      if (in.empty()) return true;  // a full buffer of records that are not data: give up
      const ssize_t r = ::recv(fd_, in.data(), in.size(), MSG_DONTWAIT);
      if (r > 0) {
        tls_.received(static_cast<std::size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      return !(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));  // 0: EOF; else an error
    }
    return true;
  }
  bool tls_active() const noexcept {
    if constexpr (Tls::enabled) return tls_.active();
    return false;
  }

  // ---- TLS: ciphertext through the ring, plaintext through the engine ---------------------

  // Posts a SEND of the engine's ciphertext and a RECV into its buffer, each when none is in
  // flight (and, for the RECV, when `want_read`; its buffer is never full then: a read that
  // wants more has consumed it).
  void tls_post(bool want_read) {
    if (!(inflight_mask_ & (1u << op_send))) {
      const std::span<const std::byte> out = tls_.to_send();
      if (!out.empty()) {
        io_uring_sqe* s = sqe();
        io_uring_prep_send(s, fd_, out.data(), out.size(), MSG_NOSIGNAL);
        io_uring_sqe_set_data64(s, op_send);
        submit(op_send);
      }
    }
    if (want_read && !(inflight_mask_ & (1u << op_recv))) {
      const std::span<std::byte> in = tls_.recv_space();
      if (!in.empty()) {
        io_uring_sqe* s = sqe();
        io_uring_prep_recv(s, fd_, in.data(), in.size(), 0);
        io_uring_sqe_set_data64(s, op_recv);
        submit(op_recv);
      }
    }
  }

  // Reaps one completion (waiting by dl) into the engine. Returns 0, -ETIME at the deadline,
  // -ECONNRESET when the peer closed or the socket failed, else -errno of the wait.
  int tls_reap(deadline dl) {
    int outcome = 0;
    auto on = [this, &outcome](std::uint64_t id, int res) {
      if (res == -EINTR || res == -EAGAIN) return;  // nothing moved: posted again
      if (res <= 0) {
        outcome = -ECONNRESET;  // 0: EOF
      } else if (id == op_send) {
        tls_.sent(static_cast<std::size_t>(res));
      } else if (id == op_recv) {
        tls_.received(static_cast<std::size_t>(res));
      }
    };
    io_uring_cqe* cqe = nullptr;
    if (const int w = wait(dl, &cqe); w != 0) return w;
    reap(cqe, &on);
    while (outcome == 0 && io_uring_peek_cqe(&ring_, &cqe) == 0) reap(cqe, &on);
    return outcome;
  }

  // The client handshake by dl; a failure's reason goes to the base.
  std::error_code tls_handshake(deadline dl) {
    std::string why;
    if (std::error_code ec = tls_.start(opts(), why)) {
      this->set_transport_text("TLS: " + why);
      return ec;
    }
    using st = typename Tls::status;
    for (;;) {
      st s = st::want_read;
      if (!(inflight_mask_ & (1u << op_recv))) {  // a RECV in flight: the engine must not read
        s = tls_.handshake();
        if (s == st::ok && tls_.to_send().empty() && inflight_ == 0) return {};
        if (s == st::failed || s == st::closed) {
          this->set_transport_text("TLS handshake: " + tls_.explain());
          cancel_all();
          return make_error_code(errc::tls_failed);
        }
      }
      tls_post(s == st::want_read);
      const int r = tls_reap(dl);
      if (r == -ETIME) {
        this->set_transport_text(detail::tls_silent_peer_text);
        cancel_all();
        return make_error_code(errc::timeout);
      }
      if (r != 0) {
        this->set_transport_text("TLS handshake: " + tls_.explain("connection closed by the server", true));
        cancel_all();
        return make_error_code(r == -ECONNRESET ? errc::tls_failed : errc::backend_error);
      }
    }
  }

  // The exchange over TLS: plaintext from write_buffers() is encrypted into the engine and its
  // ciphertext sent; ciphertext received is decrypted into read_span(), so a payload is
  // decrypted straight into the caller's span.
  std::error_code tls_exchange(deadline dl) {
    using st = typename Tls::status;
    std::error_code result;
    auto fail = [&](std::error_code e) {
      if (!result) result = e;
    };
    for (;;) {
      bool want_read = false;
      // Encrypt while the engine has room (small buffers are gathered into one record).
      while (!result && write_pending()) {
        std::size_t n = 0;
        const st s = tls_.write(next_plaintext(), n);
        if (s == st::ok) {
          on_written(n);
        } else {
          if (s != st::want_write) fail(make_error_code(errc::connection_lost));
          break;
        }
      }
      // Decrypt what arrived, unless a RECV into the engine's buffer is in flight. After the
      // last reply, records already received are decrypted too (plaintext or not), so the base
      // sees stray bytes and closes for them; a session ticket is consumed, and the session's
      // end is left to the next batch's idle check.
      const bool recv_busy = inflight_mask_ & (1u << op_recv);
      while (!result && !recv_busy) {
        const bool done = replies_done();
        std::size_t n = 0;
        const st s = tls_.read(read_span(), n);
        if (s == st::ok) {
          if (std::error_code e = on_read(n)) fail(e);
          if (done) break;  // stray bytes: buffered in the base, which closes for them
        } else {
          if (done) break;
          want_read = s == st::want_read;
          if (s != st::want_read && s != st::want_write) fail(make_error_code(errc::connection_lost));
          break;
        }
      }
      if (!result) tls_post(want_read);
      if (inflight_ == 0) {
        if (!result && (write_pending() || !replies_done())) fail(make_error_code(errc::connection_lost));
        break;
      }
      if (result) {
        cancel_all();
        break;
      }
      const int r = tls_reap(dl);
      if (r == -ETIME)
        fail(make_error_code(errc::timeout));
      else if (r != 0)
        fail(make_error_code(r == -ECONNRESET ? errc::connection_lost : errc::backend_error));
    }
    return result;
  }

  // The next plaintext to encrypt: the first write buffer, or when it is small, the small
  // buffers after it gathered into one record's worth (a TLS record per RESP header costs).
  std::span<const std::byte> next_plaintext() {
    const auto bufs = write_buffers();
    if (bufs.front().size() >= stage_bytes) return bufs.front();
    stage_.clear();
    for (const auto& b : bufs) {
      if (stage_.size() + b.size() > stage_bytes) break;
      stage_.insert(stage_.end(), b.begin(), b.end());
    }
    return stage_;
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  int fd_ = -1;
  unsigned inflight_ = 0;       // send/recv/connect operations submitted and not reaped
  unsigned inflight_mask_ = 0;  // which of them (bit = op id)
  unsigned cancels_ = 0;        // cancel requests not reaped
  std::vector<iovec> iov_;
  msghdr msg_{};
  static constexpr std::size_t stage_bytes = 16 * 1024;  // one TLS record
  static constexpr int max_idle_rounds = 16;             // socket reads per idle TLS check
  std::vector<std::byte> stage_;
  Tls tls_;
};

/// Plain TCP and Unix sockets.
using uring_connection = basic_uring_connection<detail::uring_no_tls>;
static_assert(connection<uring_connection>);

}  // namespace kvtier::resp
