// kvtier/store/batch_spread.hpp: how a Redis-protocol store spreads one batch over several
// pooled connections, with a bound on the bytes in flight on each.
//
// A whole batch of large values pipelined on one connection makes the server queue all of its
// replies in one client's output buffer; redis then faults those pages afresh on every batch and
// its CPU per GB doubles (issue 19 measured 122,000 minor faults per GB against 2,000-4,000 with
// one GET per connection at a time). Small values want the opposite: a deep pipeline. So a
// batch is cut, in the caller's order, into pieces of at most `max_reply_bytes` (at least one
// key each); the pool lends up to `max_connections` connections, and each runs one piece at a
// time, taking the next unclaimed piece when its own is done. A piece's keys keep their indices,
// so results land in the caller's order; a connection that fails stops taking pieces, so a
// failure fails only its own piece's keys; pieces nobody could take end as the call's error
// (timeout when the deadline passed).
//
//   kvtier::remote_store<kvtier::resp::asio_connection> l2(ns, opt, {.connections = 4},
//   kvtier::value_format::v1(),
//                                                          {.max_reply_bytes = 1 << 20});
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace kvtier {

/// How one get/put batch is spread over a store's pooled connections (see the header comment).
struct batch_spread {
  /// Most value bytes (header included) one connection has in flight: a piece of the batch.
  /// A value larger than this goes alone. 0: never spread (the whole batch on one connection).
  /// 1 MiB is the knee `bench_l2_floor --knee` measured (GETs of 256 KiB-1 MiB values, batches
  /// of 8-16: best at 1 MiB per connection, worse at 256 KiB or 2-4 MiB, worst unspread).
  std::size_t max_reply_bytes = 1u << 20;
  /// Most connections one batch uses; 0: every connection a large request may take.
  std::size_t max_connections = 0;
};

namespace detail {

/// A batch cut into consecutive pieces: piece p is entries [starts[p], starts[p + 1]).
struct batch_pieces {
  std::vector<std::size_t> starts;
  std::size_t count() const noexcept { return starts.empty() ? 0 : starts.size() - 1; }
};

/// Cuts entries of `bytes[i]` bytes into pieces of at most `limit` bytes (at least one entry each).
inline batch_pieces cut_batch(std::span<const std::size_t> bytes, std::size_t limit) {
  batch_pieces p;
  p.starts.push_back(0);
  std::size_t in_piece = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i > p.starts.back() && in_piece + bytes[i] > limit) {
      p.starts.push_back(i);
      in_piece = 0;
    }
    in_piece += bytes[i];
  }
  if (!bytes.empty()) p.starts.push_back(bytes.size());
  return p;
}

/// Helper threads that run a call's lanes in parallel: lane k of a call runs on the worker of
/// pool connection ids[k] (so calls holding disjoint connections use disjoint workers), lane 0
/// on the calling thread. Workers start on first use and wait on a condition variable between
/// calls; a worker that cannot be started runs its lane on the calling thread instead.
class lane_crew {
 public:
  explicit lane_crew(std::size_t connections) : workers_(connections) {}
  lane_crew(const lane_crew&) = delete;
  lane_crew& operator=(const lane_crew&) = delete;
  ~lane_crew() {
    for (auto& w : workers_) {
      if (!w || !w->thread.joinable()) continue;
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->stop = true;
      }
      w->cv.notify_one();
      w->thread.join();
    }
  }

  /// Runs lane(k) for every k < ids.size(), in parallel, and returns when all have returned.
  /// `lane` must not throw. Throws (std::bad_alloc) only before any lane started: once one
  /// runs on a worker, nothing here unwinds the call its lanes use.
  template <class Lane>
  void run(std::span<const std::size_t> ids, Lane& lane) {
    call c;
    c.fn = [](void* ctx, std::size_t k) noexcept { (*static_cast<Lane*>(ctx))(k); };
    c.ctx = &lane;
    std::vector<std::size_t> inline_lanes;
    inline_lanes.reserve(ids.size());  // the only allocation: push_back below never throws
    for (std::size_t k = 1; k < ids.size(); ++k)
      if (!post(ids[k], c, k)) inline_lanes.push_back(k);
    lane(0);
    for (std::size_t k : inline_lanes) lane(k);
    std::unique_lock<std::mutex> lock(c.mu);
    c.cv.wait(lock, [&] { return c.posted == c.finished; });
  }

 private:
  struct call {
    void (*fn)(void*, std::size_t) noexcept = nullptr;
    void* ctx = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    std::size_t posted = 0, finished = 0;  // under mu
  };
  struct worker {
    std::mutex mu;
    std::condition_variable cv;
    call* job = nullptr;  // under mu
    std::size_t lane = 0;
    bool stop = false;
    std::thread thread;
  };

  // Hands lane k of c to connection id's worker (started on first use). False: no worker (one
  // that cannot be allocated or started: the lane runs on the calling thread). Never throws.
  bool post(std::size_t id, call& c, std::size_t k) noexcept {
    if (id >= workers_.size()) return false;
    auto& w = workers_[id];
    if (!w) {
      try {
        auto fresh = std::make_unique<worker>();
        fresh->thread = std::thread([p = fresh.get()] { loop(*p); });
        w = std::move(fresh);
      } catch (...) {  // std::system_error, std::bad_alloc
        return false;
      }
    }
    {
      std::lock_guard<std::mutex> lock(c.mu);
      ++c.posted;
    }
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->job = &c;
      w->lane = k;
    }
    w->cv.notify_one();
    return true;
  }

  static void loop(worker& w) {
    for (;;) {
      call* c = nullptr;
      std::size_t k = 0;
      {
        std::unique_lock<std::mutex> lock(w.mu);
        w.cv.wait(lock, [&] { return w.stop || w.job != nullptr; });
        if (w.job == nullptr) return;  // stop, nothing left to run
        c = std::exchange(w.job, nullptr);
        k = w.lane;
      }
      c->fn(c->ctx, k);
      // The caller may return (and destroy *c) as soon as it sees the count: notify under the lock.
      std::lock_guard<std::mutex> lock(c->mu);
      ++c->finished;
      c->cv.notify_one();
    }
  }

  std::vector<std::unique_ptr<worker>> workers_;
};

}  // namespace detail
}  // namespace kvtier
