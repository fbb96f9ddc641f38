// tests/comm/faulty.hpp: a communicator decorator that makes one collective of one
// rank fail, for the failure-injection properties of chunk_broadcast.
//
// Top-level collectives are numbered from 0 (a group counts once, at its
// group_start). At number `at`, by `how`:
//   - invalid: the call reaches the backend with an invalid argument (an
//     out-of-range root, a wrong-sized receive, a non-reducible type; inside a
//     group, its first operation). The backend fails it as it fails any local
//     error: in-process the whole round fails on every rank; MPI poisons this rank
//     and its peers time out.
//   - after: the call runs, then this rank gives up (abort(), where the backend has
//     one) and reports an error, as when its deadline passes just as the peers'
//     calls complete. Only meaningful on backends whose rounds do not fail together.
//
//   kvtier::test::faulty f(comm, {.at = 2, .how = kvtier::test::fault::invalid});
//   auto r = kvtier::chunk_broadcast(f, own, loaded, bufs, p, dl);   // fails at collective #2
//
// And the other twist: one rank calls with different parameters
// (make_parameters_differ), so every rank must fail at the agreement.
//
//   if (r == odd) kvtier::test::make_parameters_differ(p, what);     // what in [0, differing_parameters)
//
// And poisoned<C>: a communicator already poisoned, that counts group_end misuse.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/communicator.hpp"

namespace kvtier::test {

enum class fault : std::uint8_t { invalid, after };

/// How many parameters make_parameters_differ can change.
inline constexpr int differing_parameters = 5;

/// Changes one of `p`'s parameters that every rank must agree on, by `what`: 0 n_chunks,
/// 1 chunk_tokens, 2 request_id, 3 mode, 4 (or more) chunk_bytes (then the rank's buffers
/// are the wrong size, too).
inline void make_parameters_differ(broadcast_params& p, int what) {
  switch (what) {
    case 0:
      p.n_chunks += 1;
      break;
    case 1:
      p.chunk_tokens += 1;
      break;
    case 2:
      p.request_id = load_id{p.request_id.value + 1};
      break;
    case 3:
      p.mode = static_cast<broadcast_mode>((static_cast<int>(p.mode) + 1) % 3);
      break;
    default:
      p.chunk_bytes += 1;
      break;
  }
}

struct fault_plan {
  std::uint64_t at = std::numeric_limits<std::uint64_t>::max();  ///< top-level collective number; max = never
  fault how = fault::invalid;
};

template <comm::communicator C>
class faulty {
 public:
  static constexpr bool rounds_fail_together = comm::rounds_fail_together<std::remove_cvref_t<C>>;

  faulty(C inner, fault_plan plan) : inner_(std::forward<C>(inner)), plan_(plan) {}

  rank_t rank() const { return inner_.rank(); }
  rank_t size() const { return inner_.size(); }
  std::string last_error() const { return msg_.empty() ? std::string(inner_.last_error()) : msg_; }
  /// True once the fault fired.
  bool fired() const noexcept { return fired_; }

  std::error_code broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                            kvtier::deadline dl) {
    if (hit()) return finish(inner_.broadcast(send, recv, plan_.how == fault::invalid ? size() : root, dl));
    return inner_.broadcast(send, recv, root, dl);
  }
  std::error_code all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             kvtier::deadline dl) {
    if (hit()) {
      if (plan_.how == fault::invalid && !recv.empty()) recv = recv.first(recv.size() - 1);
      if (plan_.how == fault::invalid && recv.empty())
        return finish(inner_.broadcast(send, recv, size(), dl));
      return finish(inner_.all_gather(send, recv, dl));
    }
    return inner_.all_gather(send, recv, dl);
  }
  std::error_code all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, comm::dtype t,
                             comm::reduce_op op, kvtier::deadline dl) {
    if (hit())
      return finish(
          inner_.all_reduce(send, recv, plan_.how == fault::invalid ? comm::dtype::bytes : t, op, dl));
    return inner_.all_reduce(send, recv, t, op, dl);
  }
  std::error_code group_start() {
    if (depth_ == 0 && next() == plan_.at) in_faulty_group_ = true, first_in_group_ = true;
    auto ec = inner_.group_start();
    if (ec) {  // a refused group_start opened no group: no group_end follows
      if (depth_ == 0) in_faulty_group_ = false;
      return ec;
    }
    ++depth_;
    return ec;
  }
  std::error_code group_end(kvtier::deadline dl) {
    auto ec = inner_.group_end(dl);
    if (depth_ > 0 && --depth_ == 0 && in_faulty_group_) {
      in_faulty_group_ = false;
      fired_ = true;
      return finish(ec);
    }
    return ec;
  }
  std::error_code local_copy(std::span<std::byte> dst, std::span<const std::byte> src, kvtier::deadline dl) {
    return inner_.local_copy(dst, src, dl);
  }

 private:
  std::uint64_t next() { return count_++; }

  // Whether this call is the faulty one (top level: its number; in the faulty group: its first op).
  bool hit() {
    if (depth_ > 0) {
      if (!in_faulty_group_ || !first_in_group_ || plan_.how != fault::invalid) return false;
      first_in_group_ = false;
      return true;
    }
    if (next() != plan_.at) return false;
    fired_ = true;
    return true;
  }

  // After the faulty call: `after` gives up on a call that may have succeeded.
  std::error_code finish(std::error_code ec) {
    if (depth_ > 0) return ec;  // inside the group: reported by group_end
    if (plan_.how == fault::after) {
      if constexpr (requires { inner_.abort(std::string()); }) inner_.abort("injected fault");
      msg_ = "injected fault after the call (" + (ec ? ec.message() : std::string("it succeeded")) + ")";
      return kvtier::errc::timeout;
    }
    return ec ? ec : make_error_code(kvtier::errc::backend_error);
  }

  C inner_;
  fault_plan plan_;
  std::uint64_t count_ = 0;
  std::uint32_t depth_ = 0;
  bool in_faulty_group_ = false, first_in_group_ = false, fired_ = false;
  std::string msg_;
};

/// A communicator that is poisoned from the start, as an MPI or NCCL one after a
/// failure: every call fails at once with backend_error and names the first error.
/// It does not protect itself from misuse (as MPI once did not): a group_end without
/// a group_start that succeeded is counted in misuses() and overwrites last_error(),
/// so a test sees whether the protocol kept the first error.
template <comm::communicator C>
class poisoned {
 public:
  static constexpr bool rounds_fail_together = false;

  poisoned(C inner, std::string first) : inner_(std::forward<C>(inner)), first_(std::move(first)) {
    last_ = "poisoned by an earlier failure: " + first_;
  }

  rank_t rank() const { return inner_.rank(); }
  rank_t size() const { return inner_.size(); }
  const std::string& last_error() const noexcept { return last_; }
  /// group_end calls that had no successful group_start.
  int misuses() const noexcept { return misuses_; }

  std::error_code broadcast(std::span<const std::byte>, std::span<std::byte>, rank_t, kvtier::deadline) {
    return again();
  }
  std::error_code all_gather(std::span<const std::byte>, std::span<std::byte>, kvtier::deadline) {
    return again();
  }
  std::error_code all_reduce(std::span<const std::byte>, std::span<std::byte>, comm::dtype, comm::reduce_op,
                             kvtier::deadline) {
    return again();
  }
  std::error_code group_start() { return again(); }  // refused: opens no group
  std::error_code group_end(kvtier::deadline) {
    ++misuses_;
    last_ = "group_end without group_start";
    return kvtier::errc::invalid_argument;
  }
  std::error_code local_copy(std::span<std::byte>, std::span<const std::byte>, kvtier::deadline) {
    return again();
  }

 private:
  std::error_code again() {
    last_ = "poisoned by an earlier failure: " + first_;
    return kvtier::errc::backend_error;
  }
  C inner_;
  std::string first_, last_;
  int misuses_ = 0;
};

}  // namespace kvtier::test
