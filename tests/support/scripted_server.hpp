// tests/support/scripted_server.hpp: a loopback TCP server that answers each RESP command with
// whatever a test's function returns (raw RESP bytes), for protocol paths a real server will not
// take on demand (a redirect loop, a server without CLUSTER SLOTS). Commands are decoded with
// kvtier's own parser (requests are arrays of bulk strings). One thread per connection; all are
// joined in the destructor (client sockets are shut down first).
//
//   kvtier::test::scripted_server s([&](const std::vector<std::string>& cmd) -> std::string {
//     if (cmd[0] == "GET") return "-MOVED 866 127.0.0.1:" + std::to_string(s.port()) + "\r\n";
//     return "+OK\r\n";
//   });
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/resp/parser.hpp"
#include "support/redis_server.hpp"

namespace kvtier::test {

class scripted_server {
 public:
  using script = std::function<std::string(const std::vector<std::string>& command)>;

  explicit scripted_server(script answer) : answer_(std::move(answer)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error("scripted_server: socket failed");
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(listen_fd_);
      throw std::runtime_error("scripted_server: bind/listen failed");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  scripted_server(const scripted_server&) = delete;
  scripted_server& operator=(const scripted_server&) = delete;
  ~scripted_server() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : clients_) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_fd_);
  }

  std::uint16_t port() const noexcept { return port_; }
  /// Commands answered so far.
  std::size_t commands() const noexcept { return commands_.load(); }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      clients_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    resp::parser p;
    for (;;) {
      std::span<std::byte> into = p.prepare();
      const ssize_t n = ::recv(fd, into.data(), into.size(), 0);
      if (n <= 0) return;
      p.commit(static_cast<std::size_t>(n));
      std::error_code ec;
      while (auto v = p.next(ec)) {
        std::vector<std::string> cmd;
        for (const auto& e : v->elements) cmd.push_back(e.str);
        if (cmd.empty()) return;
        commands_.fetch_add(1);
        try {
          detail::send_all(fd, answer_(cmd));
        } catch (const std::exception&) {
          return;
        }
      }
      if (ec) return;
    }
  }

  script answer_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> commands_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> clients_;
};

}  // namespace kvtier::test
