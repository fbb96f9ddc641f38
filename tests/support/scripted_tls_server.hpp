// tests/support/scripted_tls_server.hpp: scripted_server's TLS twin (OpenSSL; link kvtier::tls or
// kvtier::openssl): a loopback TLS server (certificate from test_pki, no client certificate
// asked) that answers each RESP command with the TLS records a test's function returns, one
// SSL_write each, for what a real server will not do on demand: a reply nobody asked for in a
// record of its own, a session ticket between batches. With `hold_rest`, the first record of an
// answer goes out at once and the others wait for release(), so a test can have them arrive
// while the client is idle. One thread per connection; all are joined in the destructor
// (loopback_acceptor.hpp).
//
//   kvtier::test::scripted_tls_server s(pki, [](const std::vector<std::string>& cmd) {
//     if (cmd[0] == "PING") return std::vector<std::string>{"+PONG\r\n", s.send_ticket_record};
//     return std::vector<std::string>{"+OK\r\n", "+STRAY\r\n"};   // two records
//   });
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/command_loop.hpp"
#include "support/loopback_acceptor.hpp"
#include "support/test_pki.hpp"

namespace kvtier::test {

class scripted_tls_server {
 public:
  /// The TLS records answering one command, in order.
  using script = std::function<std::vector<std::string>(const std::vector<std::string>& command)>;
  /// A record that is a new session ticket (a handshake record, not application data).
  static inline const std::string send_ticket_record = std::string("\0ticket", 7);

  scripted_tls_server(const test_pki& pki, script answer, bool hold_rest = false)
      : answer_(std::move(answer)), hold_rest_(hold_rest) {
    // OpenSSL writes with write(): a client that closed must not end the test process.
    ::signal(SIGPIPE, SIG_IGN);
    if (!ctx_ || SSL_CTX_use_certificate_chain_file(ctx_.get(), pki.path("server.pem").c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx_.get(), pki.path("server.key").c_str(), SSL_FILETYPE_PEM) != 1)
      throw std::runtime_error("scripted_tls_server: certificate or key did not load");
  }
  scripted_tls_server(const scripted_tls_server&) = delete;
  scripted_tls_server& operator=(const scripted_tls_server&) = delete;
  ~scripted_tls_server() {
    {
      std::lock_guard<std::mutex> lock(mu_);  // a held answer sees stop_ before it waits again
      stop_ = true;
    }
    cv_.notify_all();
    // acceptor_ (the last member) shuts the sockets down and joins every thread next.
  }

  std::uint16_t port() const noexcept { return acceptor_.port(); }
  /// TLS connections accepted so far.
  std::size_t connections() const noexcept { return connections_.load(); }
  /// Records written so far (SSL_write returned, or the ticket went out).
  std::size_t records_sent() const noexcept { return records_.load(); }
  /// Lets held records go out (hold_rest).
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    ++releases_;
    cv_.notify_all();
  }
  /// Waits (bounded: up to 10 s in 1 ms steps) until `n` records went out; false if they did not.
  bool wait_records(std::size_t n) const {
    for (int i = 0; i < 10000 && records_.load() < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return records_.load() >= n;
  }

 private:
  bool write_record(SSL* ssl, const std::string& r) {
    if (r == send_ticket_record) {
      if (SSL_new_session_ticket(ssl) != 1 || SSL_do_handshake(ssl) != 1) return false;
    } else if (SSL_write(ssl, r.data(), static_cast<int>(r.size())) != static_cast<int>(r.size())) {
      return false;
    }
    records_.fetch_add(1);
    return true;
  }

  void serve(int fd) {
    SSL* ssl = SSL_new(ctx_.get());
    if (ssl == nullptr) return;
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1) {
      connections_.fetch_add(1);
      converse(ssl);
    }
    SSL_free(ssl);
    ERR_clear_error();
  }

  void converse(SSL* ssl) {
    serve_commands(
        [&](std::span<std::byte> into) { return SSL_read(ssl, into.data(), static_cast<int>(into.size())); },
        [&](const std::vector<std::string>& cmd) {
          const std::vector<std::string> records = answer_(cmd);
          for (std::size_t i = 0; i < records.size(); ++i) {
            if (i == 1 && hold_rest_) {
              std::unique_lock<std::mutex> lock(mu_);
              const std::size_t seen = used_releases_++;
              cv_.wait(lock, [&] { return stop_ || releases_ > seen; });
              if (stop_) return false;
            }
            if (!write_record(ssl, records[i])) return false;
          }
          return true;
        });
  }

  script answer_;
  bool hold_rest_ = false;
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx_{SSL_CTX_new(TLS_server_method()), SSL_CTX_free};
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> connections_{0}, records_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t releases_ = 0, used_releases_ = 0;
  loopback_acceptor acceptor_{[this](int fd) { serve(fd); }};  // last: stops before the rest
};

}  // namespace kvtier::test
