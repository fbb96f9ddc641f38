// tests/store/store_fakes.hpp: controllable chunk stores for the fetch-queue tests.
//
// gated_store: every call blocks until the test releases the call's tag (the
//   `hi` half of its first key) or the call's deadline passes; contents are a
//   pure function of the key, so results can be predicted (a put reports every
//   key stored and keeps nothing).
// jitter_store<S>: forwards to S after a random short sleep (stress tests).
// throwing_store: every call throws (exactly-once completion on exceptions).
// digest_store: a memory_store with a value format whose put_prehashed and put_pieces keep the
//   digests they were given per key (forwarding tests of tiered_store and rendezvous_store).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier::test {

/// Key `lo` = chunk c of tag `hi`; present iff bit c of the tag's mask (lo's
/// high 32 bits hold the mask so the store needs no table).
inline chunk_key gated_key(std::uint64_t tag, std::uint32_t chunk, std::uint32_t mask) {
  return chunk_key{tag, (static_cast<std::uint64_t>(mask) << 32) | chunk};
}
inline bool gated_present(const chunk_key& k) {
  const auto chunk = static_cast<std::uint32_t>(k.lo & 0xffffffffu);
  const auto mask = static_cast<std::uint32_t>(k.lo >> 32);
  return chunk < 32 && ((mask >> chunk) & 1u);
}
/// Byte j of the value of key k.
inline std::byte gated_byte(const chunk_key& k, std::size_t j) {
  return static_cast<std::byte>((k.hi * 131 + (k.lo & 0xffff) * 17 + j) & 0xff);
}

class gated_store {
 public:
  void release(std::uint64_t tag) {
    {
      std::lock_guard lock(mu_);
      released_.insert(tag);
    }
    cv_.notify_all();
  }
  void release_all() {
    {
      std::lock_guard lock(mu_);
      all_released_ = true;
    }
    cv_.notify_all();
  }
  /// Waits (bounded) until a call with `tag` has started; false if it did not.
  bool wait_started(std::uint64_t tag, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return started_.contains(tag); });
  }
  bool started(std::uint64_t tag) {
    std::lock_guard lock(mu_);
    return started_.contains(tag);
  }
  std::size_t calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }

  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), status.size(), status, dl)) return ec;
    if (!gate(keys, dl)) return timed_out(status);
    for (std::size_t i = 0; i < keys.size(); ++i)
      status[i] = gated_present(keys[i]) ? chunk_status::hit : chunk_status::miss;
    return {};
  }
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), dst.size(), status, dl)) return ec;
    if (!gate(keys, dl)) return timed_out(status);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!gated_present(keys[i])) {
        status[i] = chunk_status::miss;
        continue;
      }
      for (std::size_t j = 0; j < dst[i].size(); ++j) dst[i][j] = gated_byte(keys[i], j);
      status[i] = chunk_status::hit;
    }
    return {};
  }
  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), src.size(), status, dl)) return ec;
    if (!gate(keys, dl)) return timed_out(status);
    // Contents stay a function of the key: a put reports each key stored and keeps nothing.
    detail::store_fill(status, chunk_status::stored);
    return {};
  }

 private:
  bool gate(std::span<const chunk_key> keys, deadline dl) {
    const std::uint64_t tag = keys.empty() ? 0 : keys[0].hi;
    std::unique_lock lock(mu_);
    ++calls_;
    started_.insert(tag);
    cv_.notify_all();
    return cv_.wait_until(lock, dl, [&] { return all_released_ || released_.contains(tag); });
  }
  static std::error_code timed_out(std::span<chunk_status> status) {
    detail::store_fill(status, chunk_status::timeout);
    return make_error_code(errc::timeout);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::uint64_t> released_, started_;
  bool all_released_ = false;
  std::size_t calls_ = 0;
};

/// Sleeps 0..max_us microseconds before each call, then forwards.
template <chunk_store S>
class jitter_store {
 public:
  jitter_store(S& inner, unsigned max_us) : inner_(inner), max_us_(max_us) {}
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> s, deadline dl) {
    pause();
    return inner_.exists(k, s, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    pause();
    return inner_.get(k, d, s, dl);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    pause();
    return inner_.put(k, d, s, dl);
  }

 private:
  void pause() {
    thread_local std::minstd_rand rng(std::random_device{}());
    if (max_us_) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (max_us_ + 1)));
  }
  S& inner_;
  unsigned max_us_;
};

struct throwing_store {
  std::error_code exists(std::span<const chunk_key>, std::span<chunk_status>, deadline) {
    throw std::runtime_error("throwing_store");
  }
  std::error_code get(std::span<const chunk_key>, std::span<const std::span<std::byte>>,
                      std::span<chunk_status>, deadline) {
    throw std::runtime_error("throwing_store");
  }
  std::error_code put(std::span<const chunk_key>, std::span<const std::span<const std::byte>>,
                      std::span<chunk_status>, deadline) {
    throw std::runtime_error("throwing_store");
  }
};

class digest_store {
 public:
  explicit digest_store(value_format f) : format_(f) {}
  const value_format& format() const noexcept { return format_; }
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> s, deadline dl) {
    return inner_.exists(k, s, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    return inner_.get(k, d, s, dl);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> s, deadline dl) {
    std::lock_guard lock(mu_);
    ++plain_puts_;
    return inner_.put(k, src, s, dl);
  }
  /// Refuses digests that do not fit (as remote_store does), else keeps them per key.
  std::error_code put_prehashed(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> src,
                                std::span<const value_digest> digests, std::span<chunk_status> s,
                                deadline dl) {
    if (digests.empty()) return put(k, src, s, dl);
    if (digests.size() != k.size()) return make_error_code(errc::invalid_argument);
    for (std::size_t i = 0; i < k.size(); ++i)
      if (!digests[i].fits(format_, src[i].size())) return make_error_code(errc::invalid_argument);
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < k.size(); ++i) given_[k[i]] = digests[i];
    return inner_.put(k, src, s, dl);
  }
  /// put_prehashed() of values in pieces (kept whole by the inner store); counted in piece_puts.
  std::error_code put_pieces(std::span<const chunk_key> k, std::span<const value_pieces> values,
                             std::span<const value_digest> digests, std::span<chunk_status> s, deadline dl) {
    if (!digests.empty() && digests.size() != k.size()) return make_error_code(errc::invalid_argument);
    for (std::size_t i = 0; i < digests.size(); ++i) {
      std::size_t length = 0;
      for (const auto& p : values[i]) length += p.size();
      if (!digests[i].fits(format_, length)) return make_error_code(errc::invalid_argument);
    }
    std::lock_guard lock(mu_);
    ++piece_puts_;
    for (std::size_t i = 0; i < digests.size(); ++i) given_[k[i]] = digests[i];
    return inner_.put_pieces(k, values, {}, s, dl);
  }
  std::size_t piece_puts() const {
    std::lock_guard lock(mu_);
    return piece_puts_;
  }
  /// The digest put_prehashed was given for `k` (none: an empty one).
  value_digest given(const chunk_key& k) const {
    std::lock_guard lock(mu_);
    auto it = given_.find(k);
    return it == given_.end() ? value_digest{} : it->second;
  }
  std::size_t plain_puts() const {
    std::lock_guard lock(mu_);
    return plain_puts_;
  }

 private:
  struct key_less {
    bool operator()(const chunk_key& a, const chunk_key& b) const noexcept {
      return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
    }
  };
  value_format format_;
  memory_store inner_{64 << 20};
  mutable std::mutex mu_;
  std::map<chunk_key, value_digest, key_less> given_;
  std::size_t plain_puts_ = 0, piece_puts_ = 0;
};

/// A digest of a payload of `length` bytes in format `f` whose checksums all say `tag` (the fakes
/// keep digests without checking them against the bytes).
inline value_digest tagged_digest(value_format f, std::size_t length, std::uint64_t tag) {
  return value_digest{f, length, std::vector<std::uint64_t>(f.groups(length), tag)};
}

static_assert(chunk_store<gated_store>);
static_assert(prehashed_put_store<digest_store>);
static_assert(piecewise_put_store<digest_store>);
static_assert(chunk_store<throwing_store>);

}  // namespace kvtier::test
