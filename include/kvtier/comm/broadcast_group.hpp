// kvtier/comm/broadcast_group.hpp: one grouped collective of broadcasts, the move primitive
// that both chunk_broadcast (kvtier/chunk_broadcast.hpp) and the connector's mover
// (kvtier/connector/detail/mover.hpp) use, so the rules of a group live in one place:
//   - a group_start that fails opened no group: nothing is queued and group_end is never
//     called (communicator.hpp: on a poisoned communicator that would be one more misuse);
//   - an opened group is always closed, so every rank submits it, even after a queueing error;
//   - the first error is the one reported (a later group_end error never overwrites it).
// A non-root passes its destination and no source; the root's source and destination may be
// the same bytes (an in-place broadcast, as the connector's staging blocks are).
//
//   std::error_code ec = kvtier::comm::broadcast_group(comm, [&](auto&& broadcast) {
//     for (std::size_t c = 0; c < n; ++c)
//       broadcast(owner(c) == me ? src(c) : std::span<const std::byte>{}, dst(c), owner(c));
//   }, dl);
#pragma once

#include <cstddef>
#include <span>
#include <system_error>

#include "kvtier/comm/communicator.hpp"
#include "kvtier/deadline.hpp"

namespace kvtier::comm {

/// Runs `each(broadcast)` inside one group; `broadcast(source, destination, root)` queues one
/// broadcast. Returns the first error: of group_start (then `each` is not called), of a queued
/// broadcast, or of group_end. The collective count is one, whatever `each` queues.
template <communicator C, class EachBroadcast>
std::error_code broadcast_group(C& comm, EachBroadcast&& each, deadline dl) {
  if (std::error_code ec = comm.group_start()) return ec;
  std::error_code first;
  each([&](std::span<const std::byte> source, std::span<std::byte> destination, rank_t root) {
    if (std::error_code ec = comm.broadcast(source, destination, root, dl); ec && !first) first = ec;
  });
  if (std::error_code ec = comm.group_end(dl); ec && !first) first = ec;
  return first;
}

}  // namespace kvtier::comm
