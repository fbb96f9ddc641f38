// kvtier/store/tiered_store.hpp: an L1 store in front of an L2 store.
//
// exists/get ask L1 first and send only the keys L1 could not serve to L2 (one
// batched call per tier). A value L2 delivers is promoted into L1 (from the
// caller's destination, no extra copy of the read). put writes through to both
// tiers by default. Per-tier outcomes go to `metrics::l1` / `metrics::l2`.
//
//   kvtier::memory_store l1(8ull << 30);
//   kvtier::remote_store<conn> l2(...);                 // kvtier/store/remote_store.hpp
//   kvtier::metrics m;
//   kvtier::tiered_store tiers(l1, l2, {.metrics = &m});
//   tiers.get(keys, destinations, status, kvtier::deadline_after(200ms));
//
// The tiers are held by reference and must outlive the tiered_store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

/// Which tiers put() writes.
enum class write_policy {
  write_through,  ///< both; a key is stored only if both stored it (see put())
  l1_only,        ///< L1 only (L2 filled elsewhere)
  l2_only,        ///< L2 only (L1 filled by promotion on read)
};

struct tiered_options {
  write_policy writes = write_policy::write_through;
  bool promote = true;                 ///< copy L2 hits of get() into L1
  kvtier::metrics* metrics = nullptr;  ///< optional; per-tier counts go to metrics->l1 / l2
};

template <chunk_store L1, chunk_store L2>
class tiered_store {
 public:
  /// Per-key outcome counts since construction.
  struct stats_type {
    std::uint64_t l1_hits = 0, l2_hits = 0, misses = 0, promoted = 0;
  };

  tiered_store(L1& l1, L2& l2, tiered_options opt = {}) : l1_(l1), l2_(l2), opt_(opt) {}

  L1& l1() noexcept { return l1_; }
  L2& l2() noexcept { return l2_; }

  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), status.size(), status, dl)) return ec;
    std::error_code ec = l1_.exists(keys, status, dl);
    record(tier::one, status);
    std::vector<std::size_t> rest = not_hit(status);
    if (rest.empty()) return count(status, ec);
    std::vector<chunk_key> k2 = gather(keys, rest);
    std::vector<chunk_status> s2(rest.size(), chunk_status::error);
    ec = l2_.exists(k2, s2, dl);
    record(tier::two, s2);
    for (std::size_t j = 0; j < rest.size(); ++j) status[rest[j]] = s2[j];
    return count(status, ec, rest.size());
  }

  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), dst.size(), status, dl)) return ec;
    std::error_code ec = l1_.get(keys, dst, status, dl);
    record(tier::one, status, dst);
    std::vector<std::size_t> rest = not_hit(status);
    if (rest.empty()) return count(status, ec);
    std::vector<chunk_key> k2 = gather(keys, rest);
    std::vector<std::span<std::byte>> d2 = gather(dst, rest);
    std::vector<chunk_status> s2(rest.size(), chunk_status::error);
    ec = l2_.get(k2, d2, s2, dl);
    record(tier::two, s2, std::span<const std::span<std::byte>>(d2));
    for (std::size_t j = 0; j < rest.size(); ++j) status[rest[j]] = s2[j];
    if (opt_.promote) promote(k2, d2, s2, dl);
    return count(status, ec, rest.size());
  }

  /// get(), with L2's part read group-major when L2 can (group_streaming_store, e.g.
  /// remote_store): L1's hits count as every group landed, then `on_round` sees L2's rounds (per
  /// key, the leading groups verified so far), so a connector over the tiers streams by group.
  std::error_code get_by_group(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                               std::span<chunk_status> status, deadline dl,
                               const std::function<void(std::span<const std::size_t>)>& on_round =
                                   {}) requires group_streaming_store<L2> {
    if (auto ec = detail::store_precheck(keys.size(), dst.size(), status, dl)) return ec;
    std::error_code ec = l1_.get(keys, dst, status, dl);
    record(tier::one, status, dst);
    const value_format f = l2_.format();
    std::vector<std::size_t> landed(keys.size(), 0);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (status[i] == chunk_status::hit) landed[i] = f.groups(dst[i].size());
    std::vector<std::size_t> rest = not_hit(status);
    if (on_round && rest.size() < keys.size()) on_round(landed);
    if (rest.empty()) return count(status, ec);
    std::vector<chunk_key> k2 = gather(keys, rest);
    std::vector<std::span<std::byte>> d2 = gather(dst, rest);
    std::vector<chunk_status> s2(rest.size(), chunk_status::error);
    ec = l2_.get_by_group(k2, d2, s2, dl, [&](std::span<const std::size_t> g2) {
      for (std::size_t j = 0; j < rest.size(); ++j) landed[rest[j]] = g2[j];
      if (on_round) on_round(landed);
    });
    record(tier::two, s2, std::span<const std::span<std::byte>>(d2));
    for (std::size_t j = 0; j < rest.size(); ++j) status[rest[j]] = s2[j];
    if (opt_.promote) promote(k2, d2, s2, dl);
    return count(status, ec, rest.size());
  }
  /// L2's value format (what get_by_group's rounds count groups in, and put_prehashed's digests').
  value_format format() const requires group_streaming_store<L2> || prehashed_put_store<L2> {
    return l2_.format();
  }

  /// Write-through: a key is `stored` only if every tier written stored it; a key
  /// one tier failed reports that tier's status (L2's when both failed), and the
  /// call returns L2's error, else L1's, so an L1 failure is never dropped.
  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) {
    return put_prehashed_any(keys, src, {}, status, dl);
  }

  /// put() with each value's checksums already known, in L2's format() (see
  /// remote_store::put_prehashed), so L2 makes no pass of its own over the payload. L1 gets them
  /// too when it takes digests that fit its format; otherwise its plain put.
  std::error_code put_prehashed(std::span<const chunk_key> keys,
                                std::span<const std::span<const std::byte>> src,
                                std::span<const value_digest> digests, std::span<chunk_status> status,
                                deadline dl) requires prehashed_put_store<L2> {
    return put_prehashed_any(keys, src, digests, status, dl);
  }

  /// put() of values given in pieces (see remote_store::put_pieces), each tier writing them from
  /// where they lie: `digests` empty or in L2's format, L1 given them only when they fit its
  /// format (as put_prehashed).
  std::error_code put_pieces(std::span<const chunk_key> keys, std::span<const value_pieces> values,
                             std::span<const value_digest> digests, std::span<chunk_status> status,
                             deadline dl) requires piecewise_put_store<L1> && piecewise_put_store<L2> {
    return put_prehashed_any(keys, values, digests, status, dl);
  }

  stats_type stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }

  /// The last failure in words of the tier that keeps them (remote_store, cluster_store): L2's
  /// when it has one, else L1's; empty when neither tier keeps words or nothing failed.
  std::string last_error() const {
    std::string e = detail::store_words(l2_);
    return e.empty() ? detail::store_words(l1_) : e;
  }

 private:
  enum class tier { one, two };

  static std::vector<std::size_t> not_hit(std::span<const chunk_status> status) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < status.size(); ++i)
      if (status[i] != chunk_status::hit) out.push_back(i);
    return out;
  }
  template <class T>
  static std::vector<T> gather(std::span<const T> all, const std::vector<std::size_t>& idx) {
    std::vector<T> out;
    out.reserve(idx.size());
    for (std::size_t i : idx) out.push_back(all[i]);
    return out;
  }

  void record(tier t, std::span<const chunk_status> status, std::span<const std::span<std::byte>> dst = {}) {
    if (!opt_.metrics) return;
    tier_metrics& m = t == tier::one ? opt_.metrics->l1 : opt_.metrics->l2;
    m.record(status);
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < dst.size(); ++i)
      if (status[i] == chunk_status::hit) bytes += dst[i].size();
    if (bytes) m.bytes_read.add(bytes);
  }
  // put(), put_prehashed() and put_pieces(): `digests` empty, or in L2's format. Value: a whole
  // value (a span) or one in pieces (value_pieces).
  template <class Value>
  std::error_code put_prehashed_any(std::span<const chunk_key> keys, std::span<const Value> src,
                                    std::span<const value_digest> digests, std::span<chunk_status> status,
                                    deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), src.size(), status, dl)) return ec;
    std::vector<std::size_t> lengths(src.size(), 0);
    for (std::size_t i = 0; i < src.size(); ++i) lengths[i] = length_of(src[i]);
    tier_metrics* m1 = opt_.metrics ? &opt_.metrics->l1 : nullptr;
    tier_metrics* m2 = opt_.metrics ? &opt_.metrics->l2 : nullptr;
    const std::span<const value_digest> d1 = l1_digests(lengths, digests);
    if (opt_.writes == write_policy::l1_only) return put_tier(l1_, m1, keys, src, lengths, d1, status, dl);
    if (opt_.writes == write_policy::l2_only)
      return put_tier(l2_, m2, keys, src, lengths, digests, status, dl);
    std::vector<chunk_status> s1(status.size(), chunk_status::error);
    const std::error_code ec1 = put_tier(l1_, m1, keys, src, lengths, d1, s1, dl);
    const std::error_code ec2 = put_tier(l2_, m2, keys, src, lengths, digests, status, dl);
    for (std::size_t i = 0; i < status.size(); ++i)
      if (status[i] == chunk_status::stored && s1[i] != chunk_status::stored) status[i] = s1[i];
    return ec2 ? ec2 : ec1;
  }

  static std::size_t length_of(std::span<const std::byte> v) noexcept { return v.size(); }
  static std::size_t length_of(value_pieces v) noexcept {
    std::size_t n = 0;
    for (const auto& p : v) n += p.size();
    return n;
  }

  // L2's digests when they describe values of `lengths` in L1's format too, else none: L1 of
  // another format (or one without put_prehashed) hashes for itself rather than refusing them.
  std::span<const value_digest> l1_digests(const std::vector<std::size_t>& lengths,
                                           std::span<const value_digest> digests) const {
    if constexpr (prehashed_put_store<L1>) {
      if (digests.size() != lengths.size()) return {};
      const value_format f = l1_.format();
      for (std::size_t i = 0; i < lengths.size(); ++i)
        if (!digests[i].fits(f, lengths[i])) return {};
      return digests;
    } else {
      return {};
    }
  }

  template <chunk_store S, class Value>
  static std::error_code put_tier(S& s, tier_metrics* m, std::span<const chunk_key> keys,
                                  std::span<const Value> src, const std::vector<std::size_t>& lengths,
                                  std::span<const value_digest> digests, std::span<chunk_status> status,
                                  deadline dl) {
    std::error_code ec;
    if constexpr (std::is_same_v<Value, value_pieces>) {
      ec = s.put_pieces(keys, src, digests, status, dl);
    } else if constexpr (prehashed_put_store<S>) {
      ec = digests.empty() ? s.put(keys, src, status, dl) : s.put_prehashed(keys, src, digests, status, dl);
    } else {
      ec = s.put(keys, src, status, dl);
    }
    if (!m) return ec;
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < src.size(); ++i)
      if (status[i] == chunk_status::stored) bytes += lengths[i];
    if (bytes) m->bytes_written.add(bytes);
    return ec;
  }

  // L2 hits go into L1 from the caller's destination (already verified bytes).
  void promote(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
               std::span<const chunk_status> status, deadline dl) {
    std::vector<chunk_key> pk;
    std::vector<std::span<const std::byte>> ps;
    for (std::size_t j = 0; j < keys.size(); ++j)
      if (status[j] == chunk_status::hit) pk.push_back(keys[j]), ps.emplace_back(dst[j]);
    if (pk.empty()) return;
    std::vector<chunk_status> st(pk.size(), chunk_status::error);
    // Within the caller's deadline like every call: a read that used it all up
    // skips promotion (L1 reports timeout) rather than running late.
    l1_.put(pk, ps, st, dl);
    std::size_t ok = 0;
    for (chunk_status s : st) ok += s == chunk_status::stored;
    std::lock_guard lock(mu_);
    stats_.promoted += ok;
  }

  // Folds the final statuses into the stats. `l2_asked` keys went to L2; the rest hit L1.
  std::error_code count(std::span<const chunk_status> status, std::error_code ec, std::size_t l2_asked = 0) {
    std::size_t hits = 0;
    for (chunk_status s : status) hits += s == chunk_status::hit;
    const std::size_t l1_hits = status.size() - l2_asked;
    std::lock_guard lock(mu_);
    stats_.l1_hits += l1_hits;
    stats_.l2_hits += hits - l1_hits;
    stats_.misses += status.size() - hits;
    return ec;
  }

  L1& l1_;
  L2& l2_;
  tiered_options opt_;
  mutable std::mutex mu_;
  stats_type stats_;
};

}  // namespace kvtier
