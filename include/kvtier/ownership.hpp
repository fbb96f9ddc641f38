// kvtier/ownership.hpp: which rank owns which chunk.
//
// Ownership is static and rank-local: it depends only on the chunk index and the
// world size, so rank r of every engine owns the same chunks and can talk to its
// own server instance (resp://valkey-{rank}:6379) with no routing layer.
//
//   kvtier::modulo_ownership own(8);                     // c mod 8
//   auto mine   = kvtier::owned_chunks(own, 3, 64);      // {3, 11, 19, ...}
//   auto starts = kvtier::owned_starts(own, 3, 64, 256); // {768, 2816, ...}
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvtier {

/// A rank index in [0, world_size).
using rank_t = std::uint32_t;

/// A deterministic map from chunk index to owning rank.
template <class P>
concept ownership_policy = requires(const P& p, std::size_t chunk) {
  { p.world_size() } -> std::convertible_to<rank_t>;
  { p.owner(chunk) } -> std::convertible_to<rank_t>;
  { p.geometry() } -> std::convertible_to<std::string>;  // folded into the key namespace
};

/// Rank r owns chunk c iff c mod W == r (the reference's sharded store).
class modulo_ownership {
 public:
  explicit modulo_ownership(rank_t world) : world_(world) {
    if (world == 0) throw std::invalid_argument("kvtier::modulo_ownership: world size must be > 0");
  }
  rank_t world_size() const noexcept { return world_; }
  rank_t owner(std::size_t chunk) const noexcept { return static_cast<rank_t>(chunk % world_); }
  std::string geometry() const { return "mod:" + std::to_string(world_); }

 private:
  rank_t world_;
};

/// Runs of I consecutive chunks go to one rank: owner = (c / I) mod W. Larger
/// runs mean fewer, larger requests per rank at the cost of coarser balance.
class block_interleave_ownership {
 public:
  block_interleave_ownership(rank_t world, std::size_t block) : world_(world), block_(block) {
    if (world == 0) throw std::invalid_argument("kvtier::block_interleave_ownership: world size must be > 0");
    if (block == 0) throw std::invalid_argument("kvtier::block_interleave_ownership: block must be > 0");
  }
  rank_t world_size() const noexcept { return world_; }
  rank_t owner(std::size_t chunk) const noexcept { return static_cast<rank_t>((chunk / block_) % world_); }
  std::string geometry() const { return "block:" + std::to_string(block_) + ":" + std::to_string(world_); }

 private:
  rank_t world_;
  std::size_t block_;
};

/// Rendezvous (highest-random-weight) hashing of the chunk index: balanced in
/// expectation with no periodic pattern; still static and rank-local.
class rendezvous_ownership {
 public:
  explicit rendezvous_ownership(rank_t world, std::uint64_t seed = 0) : world_(world), seed_(seed) {
    if (world == 0) throw std::invalid_argument("kvtier::rendezvous_ownership: world size must be > 0");
  }
  rank_t world_size() const noexcept { return world_; }
  rank_t owner(std::size_t chunk) const noexcept {
    rank_t best = 0;
    std::uint64_t best_weight = 0;
    for (rank_t r = 0; r < world_; ++r) {
      const std::uint64_t w = mix(seed_ ^ (static_cast<std::uint64_t>(chunk) << 16) ^ r);
      if (r == 0 || w > best_weight) best = r, best_weight = w;
    }
    return best;
  }
  std::string geometry() const {
    return "rendezvous:" + std::to_string(world_) + ":" + std::to_string(seed_);
  }

 private:
  static std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  rank_t world_;
  std::uint64_t seed_;
};

/// Indexes of the chunks rank r owns among the first `n_chunks`, ascending.
template <ownership_policy P>
std::vector<std::size_t> owned_chunks(const P& policy, rank_t r, std::size_t n_chunks) {
  std::vector<std::size_t> out;
  for (std::size_t c = 0; c < n_chunks; ++c)
    if (static_cast<rank_t>(policy.owner(c)) == r) out.push_back(c);
  return out;
}

/// Start tokens of the chunks rank r owns, ascending: the "custom cumulative-length
/// vector" whose k-th entry is the start token of r's k-th owned chunk.
template <ownership_policy P>
std::vector<std::uint64_t> owned_starts(const P& policy, rank_t r, std::size_t n_chunks,
                                        std::size_t chunk_tokens) {
  std::vector<std::uint64_t> out;
  for (std::size_t c = 0; c < n_chunks; ++c)
    if (static_cast<rank_t>(policy.owner(c)) == r)
      out.push_back(static_cast<std::uint64_t>(c) * chunk_tokens);
  return out;
}

}  // namespace kvtier
