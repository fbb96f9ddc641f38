// kvtier/resp/detail/conn_socket.hpp: POSIX socket helpers shared by the RESP transports
// (Asio and io_uring): socket options and the idle "did the peer go away?" check.
//
//   kvtier::resp::detail::conn_tune_socket(fd, /*tcp=*/true, /*buffer_bytes=*/0);
//   if (kvtier::resp::detail::conn_peer_closed(fd)) reconnect();
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>

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

/// For a connection with no request in flight: true if the peer closed it, reset it, or sent
/// bytes nobody asked for (the stream is then unusable). One non-blocking peek, no waiting.
inline bool conn_peer_closed(int fd) noexcept {
  char c;
  for (;;) {
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return !(errno == EAGAIN || errno == EWOULDBLOCK);
    return true;  // 0: orderly close; > 0: unsolicited bytes
  }
}

}  // namespace kvtier::resp::detail
