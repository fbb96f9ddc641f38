// tests/support/loopback_acceptor.hpp: a loopback TCP listener for the scripted test servers
// (scripted_server.hpp, scripted_tls_server.hpp): it accepts on a free port and runs serve(fd)
// on a thread per connection. The destructor shuts the listener and every client socket down
// (serve must then return) and joins every thread; make it the owner's last member, so it
// stops before anything serve() uses.
//
//   kvtier::test::loopback_acceptor acceptor([this](int fd) { serve(fd); });
//   connect_to(acceptor.port());
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvtier::test {

class loopback_acceptor {
 public:
  explicit loopback_acceptor(std::function<void(int fd)> serve) : serve_(std::move(serve)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error("loopback_acceptor: socket failed");
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(listen_fd_);
      throw std::runtime_error("loopback_acceptor: bind/listen failed");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  loopback_acceptor(const loopback_acceptor&) = delete;
  loopback_acceptor& operator=(const loopback_acceptor&) = delete;
  ~loopback_acceptor() {
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

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      clients_.emplace_back([this, fd] { serve_(fd); });
    }
  }

  std::function<void(int fd)> serve_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> clients_;
};

}  // namespace kvtier::test
