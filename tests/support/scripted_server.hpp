// tests/support/scripted_server.hpp: a loopback TCP server that answers each RESP command with
// whatever a test's function returns (raw RESP bytes), for protocol paths a real server will not
// take on demand (a redirect loop, a server without CLUSTER SLOTS). Commands are decoded with
// kvtier's own parser (requests are arrays of bulk strings). One thread per connection; all are
// joined in the destructor (client sockets are shut down first; loopback_acceptor.hpp).
//
//   kvtier::test::scripted_server s([&](const std::vector<std::string>& cmd) -> std::string {
//     if (cmd[0] == "GET") return "-MOVED 866 127.0.0.1:" + std::to_string(s.port()) + "\r\n";
//     return "+OK\r\n";
//   });
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "support/command_loop.hpp"
#include "support/loopback_acceptor.hpp"
#include "support/redis_server.hpp"

namespace kvtier::test {

class scripted_server {
 public:
  using script = std::function<std::string(const std::vector<std::string>& command)>;

  explicit scripted_server(script answer) : answer_(std::move(answer)) {}
  scripted_server(const scripted_server&) = delete;
  scripted_server& operator=(const scripted_server&) = delete;

  std::uint16_t port() const noexcept { return acceptor_.port(); }
  /// Commands answered so far.
  std::size_t commands() const noexcept { return commands_.load(); }

 private:
  void serve(int fd) {
    serve_commands([&](std::span<std::byte> into) { return ::recv(fd, into.data(), into.size(), 0); },
                   [&](const std::vector<std::string>& cmd) {
                     commands_.fetch_add(1);
                     try {
                       detail::send_all(fd, answer_(cmd));
                     } catch (const std::exception&) {
                       return false;
                     }
                     return true;
                   });
  }

  script answer_;
  std::atomic<std::size_t> commands_{0};
  loopback_acceptor acceptor_{[this](int fd) { serve(fd); }};  // last: stops before the rest
};

}  // namespace kvtier::test
