// bench/resp_io/floor_clients.hpp: the floors bench_l2_floor measures kvtier's L2 path against.
//
//   raw_pipelined   one blocking connection, the whole batch pipelined, each payload received
//                   with recv(MSG_WAITALL) straight into its buffer (SET: writev of the command
//                   head, the caller's bytes and the CRLF)
//   raw_per_rtt     LMCache's pattern: a worker thread per connection, each with a blocking
//                   connection; a batch is split into one tile per worker, each GET/SET is one
//                   round trip, its payload received straight into the caller's buffer
//
//   kvtier_bench::raw_pipelined c(port);
//   std::string err;
//   if (!c.get(keys, dst, err)) fail(err);      // keys[i] -> dst[i] (exact length checked)
//
// No deadlines, no reconnects, no checksum: floors, not clients. Errors come back as text.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/redis_server.hpp"

namespace kvtier_bench {

/// One blocking loopback connection speaking just enough RESP for GET and SET.
class raw_conn {
 public:
  explicit raw_conn(std::uint16_t port)
      : fd_(kvtier::test::detail::connect_loopback(port, std::chrono::milliseconds(30000))) {}
  ~raw_conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  raw_conn(const raw_conn&) = delete;
  raw_conn& operator=(const raw_conn&) = delete;
  bool ok() const noexcept { return fd_ >= 0; }

  /// Sends GET for each key in one write.
  bool send_gets(std::span<const std::string> keys, std::string& err) {
    req_.clear();
    for (const auto& k : keys)
      req_ += "*2\r\n$3\r\nGET\r\n$" + std::to_string(k.size()) + "\r\n" + k + "\r\n";
    return send_all(req_.data(), req_.size(), err);
  }
  /// Reads one GET reply of exactly dst.size() bytes into dst.
  bool recv_value(std::span<std::byte> dst, std::string& err) {
    std::size_t eol;
    while ((eol = std::string_view(buf_, have_).find("\r\n")) == std::string_view::npos)
      if (!fill(err)) return false;
    if (buf_[0] != '$' || std::strtoull(buf_ + 1, nullptr, 10) != dst.size()) {
      err = "raw: unexpected GET reply " + std::string(buf_, eol);
      return false;
    }
    consume(eol + 2);
    const std::size_t from_buf = std::min(have_, dst.size());
    std::memcpy(dst.data(), buf_, from_buf);
    consume(from_buf);
    for (std::size_t got = from_buf; got < dst.size();) {
      const ssize_t n = ::recv(fd_, dst.data() + got, dst.size() - got, MSG_WAITALL);
      if (n <= 0) return err = "raw: connection lost", false;
      got += static_cast<std::size_t>(n);
    }
    while (have_ < 2)
      if (!fill(err)) return false;
    consume(2);
    return true;
  }
  /// Sends SET key value for each pair, the values from the caller's memory (writev).
  bool send_sets(std::span<const std::string> keys, std::span<const std::span<const std::byte>> src,
                 std::string& err) {
    heads_.resize(keys.size());
    iov_.clear();
    static const char crlf[] = "\r\n";
    for (std::size_t i = 0; i < keys.size(); ++i) {
      heads_[i] = "*3\r\n$3\r\nSET\r\n$" + std::to_string(keys[i].size()) + "\r\n" + keys[i] + "\r\n$" +
                  std::to_string(src[i].size()) + "\r\n";
      iov_.push_back({heads_[i].data(), heads_[i].size()});
      iov_.push_back({const_cast<std::byte*>(src[i].data()), src[i].size()});
      iov_.push_back({const_cast<char*>(crlf), 2});
    }
    return send_iov(err);
  }
  /// Reads one +OK.
  bool recv_ok(std::string& err) {
    std::size_t eol;
    while ((eol = std::string_view(buf_, have_).find("\r\n")) == std::string_view::npos)
      if (!fill(err)) return false;
    if (std::string_view(buf_, eol) != "+OK")
      return err = "raw: SET replied " + std::string(buf_, eol), false;
    consume(eol + 2);
    return true;
  }

 private:
  bool send_all(const char* p, std::size_t n, std::string& err) {
    while (n > 0) {
      const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (w <= 0) return err = "raw: send failed", false;
      p += w, n -= static_cast<std::size_t>(w);
    }
    return true;
  }
  bool send_iov(std::string& err) {
    std::size_t at = 0;
    while (at < iov_.size()) {
      const int cnt = static_cast<int>(std::min<std::size_t>(iov_.size() - at, IOV_MAX));
      ssize_t w = ::writev(fd_, iov_.data() + at, cnt);
      if (w <= 0) return err = "raw: writev failed", false;
      auto left = static_cast<std::size_t>(w);
      while (at < iov_.size() && left >= iov_[at].iov_len) left -= iov_[at++].iov_len;
      if (left > 0) {
        iov_[at].iov_base = static_cast<char*>(iov_[at].iov_base) + left;
        iov_[at].iov_len -= left;
      }
    }
    return true;
  }
  bool fill(std::string& err) {
    const ssize_t n = ::recv(fd_, buf_ + have_, sizeof buf_ - have_, 0);
    if (n <= 0) return err = "raw: connection lost", false;
    have_ += static_cast<std::size_t>(n);
    return true;
  }
  void consume(std::size_t n) {
    std::memmove(buf_, buf_ + n, have_ - n);
    have_ -= n;
  }
  int fd_;
  std::string req_;
  std::vector<std::string> heads_;
  std::vector<iovec> iov_;
  char buf_[64];  // header lines only: payloads go straight to their buffers
  std::size_t have_ = 0;
};

/// The raw pipelined floor: one connection, the whole batch in one write, replies in order.
class raw_pipelined {
 public:
  explicit raw_pipelined(std::uint16_t port) : c_(port) {}
  bool ok() const noexcept { return c_.ok(); }
  bool get(std::span<const std::string> keys, std::span<const std::span<std::byte>> dst, std::string& err) {
    if (!c_.send_gets(keys, err)) return false;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!c_.recv_value(dst[i], err)) return false;
    return true;
  }
  bool set(std::span<const std::string> keys, std::span<const std::span<const std::byte>> src,
           std::string& err) {
    if (!c_.send_sets(keys, src, err)) return false;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!c_.recv_ok(err)) return false;
    return true;
  }

 private:
  raw_conn c_;
};

/// LMCache's pattern: `workers` threads, each with its own connection; a batch is cut into one
/// contiguous tile per worker; each command is one round trip. The caller waits for all tiles.
class raw_per_rtt {
 public:
  raw_per_rtt(std::uint16_t port, std::size_t workers) : workers_(workers) {
    for (std::size_t w = 0; w < workers; ++w) conns_.push_back(std::make_unique<raw_conn>(port));
    errs_.resize(workers);
    for (std::size_t w = 0; w < workers; ++w) threads_.emplace_back([this, w] { loop(w); });
  }
  ~raw_per_rtt() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  bool ok() const {
    for (const auto& c : conns_)
      if (!c->ok()) return false;
    return true;
  }
  bool get(std::span<const std::string> keys, std::span<const std::span<std::byte>> dst, std::string& err) {
    return run(keys.size(), err, [&](std::size_t w, std::size_t i, std::string& e) {
      return conns_[w]->send_gets(keys.subspan(i, 1), e) && conns_[w]->recv_value(dst[i], e);
    });
  }
  bool set(std::span<const std::string> keys, std::span<const std::span<const std::byte>> src,
           std::string& err) {
    return run(keys.size(), err, [&](std::size_t w, std::size_t i, std::string& e) {
      return conns_[w]->send_sets(keys.subspan(i, 1), src.subspan(i, 1), e) && conns_[w]->recv_ok(e);
    });
  }

 private:
  using one_fn = std::function<bool(std::size_t worker, std::size_t index, std::string& err)>;

  // Tile w = keys [w*n/W, (w+1)*n/W); every worker runs its tile, the caller waits for all.
  bool run(std::size_t n, std::string& err, one_fn fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = std::move(fn);
      n_ = n;
      pending_ = workers_;
      ++generation_;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    for (auto& e : errs_)
      if (!e.empty()) return err = e, false;
    return true;
  }
  void loop(std::size_t w) {
    std::uint64_t seen = 0;
    for (;;) {
      std::size_t n;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        n = n_;
      }
      const std::size_t from = w * n / workers_, to = (w + 1) * n / workers_;
      std::string e;
      for (std::size_t i = from; i < to && e.empty(); ++i) fn_(w, i, e);
      {
        std::lock_guard<std::mutex> lock(mu_);
        errs_[w] = std::move(e);
        --pending_;
      }
      done_cv_.notify_one();
    }
  }

  std::size_t workers_;
  std::vector<std::unique_ptr<raw_conn>> conns_;
  std::vector<std::thread> threads_;
  std::vector<std::string> errs_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  one_fn fn_;
  std::size_t n_ = 0, pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace kvtier_bench
