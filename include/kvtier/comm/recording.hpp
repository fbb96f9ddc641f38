// kvtier/comm/recording.hpp: a communicator decorator that records every collective call.
//
// Wraps any communicator (held by value, or by reference as recording<C&>) and
// appends one collective_call per call: operation, root, bytes, type, reduce-op and
// group depth. Tests compare the sequences of all ranks: under context parallelism
// they must be identical.
//
//   kvtier::comm::inproc_world world(2);
//   kvtier::comm::recording rec(world.communicator_for(0));
//   std::uint32_t v = 1;
//   kvtier::comm::all_reduce_value(rec, v, kvtier::comm::reduce_op::sum, dl);
//   rec.calls();                               // {all_reduce(u32 x1, sum)}
//   kvtier::comm::collective_count(rec.calls());  // 1
//
// Calls inside a group are recorded with group_depth > 0 when queued; the
// outermost group_end appends one op_kind::group entry (bytes = number of queued
// operations) at depth 0. collective_count() counts the depth-0 entries, so a
// group counts as one collective. local_copy is not a collective and is not
// recorded.
#pragma once

#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtier/comm/communicator.hpp"

namespace kvtier::comm {

/// Number of collectives in a recorded sequence: top-level calls, a group counting once.
inline std::size_t collective_count(std::span<const collective_call> calls) noexcept {
  std::size_t n = 0;
  for (const auto& c : calls) n += c.group_depth == 0;
  return n;
}

template <communicator C>
class recording {
 public:
  explicit recording(C inner) : inner_(std::forward<C>(inner)) {}

  std::remove_reference_t<C>& inner() noexcept { return inner_; }
  const std::remove_reference_t<C>& inner() const noexcept { return inner_; }
  /// Every call so far, in order.
  const std::vector<collective_call>& calls() const noexcept { return calls_; }
  /// The result of each entry of calls().
  const std::vector<std::error_code>& results() const noexcept { return results_; }
  void clear() noexcept {
    calls_.clear();
    results_.clear();
  }

  rank_t rank() const { return inner_.rank(); }
  rank_t size() const { return inner_.size(); }
  std::string last_error() const { return std::string(inner_.last_error()); }

  std::error_code broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                            kvtier::deadline dl) {
    collective_call c;
    c.op = op_kind::broadcast;
    c.root = root;
    c.bytes = recv.size();
    return record(c, inner_.broadcast(send, recv, root, dl));
  }

  std::error_code all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             kvtier::deadline dl) {
    collective_call c;
    c.op = op_kind::all_gather;
    c.bytes = send.size();
    return record(c, inner_.all_gather(send, recv, dl));
  }

  std::error_code all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, dtype type,
                             reduce_op op, kvtier::deadline dl) {
    collective_call c;
    c.op = op_kind::all_reduce;
    c.type = type;
    c.reduce = op;
    c.bytes = recv.size();
    return record(c, inner_.all_reduce(send, recv, type, op, dl));
  }

  std::error_code group_start() {
    if (depth_++ == 0) queued_ = 0;
    return inner_.group_start();
  }

  std::error_code group_end(kvtier::deadline dl) {
    std::error_code ec = inner_.group_end(dl);
    if (depth_ == 0) return ec;
    if (--depth_ == 0 && queued_ > 0) {  // an empty group issues nothing
      collective_call g;
      g.op = op_kind::group;
      g.bytes = queued_;
      calls_.push_back(g);
      results_.push_back(ec);
    }
    return ec;
  }

  std::error_code local_copy(std::span<std::byte> dst, std::span<const std::byte> src, kvtier::deadline dl) {
    return inner_.local_copy(dst, src, dl);
  }

 private:
  std::error_code record(collective_call c, std::error_code ec) {
    c.group_depth = depth_;
    if (depth_ > 0) ++queued_;
    calls_.push_back(c);
    results_.push_back(ec);
    return ec;
  }

  C inner_;
  std::uint32_t depth_ = 0;
  std::size_t queued_ = 0;
  std::vector<collective_call> calls_;
  std::vector<std::error_code> results_;
};

}  // namespace kvtier::comm
