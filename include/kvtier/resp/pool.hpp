// kvtier/resp/pool.hpp: N connections to one server, shared by threads, with a deadline to get one.
//
// A connection runs one batch at a time, so one connection shared by a fetch worker streaming a
// batch of 12 MB GETs and an engine thread asking EXISTS makes the EXISTS wait for the whole
// batch. A pool holds `connections` connections to the same server (opened lazily, on first
// use) and lends one per call. Requests come in two sizes: `large` ones (GET/SET batches that
// move payloads) may use only the connections beyond `reserved_small`; `small` ones (EXISTS,
// PING, a small GET) may use any, the reserved ones first. So a small command never queues
// behind large batches: with every large connection busy, a reserved one is still free for it.
//
//   kvtier::resp::connection_pool<kvtier::resp::asio_connection> pool(opt, {.connections = 4});
//   kvtier::resp::connection_pool<kvtier::resp::asio_connection>::lease l;
//   if (std::error_code ec = pool.acquire(kvtier::resp::request_size::small, dl, l)) return ec;  // timeout
//   ec = l.conn().execute(b, dl);     // the lease gives the connection back when it goes
//   std::vector<decltype(l)> ls;       // or several at once, for a batch spread over them:
//   ec = pool.acquire_up_to(kvtier::resp::request_size::large, 3, dl, ls);   // 1..3 leases
//
// Thread-safe. acquire() waits for a free connection until its deadline (errc::timeout), never
// longer. stats() sums the counters of the connections as of their last release.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/deadline.hpp"
#include "kvtier/detail/cv_wait.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/connection.hpp"

namespace kvtier::resp {

/// Size of a pool and how many of its connections only small requests may use.
struct pool_options {
  std::size_t connections = 4;     ///< connections to the server (at least 1)
  std::size_t reserved_small = 1;  ///< of those, kept for small requests (< connections)
};

/// Which connections a request may take (see the header comment).
enum class request_size : std::uint8_t { small, large };

/// A fixed set of connections to one server, lent one per call.
template <connection Connection>
class connection_pool {
 public:
  /// A borrowed connection; gives it back when destroyed (or on release()).
  class lease {
   public:
    lease() = default;
    lease(lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), index_(o.index_) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        release();
        pool_ = std::exchange(o.pool_, nullptr);
        index_ = o.index_;
      }
      return *this;
    }
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() { release(); }

    explicit operator bool() const noexcept { return pool_ != nullptr; }
    Connection& conn() const noexcept { return *pool_->conns_[index_]; }
    /// Which connection of the pool (0 .. size()-1): lets a caller keep scratch per connection.
    std::size_t index() const noexcept { return index_; }
    void release() noexcept {
      if (pool_ != nullptr) std::exchange(pool_, nullptr)->give_back(index_);
    }

   private:
    friend class connection_pool;
    connection_pool* pool_ = nullptr;
    std::size_t index_ = 0;
  };

  explicit connection_pool(connection_options opt, pool_options p = {})
      : opt_(std::move(opt)),
        reserved_(std::min(p.reserved_small, std::max<std::size_t>(p.connections, 1) - 1)),
        busy_(std::max<std::size_t>(p.connections, 1), false),
        snapshots_(busy_.size()) {
    conns_.reserve(busy_.size());
    for (std::size_t i = 0; i < busy_.size(); ++i) conns_.push_back(std::make_unique<Connection>(opt_));
  }
  connection_pool(const connection_pool&) = delete;
  connection_pool& operator=(const connection_pool&) = delete;

  /// Lends a free connection of the request's size class, waiting for one until `dl`.
  /// errc::timeout when none came free in time (`out` stays empty).
  std::error_code acquire(request_size kind, deadline dl, lease& out) {
    out.release();
    std::unique_lock<std::mutex> lock(mu_);
    std::size_t index = npos;
    auto pick = [&] { return (index = find_free(kind)) != npos; };
    if (!kvtier::detail::wait_until(cv_, lock, dl, pick)) return make_error_code(errc::timeout);
    busy_[index] = true;
    out.pool_ = this;
    out.index_ = index;
    return {};
  }

  /// Lends up to `n` connections of the request's size class at once (a batch spread over
  /// them): waits until `dl` for the first, then takes whichever others are free now, without
  /// waiting. errc::timeout when none came free in time (`out` empty). `out` is cleared first.
  std::error_code acquire_up_to(request_size kind, std::size_t n, deadline dl, std::vector<lease>& out) {
    out.clear();
    if (n == 0) return {};
    std::vector<std::size_t> got;
    {
      std::unique_lock<std::mutex> lock(mu_);
      std::size_t index = npos;
      auto pick = [&] { return (index = find_free(kind)) != npos; };
      if (!kvtier::detail::wait_until(cv_, lock, dl, pick)) return make_error_code(errc::timeout);
      do {
        busy_[index] = true;
        got.push_back(index);
      } while (got.size() < n && (index = find_free(kind)) != npos);
    }
    out.resize(got.size());
    for (std::size_t k = 0; k < got.size(); ++k) out[k].pool_ = this, out[k].index_ = got[k];
    return {};
  }

  std::size_t size() const noexcept { return conns_.size(); }
  std::size_t reserved_small() const noexcept { return reserved_; }
  const connection_options& options() const noexcept { return opt_; }

  /// The connections' counters, summed, as of each one's last release.
  connection_stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    connection_stats s;
    for (const connection_stats& x : snapshots_) {
      s.batches += x.batches, s.commands += x.commands, s.connects += x.connects;
      s.connect_failures += x.connect_failures, s.timeouts += x.timeouts, s.failures += x.failures;
      s.health_checks += x.health_checks, s.bytes_written += x.bytes_written, s.bytes_read += x.bytes_read;
    }
    return s;
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  // Small requests take the reserved connections first, so the large ones stay free for large
  // requests; large requests never take a reserved one.
  std::size_t find_free(request_size kind) const noexcept {
    const std::size_t from = kind == request_size::large ? reserved_ : 0;
    for (std::size_t i = from; i < busy_.size(); ++i)
      if (!busy_[i]) return i;
    return npos;
  }

  void give_back(std::size_t index) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      snapshots_[index] = conns_[index]->stats();
      busy_[index] = false;
    }
    cv_.notify_all();  // waiters of both sizes: a freed connection may suit only some of them
  }

  connection_options opt_;
  std::size_t reserved_;
  std::vector<std::unique_ptr<Connection>> conns_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
  std::vector<connection_stats> snapshots_;
};

}  // namespace kvtier::resp
