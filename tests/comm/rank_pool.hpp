// tests/comm/rank_pool.hpp: a persistent pool of threads that run W ranks at once.
//
// Property tests run thousands of small worlds; creating W threads per case would
// dominate, so the ranks are threads of one pool that lives for the whole test.
//
//   kvtier::test::rank_pool pool(16);
//   pool.run(4, [&](unsigned r) { /* rank r's body; all 4 run concurrently */ });
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvtier::test {

class rank_pool {
 public:
  explicit rank_pool(unsigned threads) {
    workers_.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  rank_pool(const rank_pool&) = delete;
  rank_pool& operator=(const rank_pool&) = delete;
  ~rank_pool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  unsigned capacity() const noexcept { return static_cast<unsigned>(workers_.size()); }

  /// Runs fn(r) for every r < w on w distinct pool threads concurrently; returns
  /// when all finished. fn must not throw.
  void run(unsigned w, std::function<void(unsigned)> fn) {
    if (w > workers_.size()) throw std::invalid_argument("rank_pool: more ranks than threads");
    std::unique_lock lk(mu_);
    fn_ = std::move(fn);
    width_ = w;
    done_ = 0;
    ++generation_;
    cv_.notify_all();
    done_cv_.wait(lk, [&] { return done_ == width_; });
    fn_ = nullptr;
  }

 private:
  void loop(unsigned i) {
    std::uint64_t seen = 0;
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (i >= width_) continue;
      auto* fn = &fn_;
      lk.unlock();
      (*fn)(i);
      lk.lock();
      if (++done_ == width_) done_cv_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void(unsigned)> fn_;
  unsigned width_ = 0, done_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvtier::test
