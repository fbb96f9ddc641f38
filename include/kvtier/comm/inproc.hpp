// kvtier/comm/inproc.hpp: the in-process communicator backend (ranks are threads).
//
// One inproc_world is shared by W rank threads; each thread uses its own
// inproc_communicator (world.communicator_for(r)). Collectives rendezvous under
// the world's mutex and then copy straight from the peers' buffers into the
// caller's buffer (zero-copy: no staging, one memcpy per received byte), so the
// backend is usable for CPU runs of an engine as well as for tests.
//
//   kvtier::comm::inproc_world world(4);
//   kvtier::comm::run_ranks(world, [&](kvtier::comm::inproc_communicator& c) {
//     std::uint64_t v = 10 + c.rank();
//     auto ec = kvtier::comm::all_reduce_value(c, v, kvtier::comm::reduce_op::min,
//                                              kvtier::deadline_after(std::chrono::seconds(1)));
//     // !ec && v == 10 on every rank
//   });
//
// Matching: the k-th collective of every rank forms round k. If the ranks' calls
// differ (operation, root, size, type, reduce-op, or any operation of a group),
// every rank's k-th call returns errc::collective_mismatch and last_error() names
// both calls. If a rank's deadline passes before all W ranks arrived, round k
// fails with errc::timeout on every rank (ranks that arrive later get it at once)
// and last_error() names the missing ranks. A round whose arguments are invalid on
// one rank fails with errc::invalid_argument on every rank.
//
// After an error the world is NOT poisoned: the failed round is consumed by every
// rank's k-th call, so round k+1 starts afresh, and ranks that keep issuing the
// same collectives keep working. (A rank that never makes its k-th call leaves the
// others failing by their deadlines, never hanging; but its next call then lands in
// round k, one behind its peers', and calls of the same shape are not told apart:
// a rank that skipped a collective must not go on using this world.) Once all W
// ranks arrived the copies are bounded memcpys, so a round that completed its
// rendezvous always finishes; deadlines bound only the wait for peers.
//
// Thread safety: one communicator per rank, used by one thread at a time; the
// world must outlive its communicators.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kvtier/comm/communicator.hpp"
#include "kvtier/detail/cv_wait.hpp"

namespace kvtier::comm {

class inproc_communicator;

namespace detail {

/// One queued operation of one rank: its descriptor and its buffers.
struct inproc_op {
  collective_call call;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t count = 0;  // all_reduce elements
};

/// Round k of the world: every rank's k-th collective.
struct inproc_round {
  enum class state { collecting, running, failed };
  explicit inproc_round(rank_t w) : ops(w), grouped(w, false), arrived(w, false) {}
  std::vector<std::vector<inproc_op>> ops;  // per rank (one op, or a group's ops)
  std::vector<bool> grouped;                // per rank: submitted by group_end
  std::vector<bool> arrived;
  rank_t n_arrived = 0, n_copied = 0, n_left = 0;
  rank_t first = 0;  // the first rank to arrive: everyone is compared with it
  state st = state::collecting;
  std::error_code error;
  std::string message;
  std::vector<std::vector<std::byte>> reduced;  // per op index: all_reduce result
  std::condition_variable cv;
};

template <class T>
void reduce_into(std::byte* acc, const std::byte* in, std::size_t count, reduce_op op) {
  using U = std::make_unsigned_t<T>;
  for (std::size_t i = 0; i < count; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    // sum wraps modulo 2^bits (reduce_op): added as unsigned, where overflow is defined.
    T r = op == reduce_op::min   ? std::min(a, b)
          : op == reduce_op::max ? std::max(a, b)
                                 : static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    std::memcpy(acc + i * sizeof(T), &r, sizeof(T));
  }
}

inline void reduce_dispatch(std::byte* acc, const std::byte* in, std::size_t count, dtype t, reduce_op op) {
  switch (t) {
    case dtype::i32:
      reduce_into<std::int32_t>(acc, in, count, op);
      break;
    case dtype::u32:
      reduce_into<std::uint32_t>(acc, in, count, op);
      break;
    case dtype::i64:
      reduce_into<std::int64_t>(acc, in, count, op);
      break;
    case dtype::u64:
      reduce_into<std::uint64_t>(acc, in, count, op);
      break;
    case dtype::bytes:
      break;
  }
}

/// The top-level descriptor of a rank's submission (a single op, or a group).
inline collective_call top_call(const std::vector<inproc_op>& ops, bool grouped) {
  if (!grouped) return ops.front().call;
  collective_call g;
  g.op = op_kind::group;
  g.bytes = ops.size();
  return g;
}

}  // namespace detail

/// The shared state of W in-process ranks. Not movable; outlives its communicators.
class inproc_world {
 public:
  explicit inproc_world(rank_t size) : size_(size) {
    if (size == 0) throw std::invalid_argument("kvtier::comm::inproc_world: size must be > 0");
  }
  inproc_world(const inproc_world&) = delete;
  inproc_world& operator=(const inproc_world&) = delete;

  rank_t size() const noexcept { return size_; }

  /// Rank r's communicator (call once per rank; hand it to that rank's thread).
  inline inproc_communicator communicator_for(rank_t r);

  /// Rounds still held (failed rounds wait until every rank consumed them).
  std::size_t pending_rounds() const {
    std::lock_guard lk(mu_);
    return rounds_.size();
  }

 private:
  friend class inproc_communicator;
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::shared_ptr<detail::inproc_round>> rounds_;
  rank_t size_;
};

/// One rank's handle on an inproc_world; models kvtier::comm::communicator.
class inproc_communicator {
 public:
  inproc_communicator(inproc_world& world, rank_t rank) : world_(&world), rank_(rank) {
    if (rank >= world.size())
      throw std::invalid_argument("kvtier::comm::inproc_communicator: rank out of range");
  }

  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return world_->size(); }
  /// Number of collectives (rounds) this rank has entered.
  std::uint64_t sequence() const noexcept { return seq_; }
  const std::string& last_error() const noexcept { return last_error_; }

  std::error_code broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                            kvtier::deadline dl) {
    detail::inproc_op op;
    op.call.op = op_kind::broadcast;
    op.call.root = root;
    op.call.bytes = recv.size();
    op.send = send.data();
    op.recv = recv.data();
    if (root >= size())
      return queue_or_run(op, "broadcast root " + std::to_string(root) + " out of range", dl);
    if (rank_ == root && send.size() != recv.size())
      return queue_or_run(op,
                          "broadcast: root's send size " + std::to_string(send.size()) + " != recv size " +
                              std::to_string(recv.size()),
                          dl);
    return queue_or_run(op, {}, dl);
  }

  std::error_code all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             kvtier::deadline dl) {
    detail::inproc_op op;
    op.call.op = op_kind::all_gather;
    op.call.bytes = send.size();
    op.send = send.data();
    op.recv = recv.data();
    if (recv.size() != send.size() * size())
      return queue_or_run(op,
                          "all_gather: recv size " + std::to_string(recv.size()) +
                              " != " + std::to_string(size()) + " x send size " + std::to_string(send.size()),
                          dl);
    return queue_or_run(op, {}, dl);
  }

  std::error_code all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, dtype type,
                             reduce_op rop, kvtier::deadline dl) {
    detail::inproc_op op;
    op.call.op = op_kind::all_reduce;
    op.call.type = type;
    op.call.reduce = rop;
    op.call.bytes = recv.size();
    op.send = send.data();
    op.recv = recv.data();
    op.count = recv.size() / dtype_size(type);
    return queue_or_run(op, std::string(all_reduce_args_problem(send.size(), recv.size(), type)), dl);
  }

  std::error_code group_start() {
    ++group_depth_;
    return {};
  }

  std::error_code group_end(kvtier::deadline dl) {
    if (group_depth_ == 0) {
      last_error_ = "group_end without group_start";
      return kvtier::errc::invalid_argument;
    }
    if (--group_depth_ > 0) return {};
    std::vector<detail::inproc_op> ops;
    ops.swap(queued_);
    std::string err;
    err.swap(queued_error_);
    if (ops.empty()) return {};  // an empty group issues nothing (as in NCCL)
    return run_round(std::move(ops), true, std::move(err), dl);
  }

  /// Host memcpy; executes at once (before any operation queued in an open group).
  std::error_code local_copy(std::span<std::byte> dst, std::span<const std::byte> src, kvtier::deadline) {
    if (dst.size() != src.size()) {
      last_error_ = "local_copy: sizes differ";
      return kvtier::errc::invalid_argument;
    }
    if (!dst.empty() && dst.data() != src.data()) std::memmove(dst.data(), src.data(), dst.size());
    return {};
  }

 private:
  std::error_code queue_or_run(detail::inproc_op op, std::string local_error, kvtier::deadline dl) {
    if (group_depth_ > 0) {
      op.call.group_depth = group_depth_;
      queued_.push_back(op);
      if (!local_error.empty() && queued_error_.empty()) queued_error_ = local_error;
      if (!local_error.empty()) {
        last_error_ = local_error;
        return kvtier::errc::invalid_argument;
      }
      return {};
    }
    return run_round({op}, false, std::move(local_error), dl);
  }

  static void wait(std::unique_lock<std::mutex>& lk, detail::inproc_round& rd, kvtier::deadline dl,
                   auto pred) {
    kvtier::detail::wait_until(rd.cv, lk, dl, pred);
  }

  static std::string rank_list(const std::vector<bool>& arrived, bool want) {
    std::string s;
    for (std::size_t r = 0; r < arrived.size(); ++r)
      if (arrived[r] == want) s += (s.empty() ? "" : ",") + std::to_string(r);
    return "{" + s + "}";
  }

  /// Describes the first difference between two ranks' submissions, or "".
  static std::string mismatch(const std::vector<detail::inproc_op>& a, rank_t ra, bool ga,
                              const std::vector<detail::inproc_op>& b, rank_t rb, bool gb) {
    auto name = [](const std::vector<detail::inproc_op>& ops, bool g) {
      return to_string(detail::top_call(ops, g));
    };
    if (ga != gb || a.size() != b.size())
      return "rank " + std::to_string(ra) + " called " + name(a, ga) + " but rank " + std::to_string(rb) +
             " called " + name(b, gb);
    for (std::size_t i = 0; i < a.size(); ++i) {
      collective_call x = a[i].call, y = b[i].call;
      x.group_depth = y.group_depth = 0;  // nesting depth is local bookkeeping
      if (!(x == y))
        return "rank " + std::to_string(ra) + " called " +
               (ga ? "group op #" + std::to_string(i) + " " : std::string()) + to_string(x) + " but rank " +
               std::to_string(rb) + " called " +
               (gb ? "group op #" + std::to_string(i) + " " : std::string()) + to_string(y);
    }
    return {};
  }

  void fail(detail::inproc_round& rd, std::error_code ec, std::string msg) {
    rd.st = detail::inproc_round::state::failed;
    rd.error = ec;
    rd.message = std::move(msg);
    rd.cv.notify_all();
  }

  // Under the lock: this rank has seen round `seq` end; the last one frees it.
  void leave(std::uint64_t seq, detail::inproc_round& rd) {
    if (++rd.n_left == size()) world_->rounds_.erase(seq);
  }

  std::error_code run_round(std::vector<detail::inproc_op> ops, bool grouped, std::string local_error,
                            kvtier::deadline dl) {
    using st = detail::inproc_round::state;
    const std::uint64_t seq = seq_++;
    const std::string where = "collective #" + std::to_string(seq) + ": ";
    std::unique_lock lk(world_->mu_);
    auto& slot = world_->rounds_[seq];
    if (!slot) slot = std::make_shared<detail::inproc_round>(size());
    std::shared_ptr<detail::inproc_round> hold = slot;  // survives erase by the last leaver
    auto& rd = *hold;
    const bool is_first = rd.n_arrived == 0;
    rd.ops[rank_] = std::move(ops);
    rd.grouped[rank_] = grouped;
    rd.arrived[rank_] = true;
    ++rd.n_arrived;
    if (is_first) rd.first = rank_;

    if (rd.st == st::collecting) {
      if (!local_error.empty()) {
        fail(rd, kvtier::errc::invalid_argument,
             where + "rank " + std::to_string(rank_) + ": " + local_error);
      } else if (!is_first) {
        std::string m =
            mismatch(rd.ops[rd.first], rd.first, rd.grouped[rd.first], rd.ops[rank_], rank_, grouped);
        if (!m.empty()) fail(rd, kvtier::errc::collective_mismatch, where + m);
      }
    }
    if (rd.st == st::collecting && rd.n_arrived == size()) {
      compute_reductions(rd);
      rd.st = st::running;
      rd.cv.notify_all();
    }
    if (rd.st == st::collecting) {
      wait(lk, rd, dl, [&] { return rd.st != st::collecting; });
      if (rd.st == st::collecting)
        fail(rd, kvtier::errc::timeout,
             where + "rank " + std::to_string(rank_) + " timed out in " +
                 to_string(detail::top_call(rd.ops[rank_], grouped)) + "; arrived " +
                 rank_list(rd.arrived, true) + ", missing " + rank_list(rd.arrived, false));
    }
    if (rd.st == st::failed) {
      last_error_ = rd.message;
      const std::error_code ec = rd.error;
      leave(seq, rd);
      return ec;
    }
    // Running: every rank is here and its buffers are stable until all copied.
    lk.unlock();
    copy_out(rd);
    lk.lock();
    if (++rd.n_copied == size()) rd.cv.notify_all();
    rd.cv.wait(lk, [&] { return rd.n_copied == size(); });  // bounded: peers only memcpy
    leave(seq, rd);
    return {};
  }

  // Under the lock, all ranks arrived: reduce every all_reduce of the round.
  void compute_reductions(detail::inproc_round& rd) {
    const auto& ref = rd.ops[0];
    rd.reduced.assign(ref.size(), {});
    for (std::size_t i = 0; i < ref.size(); ++i) {
      if (ref[i].call.op != op_kind::all_reduce) continue;
      auto& acc = rd.reduced[i];
      acc.assign(rd.ops[0][i].send, rd.ops[0][i].send + ref[i].call.bytes);
      for (rank_t r = 1; r < size(); ++r)
        detail::reduce_dispatch(acc.data(), rd.ops[r][i].send, ref[i].count, ref[i].call.type,
                                ref[i].call.reduce);
    }
  }

  // Outside the lock: fill this rank's receive buffers from the peers'.
  void copy_out(detail::inproc_round& rd) {
    const auto& mine = rd.ops[rank_];
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const auto& op = mine[i];
      const std::size_t n = op.call.bytes;
      switch (op.call.op) {
        case op_kind::broadcast: {
          const std::byte* src = rd.ops[op.call.root][i].send;
          if (n && src != op.recv) std::memcpy(op.recv, src, n);
          break;
        }
        case op_kind::all_gather:
          for (rank_t j = 0; j < size(); ++j) {
            const std::byte* src = rd.ops[j][i].send;
            std::byte* dst = op.recv + j * n;
            if (n && src != dst) std::memcpy(dst, src, n);
          }
          break;
        case op_kind::all_reduce:
          if (n) std::memcpy(op.recv, rd.reduced[i].data(), n);
          break;
        case op_kind::group:
          break;
      }
    }
  }

  inproc_world* world_;
  rank_t rank_;
  std::uint64_t seq_ = 0;
  std::uint32_t group_depth_ = 0;
  std::vector<detail::inproc_op> queued_;
  std::string queued_error_;
  std::string last_error_;
};

inproc_communicator inproc_world::communicator_for(rank_t r) { return inproc_communicator(*this, r); }

/// Runs fn(communicator&) on W new threads, one per rank of `world`, and joins them.
template <class Fn>
void run_ranks(inproc_world& world, Fn&& fn) {
  std::vector<std::thread> threads;
  threads.reserve(world.size());
  for (rank_t r = 0; r < world.size(); ++r)
    threads.emplace_back([&world, &fn, r] {
      auto c = world.communicator_for(r);
      fn(c);
    });
  for (auto& t : threads) t.join();
}

}  // namespace kvtier::comm
