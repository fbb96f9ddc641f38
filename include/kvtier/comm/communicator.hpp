// kvtier/comm/communicator.hpp: the communicator concept every collective backend implements.
//
// Under context parallelism every rank must issue the same collectives in the same
// order. A communicator is one rank's handle on its world; it is used by one thread
// at a time. Every collective blocks until it completed on this rank or its
// deadline passed, and reports failure as a std::error_code with kvtier::errc
// (timeout, collective_mismatch, invalid_argument, backend_error);
// last_error() then holds a human-readable explanation.
//
// THE FAILURE CONTRACT (every backend; tests/comm/conformance.hpp checks it on each)
//  1. Bounded: every call returns by its deadline (plus the time to notice it), on
//     every rank, whatever its peers do -- a peer that never calls, calls late,
//     calls something else, or died.
//  2. No mispairing: after a collective failed on any rank, no rank's next
//     collective may pair with a different call of a peer. Each backend keeps this
//     in one of two ways:
//       - in-process (inproc.hpp): rounds fail together. The k-th calls of all
//         ranks form one round whose outcome is decided once, under one lock: it
//         succeeds on every rank or fails on every rank (a rank arriving after the
//         round failed gets the failure at once). Ranks that go on issuing the same
//         calls go on working.
//       - MPI (mpi.hpp) and NCCL (nccl.hpp): the runtime pairs calls by position
//         and cannot take an issued call back, so a round can complete on some
//         ranks and fail on others (a deadline passing on one rank while its
//         peers' calls complete). Any failure therefore poisons (MPI) or aborts
//         (NCCL, ncclCommAbort; an adopted NCCL communicator, the engine's, is only
//         poisoned, never aborted) the failing rank's communicator: every later call
//         on it fails at once with the first error, and its peers' next collective
//         fails by their own deadline. Create a new communicator to go on
//         (kvtier/comm/recover.hpp realigns the ranks on the new one).
//     `rounds_fail_together<C>` tells the two apart.
//  3. Never late bytes: once a call returned an error, the backend writes no byte
//     into that call's caller buffers afterwards (MPI stages through its own
//     memory; NCCL aborts, which stops its kernels; in-process copies finish
//     before the round's last rank leaves).
//  4. Errors explain themselves: last_error() names the collective, its root and
//     the deadline or the peers involved.
// What this means for the load protocol is stated in chunk_broadcast.hpp.
//
// Memory: broadcast, all_gather and local_copy work on *backend memory* (host
// memory for the in-process and MPI backends, device memory for NCCL); all_reduce
// works on small host-memory integer vectors in every backend (it carries metadata
// such as the agreed loaded prefix).
//
//   using namespace kvtier::comm;
//   template <communicator C>
//   std::error_code agree(C& c, std::uint64_t& loaded, kvtier::deadline dl) {
//     return all_reduce_value(c, loaded, reduce_op::min, dl);   // every rank gets the minimum
//   }
//
// Grouped operations: collectives issued between group_start() and group_end(dl)
// form one grouped collective (one entry of the collective count). Inside a group
// the operations are only queued: their deadline arguments are ignored, their
// results are valid after group_end(dl) returned success, and group_end reports
// the group's error. Groups nest; only the outermost group_end executes. A
// group_start that returns an error opened no group (the communicator is poisoned,
// or the backend refused it): do not call group_end for it -- on a poisoned
// communicator that call is one more misuse, and the first error must stay the one
// every later call reports.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/ownership.hpp"

namespace kvtier::comm {

using kvtier::rank_t;

/// Reduction of all_reduce (integers only). `sum` wraps modulo 2^bits for signed
/// and unsigned types alike (two's complement, as MPI and NCCL behave in
/// practice): never undefined behaviour, and the same bits on every backend.
enum class reduce_op : std::uint8_t { min, max, sum };

/// Element type of all_reduce; `bytes` for byte-wise collectives.
enum class dtype : std::uint8_t { bytes, i32, u32, i64, u64 };

/// The kind of a recorded or matched call.
enum class op_kind : std::uint8_t { broadcast, all_gather, all_reduce, group };

/// Bytes per element of `t`.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::bytes:
      return 1;
    case dtype::i32:
    case dtype::u32:
      return 4;
    case dtype::i64:
    case dtype::u64:
      return 8;
  }
  return 1;
}

/// The dtype of an integer type T (int32/uint32/int64/uint64).
template <class T>
constexpr dtype dtype_of() noexcept {
  static_assert(std::is_integral_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                "kvtier::comm: all_reduce supports 32- and 64-bit integers");
  if constexpr (sizeof(T) == 4)
    return std::is_signed_v<T> ? dtype::i32 : dtype::u32;
  else
    return std::is_signed_v<T> ? dtype::i64 : dtype::u64;
}

/// Why all_reduce's byte spans are unusable for `t`, or "" if they are fine
/// (sizes equal, a whole number of elements, not dtype::bytes). Backends call it.
constexpr std::string_view all_reduce_args_problem(std::size_t send_bytes, std::size_t recv_bytes,
                                                   dtype t) noexcept {
  if (t == dtype::bytes) return "all_reduce: dtype::bytes cannot be reduced";
  if (send_bytes != recv_bytes) return "all_reduce: send and recv sizes differ";
  if (recv_bytes % dtype_size(t) != 0) return "all_reduce: size is not a whole number of elements";
  return {};
}

/// Integer types all_reduce accepts.
template <class T>
concept reducible = std::is_integral_v<T> &&(sizeof(T) == 4 || sizeof(T) == 8);

/// What one rank asked for in one call: the fields every rank must agree on.
/// For broadcast `bytes` is the buffer size; for all_gather the per-rank slice;
/// for all_reduce the element count times the element size. `root` is only
/// meaningful for broadcast (0 otherwise); `reduce` only for all_reduce.
/// For op_kind::group, `bytes` is the number of operations in the group.
struct collective_call {
  op_kind op = op_kind::broadcast;
  rank_t root = 0;
  std::uint64_t bytes = 0;
  dtype type = dtype::bytes;
  reduce_op reduce = reduce_op::min;
  std::uint32_t group_depth = 0;  ///< 0 = top level; >0 = queued inside a group
  friend bool operator==(const collective_call&, const collective_call&) = default;
};

constexpr std::string_view to_string(op_kind k) noexcept {
  switch (k) {
    case op_kind::broadcast:
      return "broadcast";
    case op_kind::all_gather:
      return "all_gather";
    case op_kind::all_reduce:
      return "all_reduce";
    case op_kind::group:
      return "group";
  }
  return "?";
}
constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::bytes:
      return "bytes";
    case dtype::i32:
      return "i32";
    case dtype::u32:
      return "u32";
    case dtype::i64:
      return "i64";
    case dtype::u64:
      return "u64";
  }
  return "?";
}
constexpr std::string_view to_string(reduce_op r) noexcept {
  switch (r) {
    case reduce_op::min:
      return "min";
    case reduce_op::max:
      return "max";
    case reduce_op::sum:
      return "sum";
  }
  return "?";
}

/// "broadcast(root=1, bytes=4096)", "all_reduce(u64 x2, min)", "group(3 ops)".
inline std::string to_string(const collective_call& c) {
  std::string s(to_string(c.op));
  switch (c.op) {
    case op_kind::broadcast:
      s += "(root=" + std::to_string(c.root) + ", bytes=" + std::to_string(c.bytes) + ")";
      break;
    case op_kind::all_gather:
      s += "(bytes per rank=" + std::to_string(c.bytes) + ")";
      break;
    case op_kind::all_reduce:
      s += "(";
      s += to_string(c.type);
      s += " x" + std::to_string(c.bytes / dtype_size(c.type)) + ", ";
      s += to_string(c.reduce);
      s += ")";
      break;
    case op_kind::group:
      s += "(" + std::to_string(c.bytes) + " ops)";
      break;
  }
  if (c.group_depth > 0) s += " [in group]";
  return s;
}

/// One rank's handle on a world of size() ranks. See the file comment for the
/// memory and grouping rules.
///
/// - broadcast(send, recv, root, dl): root's `send` (same size as `recv`) lands in
///   every rank's `recv`; `send` is read on the root only (may be empty elsewhere)
///   and may equal `recv` (in place).
/// - all_gather(send, recv, dl): recv.size() == size() * send.size(); rank j's
///   `send` lands at recv[j * send.size()]. In place when send is this rank's slot.
/// - all_reduce(send, recv, type, op, dl): host memory, recv.size() / dtype_size(type)
///   elements of `type`; send.size() == recv.size(), a multiple of dtype_size(type)
///   (else invalid_argument); send may equal recv.
/// - local_copy(dst, src): a copy within this rank's backend memory, ordered with
///   this rank's collectives (not a collective, never recorded).
template <class C>
concept communicator = requires(C& c, const C& cc, std::span<const std::byte> in, std::span<std::byte> out,
                                rank_t root, kvtier::deadline dl, dtype t, reduce_op op) {
  { cc.rank() } -> std::convertible_to<rank_t>;
  { cc.size() } -> std::convertible_to<rank_t>;
  { c.broadcast(in, out, root, dl) } -> std::same_as<std::error_code>;
  { c.all_gather(in, out, dl) } -> std::same_as<std::error_code>;
  { c.all_reduce(in, out, t, op, dl) } -> std::same_as<std::error_code>;
  { c.group_start() } -> std::same_as<std::error_code>;
  { c.group_end(dl) } -> std::same_as<std::error_code>;
  { c.local_copy(out, in, dl) } -> std::same_as<std::error_code>;
  { cc.last_error() } -> std::convertible_to<std::string>;
};

/// True when a failed collective fails on every rank (see the failure contract):
/// backends declare `static constexpr bool rounds_fail_together`; a backend that
/// does not say is assumed not to.
template <class C>
inline constexpr bool rounds_fail_together = [] {
  if constexpr (requires { C::rounds_fail_together; })
    return static_cast<bool>(C::rounds_fail_together);
  else
    return false;
}();

namespace detail {
/// "deadline 12.5 ms after the call began" for error messages. Computed in long
/// double, so any pair of time points (deadline::min() included) gives text, never
/// a signed overflow.
inline std::string deadline_text(kvtier::deadline dl, kvtier::clock::time_point start) {
  if (dl == kvtier::no_deadline) return "no deadline";
  using wide_ms = std::chrono::duration<long double, std::milli>;
  const long double ms = wide_ms(dl.time_since_epoch()).count() - wide_ms(start.time_since_epoch()).count();
  if (ms < 0) return "a deadline that had already passed when the call began";
  char b[96];
  std::snprintf(b, sizeof b, "deadline %.1Lf ms after the call began", ms);
  return b;
}
}  // namespace detail

/// Typed all_reduce over contiguous host integer ranges (spans, arrays, C arrays,
/// vectors); the element type is deduced from `recv` and `send` must hold the same
/// type. send may alias recv.
///
///   std::array<std::uint64_t, 2> v{a, b};
///   auto ec = all_reduce(comm, v, v, reduce_op::min, dl);   // no template arguments
template <communicator C, std::ranges::contiguous_range Send, std::ranges::contiguous_range Recv>
requires reducible<std::ranges::range_value_t<Recv>> &&
    std::same_as<std::ranges::range_value_t<Send>, std::ranges::range_value_t<Recv>> &&
    std::is_convertible_v<Recv&, std::span<std::ranges::range_value_t<Recv>>>
        std::error_code all_reduce(C& c, Send&& send, Recv&& recv, reduce_op op, kvtier::deadline dl) {
  using T = std::ranges::range_value_t<Recv>;
  const std::span<const T> in(send);
  const std::span<T> out(recv);
  if (in.size() != out.size()) return kvtier::errc::invalid_argument;
  return c.all_reduce(std::as_bytes(in), std::as_writable_bytes(out), dtype_of<T>(), op, dl);
}

/// The same over spans with the element type spelled out (all_reduce<C, T>(...));
/// kept for callers written before the deducing form above.
template <communicator C, reducible T>
std::error_code all_reduce(C& c, std::span<const T> send, std::span<T> recv, reduce_op op,
                           kvtier::deadline dl) {
  if (send.size() != recv.size()) return kvtier::errc::invalid_argument;
  return c.all_reduce(std::as_bytes(send), std::as_writable_bytes(recv), dtype_of<T>(), op, dl);
}

/// All-reduce of one integer in place: every rank ends with the reduction.
template <communicator C, reducible T>
std::error_code all_reduce_value(C& c, T& value, reduce_op op, kvtier::deadline dl) {
  std::span<T, 1> v(&value, 1);
  return c.all_reduce(std::as_bytes(v), std::as_writable_bytes(v), dtype_of<T>(), op, dl);
}

}  // namespace kvtier::comm
