// kvtier/store/rendezvous_store.hpp: one rank's partition spread over K stores (K standalone
// servers, say) by rendezvous hashing of the chunk key: the second level of hashing inside a rank's
// partition, for users who outgrow one server per rank but do not run a cluster.
//
// Each key goes to the instance with the highest weight mix(key, instance name, seed). An
// instance is named by its identity (a remote_store's server, "host:port/db"; or a name the
// caller gives), never by its position in the list: every engine that lists the same instances
// agrees on every key's instance without talking, in any order; adding an instance moves only
// the keys the new one wins (about 1/(K+1) of them), and removing one moves only its own keys
// (about 1/K), wherever it stood in the list. A batch is split by instance; the parts run in
// parallel (one thread per extra instance) and every key's status lands in the caller's order.
//
//   std::vector<kvtier::remote_store<conn>*> parts = {&l2_a, &l2_b, &l2_c};
//   kvtier::rendezvous_store<kvtier::remote_store<conn>> l2(parts);     // named by their servers
//   std::error_code ec = l2.get(keys, dst_spans, status, dl);
//   kvtier::rendezvous_store<kvtier::memory_store> m({&a, &b}, {"a", "b"});  // named by the caller
//
// Thread-safe when the instances are. The instances must outlive the store.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

/// A store whose identity rendezvous_store can read: a remote_store (its server's describe()).
template <class Store>
concept rendezvous_named = requires(Store& s) {
  { s.pool().options().server.describe() } -> std::convertible_to<std::string>;
};

/// A chunk_store over K chunk_stores, each key on the instance rendezvous hashing picks.
template <chunk_store Store>
class rendezvous_store {
 public:
  /// Instances named by their servers (remote_store). Throws std::invalid_argument for no
  /// instance, a null one, or two with the same server.
  explicit rendezvous_store(std::vector<Store*> instances,
                            std::uint64_t seed = 0) requires rendezvous_named<Store>
      : rendezvous_store(instances, names_of(instances), seed) {}

  /// Instances named by the caller (`names[i]` is instance i's identity: keep it when the list
  /// changes). Throws std::invalid_argument for no instance, a null one, a count of names that
  /// differs, or a name twice.
  rendezvous_store(std::vector<Store*> instances, std::vector<std::string> names, std::uint64_t seed = 0)
      : parts_(std::move(instances)), names_(std::move(names)), seed_(seed) {
    if (parts_.empty()) throw std::invalid_argument("kvtier::rendezvous_store: no instance");
    if (names_.size() != parts_.size())
      throw std::invalid_argument("kvtier::rendezvous_store: " + std::to_string(names_.size()) +
                                  " names for " + std::to_string(parts_.size()) + " instances");
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      if (parts_[i] == nullptr) throw std::invalid_argument("kvtier::rendezvous_store: a null instance");
      for (std::size_t j = 0; j < i; ++j)
        if (names_[j] == names_[i])
          throw std::invalid_argument("kvtier::rendezvous_store: two instances named '" + names_[i] +
                                      "' (each needs its own identity)");
      name_weights_.push_back(mix(fnv1a(names_[i])));
    }
  }

  /// The instance (0..size()-1) that holds `k`.
  std::size_t instance_of(const chunk_key& k) const noexcept {
    const std::uint64_t key = mix(k.hi ^ seed_) ^ k.lo;
    std::size_t best = 0;
    std::uint64_t best_weight = 0;
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const std::uint64_t w = mix(key ^ name_weights_[i]);
      // Ties (one in 2^64) go to the smaller name, so the order of the list never matters.
      if (i == 0 || w > best_weight || (w == best_weight && names_[i] < names_[best]))
        best = i, best_weight = w;
    }
    return best;
  }
  /// Instance i's identity (its server, or the caller's name).
  const std::string& name(std::size_t i) const noexcept { return names_[i]; }
  std::size_t size() const noexcept { return parts_.size(); }
  Store& instance(std::size_t i) const noexcept { return *parts_[i]; }

  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl) {
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    return split(keys, status, /*parallel=*/false,
                 [&](Store& s, part& p) { return s.exists(p.keys, p.status, dl); });
  }

  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) {
    if (keys.size() != dst.size() || keys.size() != status.size())
      return make_error_code(errc::invalid_argument);
    return split(keys, status, /*parallel=*/true, [&](Store& s, part& p) {
      std::vector<std::span<std::byte>> d;
      d.reserve(p.index.size());
      for (std::size_t i : p.index) d.push_back(dst[i]);
      return s.get(p.keys, d, p.status, dl);
    });
  }

  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) {
    return put_split(keys, src, {}, status, dl);
  }

  /// put() with each value's checksums already known (see remote_store::put_prehashed), in
  /// format()'s layout: each instance gets its keys' digests, so none makes a pass of its own.
  /// An instance whose format the digests do not fit refuses them (invalid_argument).
  std::error_code put_prehashed(std::span<const chunk_key> keys,
                                std::span<const std::span<const std::byte>> src,
                                std::span<const value_digest> digests, std::span<chunk_status> status,
                                deadline dl) requires prehashed_put_store<Store> {
    return put_split(keys, src, digests, status, dl);
  }
  /// put_prehashed() of values given in pieces (see remote_store::put_pieces): each instance
  /// gets its keys' values and digests (`digests` empty, or one per key).
  std::error_code put_pieces(std::span<const chunk_key> keys, std::span<const value_pieces> values,
                             std::span<const value_digest> digests, std::span<chunk_status> status,
                             deadline dl) requires piecewise_put_store<Store> {
    return put_split(keys, values, digests, status, dl);
  }
  /// Instance 0's value format (the instances of one partition share one).
  value_format format() const requires prehashed_put_store<Store> { return parts_.front()->format(); }

 private:
  // The keys of one instance: caller indices, their keys, their statuses.
  struct part {
    std::vector<std::size_t> index;
    std::vector<chunk_key> keys;
    std::vector<chunk_status> status;
    std::error_code ec;
  };

  // put(), put_prehashed() and put_pieces() (`digests` empty, or one per key); Value is a whole
  // value (a span) or one in pieces.
  template <class Value>
  std::error_code put_split(std::span<const chunk_key> keys, std::span<const Value> src,
                            std::span<const value_digest> digests, std::span<chunk_status> status,
                            deadline dl) {
    if (keys.size() != src.size() || keys.size() != status.size() ||
        (!digests.empty() && digests.size() != keys.size()))
      return make_error_code(errc::invalid_argument);
    return split(keys, status, /*parallel=*/true, [&](Store& s, part& p) {
      std::vector<Value> d;
      d.reserve(p.index.size());
      for (std::size_t i : p.index) d.push_back(src[i]);
      std::vector<value_digest> h;
      h.reserve(digests.empty() ? 0 : p.index.size());
      for (std::size_t i : p.index)
        if (!digests.empty()) h.push_back(digests[i]);
      if constexpr (std::is_same_v<Value, value_pieces>) {
        return s.put_pieces(p.keys, d, h, p.status, dl);
      } else {
        if constexpr (prehashed_put_store<Store>)
          if (!h.empty()) return s.put_prehashed(p.keys, d, h, p.status, dl);
        return s.put(p.keys, d, p.status, dl);
      }
    });
  }

  static std::vector<std::string> names_of(const std::vector<Store*>& instances) {
    std::vector<std::string> n;
    for (Store* s : instances)
      n.push_back(s == nullptr ? std::string() : std::string(s->pool().options().server.describe()));
    return n;
  }
  static std::uint64_t fnv1a(const std::string& s) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return h;
  }
  static std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }

  // Splits by instance, runs `call(store, part)` per instance (in parallel if asked), scatters the
  // statuses back. The first instance error (a timeout first) is the call's.
  template <class Call>
  std::error_code split(std::span<const chunk_key> keys, std::span<chunk_status> status, bool parallel,
                        Call&& call) {
    std::vector<part> parts(parts_.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      part& p = parts[instance_of(keys[i])];
      p.index.push_back(i);
      p.keys.push_back(keys[i]);
    }
    std::vector<std::thread> helpers;
    std::size_t first = parts.size();
    for (std::size_t k = 0; k < parts.size(); ++k) {
      part& p = parts[k];
      if (p.keys.empty()) continue;
      p.status.assign(p.keys.size(), chunk_status::error);
      auto work = [&, k] { parts[k].ec = call(*parts_[k], parts[k]); };
      if (!parallel || first == parts.size()) {
        if (first == parts.size()) first = k;
        if (!parallel) work();
        continue;
      }
      try {
        helpers.emplace_back(work);
      } catch (const std::system_error&) {
        work();  // no thread: run it here
      }
    }
    if (parallel && first < parts.size()) parts[first].ec = call(*parts_[first], parts[first]);
    for (auto& t : helpers) t.join();
    std::error_code ec;
    for (const part& p : parts) {
      for (std::size_t j = 0; j < p.index.size(); ++j) status[p.index[j]] = p.status[j];
      if (p.ec && (!ec || p.ec == errc::timeout)) ec = p.ec;
    }
    return ec;
  }

  std::vector<Store*> parts_;
  std::vector<std::string> names_;
  std::vector<std::uint64_t> name_weights_;  // mix(fnv1a(name)) per instance
  std::uint64_t seed_;
};

}  // namespace kvtier
