// examples/pcp_prefill/model_stores.hpp: chunk stores with modeled timing.
//
// - l2_server: one modeled Redis-protocol instance: its data (a kvtier::memory_store)
//   and a single-threaded FIFO: a request that reaches it at time a starts at
//   max(a, end of the previous request) and holds it for modeled_bytes / GB/s.
// - modeled_l2: one rank's client of an l2_server (a kvtier chunk_store): a get
//   pays the fixed cost T0 on its way (in parallel with other clients), then
//   queues at the server; exists and put queue at the server without T0.
// - modeled_l1: a rank's host-memory L1 (a memory_store) whose loads take
//   T0_l1 + bytes / GB/s.
// - null_store: the absent tier (`--l2 none`): everything misses.
//
// Every call sleeps the modeled time scaled by the clock and returns by its
// deadline: a request that would finish late returns timeout for all its keys
// at the deadline (the server still spends the time, as a real one would).
//
//   pcp::l2_server srv(tm, clk, 64ull << 30);
//   pcp::modeled_l2 client(srv);
//   client.get(keys, dst, status, kvtier::deadline_after(2s));
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <system_error>

#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/memory_store.hpp"
#include "timing_model.hpp"

namespace pcp {

namespace detail {
/// Sleeps until `finish`, or until `dl` if that comes first; true if finished in time.
inline bool sleep_within(kvtier::clock::time_point finish, kvtier::deadline dl) {
  if (finish > dl) {
    model_clock::sleep_until(dl);
    return false;
  }
  model_clock::sleep_until(finish);
  return true;
}
inline void mark_all(std::span<kvtier::chunk_status> st, kvtier::chunk_status s) {
  for (auto& x : st) x = s;
}
}  // namespace detail

class l2_server {
 public:
  l2_server(const timing_model& tm, const model_clock& clk, std::size_t capacity_bytes)
      : tm_(tm), clk_(clk), data_(capacity_bytes) {}

  kvtier::memory_store& data() { return data_; }
  const timing_model& model() const { return tm_; }
  const model_clock& clock() const { return clk_; }

  /// Reserves the server for `model_bytes` from `arrival` on (FIFO); returns the finish time.
  kvtier::clock::time_point reserve(kvtier::clock::time_point arrival, double model_bytes) {
    const auto service = clk_.real(model_bytes / (tm_.l2_gbps * 1e9));
    std::lock_guard lock(mu_);
    const auto start = std::max(arrival, busy_until_);
    busy_until_ = start + service;
    busy_ += service;
    ++requests_;
    return busy_until_;
  }
  /// Modeled seconds the server spent serving requests.
  double busy_model_s() const {
    std::lock_guard lock(mu_);
    return clk_.to_model(busy_);
  }
  std::uint64_t requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }
  /// Every `n`-th get request is cut short after half its keys (0 = never): fault injection.
  void set_fault_every(std::uint64_t n) { fault_every_ = n; }
  bool next_get_faults() {
    const std::uint64_t k = ++gets_;
    return fault_every_ > 0 && k % fault_every_ == 0;
  }
  void reset_timing() {
    std::lock_guard lock(mu_);
    busy_until_ = {};
    busy_ = {};
    requests_ = 0;
  }

 private:
  const timing_model& tm_;
  const model_clock& clk_;
  kvtier::memory_store data_;
  mutable std::mutex mu_;
  kvtier::clock::time_point busy_until_{};
  kvtier::clock::duration busy_{};
  std::uint64_t requests_ = 0;
  std::uint64_t fault_every_ = 0;
  std::atomic<std::uint64_t> gets_{0};
};

class modeled_l2 {
 public:
  explicit modeled_l2(l2_server& s) : srv_(&s) {}

  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline dl) {
    if (keys.size() != status.size()) return kvtier::errc::invalid_argument;
    const auto finish = srv_->reserve(kvtier::clock::now(), 0);
    if (!detail::sleep_within(finish, dl))
      return detail::mark_all(status, kvtier::chunk_status::timeout), kvtier::errc::timeout;
    return srv_->data().exists(keys, status, kvtier::no_deadline);
  }

  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    if (keys.size() != status.size() || keys.size() != dst.size()) return kvtier::errc::invalid_argument;
    // The fixed cost first (client, network), then the request joins the server's
    // FIFO in order of arrival there.
    const auto arrival = kvtier::clock::now() + srv_->clock().real(srv_->model().l2_t0_s);
    if (!detail::sleep_within(arrival, dl))
      return detail::mark_all(status, kvtier::chunk_status::timeout), kvtier::errc::timeout;
    if (auto ec = srv_->data().get(keys, dst, status, kvtier::no_deadline)) return ec;
    if (srv_->next_get_faults())  // injected fault: the second half of the batch is lost
      for (std::size_t i = keys.size() / 2; i < keys.size(); ++i) status[i] = kvtier::chunk_status::error;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (status[i] == kvtier::chunk_status::hit) bytes += dst[i].size();
    const auto finish = srv_->reserve(kvtier::clock::now(), srv_->model().model_bytes(bytes));
    if (!detail::sleep_within(finish, dl))
      return detail::mark_all(status, kvtier::chunk_status::timeout), kvtier::errc::timeout;
    return {};
  }

  std::error_code put(std::span<const kvtier::chunk_key> keys,
                      std::span<const std::span<const std::byte>> src, std::span<kvtier::chunk_status> status,
                      kvtier::deadline dl) {
    if (keys.size() != status.size() || keys.size() != src.size()) return kvtier::errc::invalid_argument;
    std::size_t bytes = 0;
    for (const auto& s : src) bytes += s.size();
    const auto finish = srv_->reserve(kvtier::clock::now(), srv_->model().model_bytes(bytes));
    if (!detail::sleep_within(finish, dl))
      return detail::mark_all(status, kvtier::chunk_status::timeout), kvtier::errc::timeout;
    return srv_->data().put(keys, src, status, kvtier::no_deadline);
  }

 private:
  l2_server* srv_;
};

class modeled_l1 {
 public:
  modeled_l1(const timing_model& tm, const model_clock& clk, std::size_t capacity_bytes)
      : tm_(&tm), clk_(&clk), data_(capacity_bytes) {}

  kvtier::memory_store& data() { return data_; }

  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline dl) {
    return data_.exists(keys, status, dl);
  }
  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    const auto t = kvtier::clock::now();
    if (auto ec = data_.get(keys, dst, status, dl)) return ec;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (status[i] == kvtier::chunk_status::hit) bytes += dst[i].size();
    if (bytes == 0) return {};
    const auto finish = t + clk_->real(tm_->l1_t0_s + tm_->model_bytes(bytes) / (tm_->l1_gbps * 1e9));
    if (!detail::sleep_within(finish, dl))
      return detail::mark_all(status, kvtier::chunk_status::timeout), kvtier::errc::timeout;
    return {};
  }
  std::error_code put(std::span<const kvtier::chunk_key> keys,
                      std::span<const std::span<const std::byte>> src, std::span<kvtier::chunk_status> status,
                      kvtier::deadline dl) {
    return data_.put(keys, src, status, dl);
  }

 private:
  const timing_model* tm_;
  const model_clock* clk_;
  kvtier::memory_store data_;
};

struct null_store {
  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline) {
    if (keys.size() != status.size()) return kvtier::errc::invalid_argument;
    return detail::mark_all(status, kvtier::chunk_status::miss), std::error_code{};
  }
  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>>,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    return exists(keys, status, dl);
  }
  std::error_code put(std::span<const kvtier::chunk_key> keys, std::span<const std::span<const std::byte>>,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    return exists(keys, status, dl);
  }
};

static_assert(kvtier::chunk_store<modeled_l2>);
static_assert(kvtier::chunk_store<modeled_l1>);
static_assert(kvtier::chunk_store<null_store>);

}  // namespace pcp
