// examples/pcp_prefill/rank_agree.hpp: the engine's own agreements over the ranks' control
// communicator (beside the connector's steps): an all-reduce to the minimum, and the longest
// of the ranks' measured durations (real servers). Every rank calls them at the same points,
// each counted in env.collectives.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/comm/communicator.hpp"
#include "kvtier/deadline.hpp"

namespace pcp {

/// The deadline of the collectives that agree on outcomes: generous, so a late peer
/// becomes "recompute" rather than a rank that gave up the agreement.
inline kvtier::deadline agree_deadline() { return kvtier::clock::now() + std::chrono::seconds(300); }

/// `v` becomes its element-wise minimum over the ranks (nothing when empty, on every rank alike).
template <class Env>
void all_reduce_min(Env& env, std::vector<std::uint64_t>& v) {
  if (v.empty()) return;
  ++env.collectives;
  if (auto ec =
          kvtier::comm::all_reduce(*env.comm, std::span<const std::uint64_t>(v), std::span<std::uint64_t>(v),
                                   kvtier::comm::reduce_op::min, agree_deadline()))
    throw std::runtime_error("all_reduce failed: " + ec.message() + ": " + env.comm->last_error());
}

/// Real servers: the ranks' measured durations (seconds) -> the longest of each.
template <class Env>
std::vector<double> agree_max_s(Env& env, const std::vector<double>& mine) {
  constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> v;
  for (double d : mine) v.push_back(none - static_cast<std::uint64_t>(std::max(0.0, d) * 1e9));
  all_reduce_min(env, v);
  std::vector<double> out;
  for (auto x : v) out.push_back(static_cast<double>(none - x) * 1e-9);
  return out;
}

}  // namespace pcp
