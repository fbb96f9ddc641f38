// kvtier/resp/detail/conn_socket.hpp: POSIX socket helpers shared by the RESP transports
// (Asio and io_uring): socket options, the idle "did the peer go away?" check, and a host
// name resolution bounded by a deadline (for the io_uring transport; Asio has its own).
//
//   kvtier::resp::detail::conn_tune_socket(fd, /*tcp=*/true, /*buffer_bytes=*/0);
//   if (kvtier::resp::detail::conn_peer_closed(fd)) reconnect();
//   kvtier::resp::detail::conn_addresses addrs;
//   std::error_code ec = kvtier::resp::detail::conn_resolve("localhost", 6379, dl, addrs);
#pragma once

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kvtier/deadline.hpp"
#include "kvtier/detail/cv_wait.hpp"
#include "kvtier/errc.hpp"

namespace kvtier::resp::detail {

/// TCP_NODELAY (TCP only) and, when buffer_bytes > 0, SO_RCVBUF/SO_SNDBUF.
inline void conn_tune_socket(int fd, bool tcp, int buffer_bytes) noexcept {
  int one = 1;
  if (tcp) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

/// Why a TLS handshake got no answer, for both transports: a plaintext server reads the
/// ClientHello as the start of a command and waits for the rest.
inline constexpr const char* tls_silent_peer_text =
    "TLS handshake: no answer by the deadline (is the server speaking TLS on this port? a plaintext "
    "Redis waits silently for the rest of a command; use resp:// for a plaintext port)";

/// For a connection with no request in flight: true if the peer closed it, reset it, or (with
/// data_means_closed) sent bytes nobody asked for (the stream is then unusable). One
/// non-blocking peek, no waiting.
inline bool conn_peer_closed(int fd, bool data_means_closed = true) noexcept {
  char c;
  for (;;) {
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return !(errno == EAGAIN || errno == EWOULDBLOCK);
    return n == 0 || data_means_closed;  // 0: orderly close; > 0: unsolicited bytes
  }
}

struct conn_address {
  sockaddr_storage addr{};
  socklen_t len = 0;
};
using conn_addresses = std::vector<conn_address>;

/// getaddrinfo(host, port) for stream sockets into `out`; false if it did not resolve. With
/// numeric_only (AI_NUMERICHOST) only IPv4/IPv6 literals resolve, without any I/O.
inline bool conn_getaddrinfo(const std::string& host, std::uint16_t port, bool numeric_only,
                             conn_addresses& out) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (numeric_only ? AI_NUMERICHOST : 0);
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    conn_address ca;
    std::memcpy(&ca.addr, a->ai_addr, a->ai_addrlen);
    ca.len = a->ai_addrlen;
    out.push_back(ca);
  }
  ::freeaddrinfo(res);
  return !out.empty();
}

/// A blocking name lookup: fills `out`, false if the name did not resolve.
using conn_lookup = std::function<bool(const std::string& host, std::uint16_t port, conn_addresses& out)>;

/// The addresses of host:port, by `dl`. IPv4/IPv6 literals are parsed in place. Any other name
/// goes to `lookup` (getaddrinfo, which no deadline can interrupt) on a detached helper thread
/// that the caller waits for until `dl`; on timeout the helper finishes on its own into state
/// it shares, never into the caller's. Errors: errc::resolve_failed, errc::timeout,
/// errc::backend_error (no thread could be started).
inline std::error_code conn_resolve(
    const std::string& host, std::uint16_t port, deadline dl, conn_addresses& out,
    const conn_lookup& lookup = [](const std::string& h, std::uint16_t p, conn_addresses& o) {
      return conn_getaddrinfo(h, p, false, o);
    }) {
  out.clear();
  if (conn_getaddrinfo(host, port, true, out)) return {};
  struct job {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    bool ok = false;
    conn_addresses addrs;
  };
  auto j = std::make_shared<job>();
  try {
    std::thread([j, host, port, lookup] {
      conn_addresses addrs;
      const bool ok = lookup(host, port, addrs);
      std::lock_guard lk(j->m);
      j->ok = ok;
      j->addrs = std::move(addrs);
      j->done = true;
      j->cv.notify_all();
    }).detach();
  } catch (const std::system_error&) {
    return make_error_code(errc::backend_error);
  }
  std::unique_lock lk(j->m);
  if (!kvtier::detail::wait_until(j->cv, lk, dl, [&] { return j->done; }))
    return make_error_code(errc::timeout);
  if (!j->ok) return make_error_code(errc::resolve_failed);
  out = std::move(j->addrs);
  return {};
}

}  // namespace kvtier::resp::detail
