// examples/pcp_prefill/model_stores.hpp: the stores behind the modeled tiers.
//
// They hold and return real bytes and take no time: the engine books their
// modeled time on its modeled clock (timing_model.hpp). A store that declares
// `modeled_timing` is timed by the model; any other store (real servers) is
// timed by the wall clock.
//
// - l2_server: one modeled Redis-protocol instance's data (a kvtier::memory_store),
//   with fault injection (every n-th get loses the second half of its batch).
// - modeled_l2: one rank's client of an l2_server (a kvtier chunk_store).
// - modeled_l1: a rank's host-memory L1 (a memory_store).
// - null_store: the absent tier (`--l2 none`): everything misses.
//
//   pcp::l2_server srv(64ull << 30);
//   pcp::modeled_l2 client(srv);
//   client.get(keys, dst, status, kvtier::deadline_after(2s));
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>

#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/memory_store.hpp"

namespace pcp {

namespace detail {
inline void mark_all(std::span<kvtier::chunk_status> st, kvtier::chunk_status s) {
  for (auto& x : st) x = s;
}
}  // namespace detail

class l2_server {
 public:
  explicit l2_server(std::size_t capacity_bytes) : data_(capacity_bytes) {}

  kvtier::memory_store& data() { return data_; }
  /// Every `n`-th get request is cut short after half its keys (0 = never): fault injection.
  void set_fault_every(std::uint64_t n) { fault_every_ = n; }
  bool next_get_faults() {
    const std::uint64_t k = ++gets_;
    return fault_every_ > 0 && k % fault_every_ == 0;
  }

 private:
  kvtier::memory_store data_;
  std::uint64_t fault_every_ = 0;
  std::atomic<std::uint64_t> gets_{0};
};

class modeled_l2 {
 public:
  static constexpr bool modeled_timing = true;
  explicit modeled_l2(l2_server& s) : srv_(&s) {}

  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline dl) {
    return srv_->data().exists(keys, status, dl);
  }
  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    if (auto ec = srv_->data().get(keys, dst, status, dl)) return ec;
    if (!keys.empty() && srv_->next_get_faults())  // injected fault: the second half of the batch is lost
      for (std::size_t i = keys.size() / 2; i < keys.size(); ++i) status[i] = kvtier::chunk_status::error;
    return {};
  }
  std::error_code put(std::span<const kvtier::chunk_key> keys,
                      std::span<const std::span<const std::byte>> src, std::span<kvtier::chunk_status> status,
                      kvtier::deadline dl) {
    return srv_->data().put(keys, src, status, dl);
  }

 private:
  l2_server* srv_;
};

class modeled_l1 {
 public:
  explicit modeled_l1(std::size_t capacity_bytes) : data_(capacity_bytes) {}

  kvtier::memory_store& data() { return data_; }

  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline dl) {
    return data_.exists(keys, status, dl);
  }
  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl) {
    return data_.get(keys, dst, status, dl);
  }
  std::error_code put(std::span<const kvtier::chunk_key> keys,
                      std::span<const std::span<const std::byte>> src, std::span<kvtier::chunk_status> status,
                      kvtier::deadline dl) {
    return data_.put(keys, src, status, dl);
  }

 private:
  kvtier::memory_store data_;
};

struct null_store {
  static constexpr bool modeled_timing = true;
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

/// A store whose time the engine models (true) rather than measures on the wall clock.
template <class S>
inline constexpr bool modeled_timing_v = requires {
  S::modeled_timing;
};

static_assert(kvtier::chunk_store<modeled_l2>);
static_assert(kvtier::chunk_store<modeled_l1>);
static_assert(kvtier::chunk_store<null_store>);

}  // namespace pcp
