// kvtier/comm/mpi.hpp: the MPI communicator backend (ranks are processes; target kvtier::mpi).
//
// Wraps the engine's MPI communicator. kvtier never calls MPI_Init: the program
// does (MPI_Init_thread with at least the level mpi_options::thread_level names,
// MPI_THREAD_SERIALIZED by default, because kvtier may call MPI from a thread
// other than the main one). create() checks that level and duplicates the given
// communicator (MPI_Comm_idup, under the deadline), so kvtier's collectives never
// pair with the engine's own calls on the parent.
//
// Every collective is non-blocking (MPI_Ibcast, MPI_Iallgather, MPI_Iallreduce)
// and polled with MPI_Test/MPI_Testall until it completed or the caller's deadline
// passed. Any failure poisons the communicator (see the contract in
// communicator.hpp): a timeout, an MPI error, or a call this rank refused before
// MPI saw it (its peers may have issued theirs, and MPI pairs calls by position).
// Every later call then fails at once with the first error, and last_error() names
// the collective, its root and its deadline. Create a new communicator to go on.
//
// Staging: MPI cannot cancel a collective request, so a call that timed out stays
// pending and completes whenever the missing peer makes its call. By default every
// collective therefore sends and receives through communicator-owned memory
// (one memcpy in, one out), and a request abandoned by a timeout keeps that memory:
// no late byte ever lands in the caller's buffers, and a late peer reads the bytes
// the call was made with, not whatever the caller has written there since.
// mpi_options::stage = false moves bytes directly (no extra copies) for callers that
// never reuse a buffer after a failed call. all_reduce is always staged (it is small).
//
//   MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
//   kvtier::comm::mpi_communicator c;
//   if (auto ec = kvtier::comm::mpi_communicator::create(c, MPI_COMM_WORLD,
//                                                        kvtier::deadline_after(std::chrono::seconds(30))))
//     die(c.last_error());
//   std::uint64_t loaded = my_loaded_prefix;
//   auto ec = kvtier::comm::all_reduce_value(c, loaded, kvtier::comm::reduce_op::min,
//                                            kvtier::deadline_after(std::chrono::milliseconds(500)));
//
// Peers learn of a failure at once. A rank whose communicator gets poisoned (a timeout, an MPI
// error, a refused call, abort()) sends every peer a notice (MPI_Isend of the number of rounds,
// calls or groups, that completed on it; tag mpi_options::notice_tag, on the duplicate:
// point-to-point, never paired with a collective); each rank keeps one receive for it posted and
// tests it while it polls a collective and before it issues one. A round the notifying rank
// completed is still waited for (its part is sent); a later one can never complete there, so a
// peer poisons its own communicator at once ("rank 1 poisoned its communicator: ...") instead
// of at its deadline, so every rank reaches
// kvtier::comm::recover() within the time its peers take to get back to a collective, not one
// step deadline later (the failed rank's abandoned call may still complete a peer's round: that
// peer's next call fails at once). mpi_options::notify_peers = false turns it off.
//
// Memory: host memory (MPI's shared-memory or network transports). Grouped calls
// issue every queued operation as its own request at the outermost group_end and
// wait for all of them together, so a group's broadcasts from different roots
// progress at once.
//
// Thread safety: one thread at a time per communicator, as the concept requires.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/comm/communicator.hpp"

namespace kvtier::comm {

/// How create() sets up an mpi_communicator.
struct mpi_options {
  /// The least thread level MPI must provide (MPI_Query_thread); checked by create().
  int thread_level = MPI_THREAD_SERIALIZED;
  /// Send and receive through communicator-owned memory (see the file comment).
  bool stage = true;
  /// Tell the peers at once when this communicator gets poisoned (see the file comment).
  bool notify_peers = true;
  /// The first point-to-point tag of that notice on kvtier's duplicate (nothing else sends
  /// there): the k-th communicator this process creates uses notice_tag + k mod 4096, so a
  /// notice left unreceived on a freed communicator never matches one whose context MPI reused
  /// (ranks create their communicators in the same order, as create() is collective).
  int notice_tag = 0x4000;
};

/// One rank's handle on an MPI communicator; models kvtier::comm::communicator.
class mpi_communicator {
 public:
  /// A failed round may succeed on some ranks and fail on others (see communicator.hpp).
  static constexpr bool rounds_fail_together = false;

  mpi_communicator() = default;
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  mpi_communicator(mpi_communicator&& o) noexcept { swap(o); }
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      mpi_communicator tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  ~mpi_communicator() { release(); }

  /// Duplicates `parent` (collective over parent's ranks) into `out`, by `dl`.
  /// Fails with invalid_argument when MPI is not initialised or provides a thread
  /// level below opt.thread_level, and with timeout when a peer does not join by dl.
  ///
  /// After a timeout: MPI cannot take the MPI_Comm_idup back, so it stays pending on
  /// `parent` and pairs with the next idup of the late peers. A retry of create() on
  /// the same parent therefore waits for that pending duplicate instead of issuing a
  /// new one (which could never pair): a late peer's first create() and this rank's
  /// retry end with the same communicator. Until every rank's create() on `parent`
  /// succeeded, do not issue other collectives on `parent` (they would pair with the
  /// pending idup); retry create() or give the job up.
  static std::error_code create(mpi_communicator& out, MPI_Comm parent, kvtier::deadline dl,
                                mpi_options opt = {}) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
      return out.set_error(errc::invalid_argument,
                           "mpi: MPI is not initialised (call MPI_Init_thread first)");
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < opt.thread_level)
      return out.set_error(errc::invalid_argument,
                           "mpi: MPI provides thread level " + std::string(thread_level_name(provided)) +
                               " but kvtier needs " + thread_level_name(opt.thread_level) +
                               " (initialise with MPI_Init_thread(..., " +
                               thread_level_name(opt.thread_level) + ", ...))");
    mpi_communicator c;
    c.opt_ = opt;
    {  // name this rank of the parent in every message (not "rank 0 of 0")
      int pr = 0, pw = 0;
      MPI_Comm_rank(parent, &pr);
      MPI_Comm_size(parent, &pw);
      c.rank_ = static_cast<rank_t>(pr);
      c.size_ = static_cast<rank_t>(pw);
    }
    c.start_ = kvtier::clock::now();
    // A duplicate that timed out earlier on this parent is still pending: pair with it.
    detail_pending_dup dup = take_pending_dup(parent);
    const bool retry = dup.slot != nullptr;
    if (!retry) {
      // MPI writes the new handle when the request completes, possibly after a timeout
      // returned: the slot is heap memory kept (in the pending table) until it did.
      dup.slot = new MPI_Comm(MPI_COMM_NULL);
      if (int rc = MPI_Comm_idup(parent, dup.slot, &dup.request); rc != MPI_SUCCESS) {
        delete dup.slot;
        return out.set_error(errc::backend_error, "mpi: MPI_Comm_idup: " + error_string(rc));
      }
    }
    c.what_ = retry ? "MPI_Comm_idup (the one still pending from an earlier create() that timed out)"
                    : "MPI_Comm_idup";
    if (auto ec = c.wait_all(&dup.request, 1, dl)) {
      if (dup.request != MPI_REQUEST_NULL) {
        keep_pending_dup(parent, dup);
        out.last_error_ =
            "mpi: create(): " + c.last_error_ +
            " (the duplicate stays pending on the parent: a retry of create() on the same parent "
            "pairs with it)";
      } else {
        out.last_error_ = "mpi: create(): " + c.last_error_;
      }
      return ec;
    }
    c.comm_ = *dup.slot;
    delete dup.slot;
    MPI_Comm_set_errhandler(c.comm_, MPI_ERRORS_RETURN);
    int r = 0, w = 0;
    MPI_Comm_rank(c.comm_, &r);
    MPI_Comm_size(c.comm_, &w);
    c.rank_ = static_cast<rank_t>(r);
    c.size_ = static_cast<rank_t>(w);
    if (opt.notify_peers && w > 1) {
      static std::atomic<unsigned> created{0};      // this process's communicators, in create() order
      c.notice_ = std::make_unique<notice_slot>();  // heap: stays put when the communicator moves
      c.notice_->tag = opt.notice_tag + static_cast<int>(created.fetch_add(1) % 4096);
      if (int rc = MPI_Irecv(&c.notice_->got, 1, MPI_UINT64_T, MPI_ANY_SOURCE, c.notice_->tag, c.comm_,
                             &c.notice_->request);
          rc != MPI_SUCCESS)
        return out.set_error(errc::backend_error,
                             "mpi: MPI_Irecv (the peers' failure notice): " + error_string(rc));
    }
    out = std::move(c);
    return {};
  }

  /// Whether a create() on `parent` timed out and its duplicate is still pending
  /// (the next create() on `parent` pairs with it).
  static bool create_pending(MPI_Comm parent) {
    std::lock_guard lk(pending_dups().mu);
    for (const auto& d : pending_dups().list)
      if (d.parent == parent) return true;
    return false;
  }

  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return size_; }
  /// kvtier's duplicate of the parent communicator.
  MPI_Comm native() const noexcept { return comm_; }
  /// True after a failure: every call now fails at once with first_error().
  bool poisoned() const noexcept { return static_cast<bool>(poison_); }
  std::error_code first_error() const noexcept { return poison_; }
  const std::string& last_error() const noexcept { return last_error_; }

  /// Poisons the communicator on purpose (e.g. the engine gave up on this world):
  /// every later call fails with backend_error; peers fail by their own deadlines.
  void abort(const std::string& why) {
    if (!poison_) poison(errc::backend_error, "mpi: aborted: " + why);
  }

  std::error_code broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                            kvtier::deadline dl) {
    pending_op o{op_kind::broadcast, root, send, recv};
    if (root >= size_) return submit(o, "broadcast: root " + std::to_string(root) + " out of range", dl);
    if (rank_ == root && send.size() != recv.size())
      return submit(o,
                    "broadcast: root's send size " + std::to_string(send.size()) + " != recv size " +
                        std::to_string(recv.size()),
                    dl);
    return submit(o, count_problem(recv.size()), dl);
  }

  std::error_code all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             kvtier::deadline dl) {
    pending_op o{op_kind::all_gather, 0, send, recv};
    if (recv.size() != send.size() * size_)
      return submit(o,
                    "all_gather: recv size " + std::to_string(recv.size()) + " != " + std::to_string(size_) +
                        " x send size " + std::to_string(send.size()),
                    dl);
    return submit(o, count_problem(recv.size()), dl);
  }

  /// all_reduce over host memory: recv.size() / dtype_size(t) elements; send may alias recv.
  std::error_code all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, dtype t,
                             reduce_op op, kvtier::deadline dl) {
    pending_op o{op_kind::all_reduce, 0, send, recv, t, op};
    if (auto why = all_reduce_args_problem(send.size(), recv.size(), t); !why.empty())
      return submit(o, std::string(why), dl);
    return submit(o, count_problem(recv.size()), dl);
  }

  std::error_code group_start() {
    if (poison_) return failed_again();
    ++depth_;
    return {};
  }

  std::error_code group_end(kvtier::deadline dl) {
    if (depth_ == 0) return poison_ ? failed_again() : refuse("group_end without group_start");
    if (--depth_ > 0) return {};
    std::vector<pending_op> ops;
    ops.swap(queued_);
    std::string problem;
    problem.swap(group_problem_);
    if (poison_) return failed_again();
    if (!problem.empty()) return refuse(problem + " (in a group; the group was not issued)");
    if (ops.empty()) return {};
    return execute(ops, dl);
  }

  /// Host memmove, at once (not a collective).
  std::error_code local_copy(std::span<std::byte> dst, std::span<const std::byte> src, kvtier::deadline) {
    if (poison_) return failed_again();
    if (dst.size() != src.size()) return refuse("local_copy: sizes differ");
    if (!dst.empty() && dst.data() != src.data()) std::memmove(dst.data(), src.data(), dst.size());
    return {};
  }

  /// Name of an MPI thread level ("MPI_THREAD_SERIALIZED").
  static const char* thread_level_name(int level) noexcept {
    switch (level) {
      case MPI_THREAD_SINGLE:
        return "MPI_THREAD_SINGLE";
      case MPI_THREAD_FUNNELED:
        return "MPI_THREAD_FUNNELED";
      case MPI_THREAD_SERIALIZED:
        return "MPI_THREAD_SERIALIZED";
      case MPI_THREAD_MULTIPLE:
        return "MPI_THREAD_MULTIPLE";
    }
    return "unknown MPI thread level";
  }

 private:
  struct pending_op {
    op_kind kind;
    rank_t root = 0;
    std::span<const std::byte> send;
    std::span<std::byte> recv;
    dtype type = dtype::bytes;
    reduce_op reduce = reduce_op::min;
    std::size_t stage_at = 0;  // offset in the staging block
    bool staged = false;
  };

  // create()'s duplicates that timed out, per parent (one at most: a retry waits on it).
  struct detail_pending_dup {
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Comm* slot = nullptr;  // MPI writes the new handle here when the request completes
  };
  struct pending_dup_table {
    std::mutex mu;
    std::vector<detail_pending_dup> list;
  };
  static pending_dup_table& pending_dups() {
    static pending_dup_table t;  // never destroyed before MPI_Finalize in practice; entries leak on purpose
    return t;
  }
  static detail_pending_dup take_pending_dup(MPI_Comm parent) {
    auto& t = pending_dups();
    std::lock_guard lk(t.mu);
    for (auto it = t.list.begin(); it != t.list.end(); ++it)
      if (it->parent == parent) {
        detail_pending_dup d = *it;
        t.list.erase(it);
        return d;
      }
    return {};
  }
  static void keep_pending_dup(MPI_Comm parent, detail_pending_dup d) {
    d.parent = parent;
    auto& t = pending_dups();
    std::lock_guard lk(t.mu);
    t.list.push_back(d);
  }

  static std::string error_string(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
    return std::string(text, static_cast<std::size_t>(len));
  }

  static std::string count_problem(std::size_t bytes) {
    if (bytes <= static_cast<std::size_t>(INT_MAX)) return {};
    return "a collective of " + std::to_string(bytes) + " bytes exceeds MPI's int count";
  }

  static std::string describe(const pending_op& o) {
    switch (o.kind) {
      case op_kind::broadcast:
        return "MPI_Ibcast(root=" + std::to_string(o.root) + ", " + std::to_string(o.recv.size()) + " bytes)";
      case op_kind::all_gather:
        return "MPI_Iallgather(" + std::to_string(o.send.size()) + " bytes per rank)";
      case op_kind::all_reduce:
        return "MPI_Iallreduce(" + std::string(to_string(o.type)) + " x" +
               std::to_string(o.recv.size() / dtype_size(o.type)) + ", " + std::string(to_string(o.reduce)) +
               ")";
      case op_kind::group:
        break;
    }
    return "?";
  }

  static MPI_Datatype mpi_type(dtype t, reduce_op op) noexcept {
    // A sum is computed on the unsigned type: the same bits as two's-complement
    // wrap-around, with no signed overflow inside MPI.
    const bool sum = op == reduce_op::sum;
    switch (t) {
      case dtype::i32:
        return sum ? MPI_UINT32_T : MPI_INT32_T;
      case dtype::u32:
        return MPI_UINT32_T;
      case dtype::i64:
        return sum ? MPI_UINT64_T : MPI_INT64_T;
      case dtype::u64:
        return MPI_UINT64_T;
      case dtype::bytes:
        break;
    }
    return MPI_BYTE;
  }
  static MPI_Op mpi_op(reduce_op op) noexcept {
    return op == reduce_op::min ? MPI_MIN : op == reduce_op::max ? MPI_MAX : MPI_SUM;
  }

  std::error_code set_error(errc e, std::string msg) {
    last_error_ = std::move(msg);
    return e;
  }

  // The first failure wins: a poisoned communicator keeps reporting it, whatever
  // misuse follows (e.g. a group_end after a refused group_start).
  std::error_code poison(errc e, std::string msg, bool tell_peers = true) {
    if (poison_) return failed_again();
    poison_ = e;
    first_message_ = msg;
    last_error_ = std::move(msg);
    if (tell_peers) notify_peers();
    // Peers that failed too may still send notices here: never free it, so no unreceived
    // message is left on a context MPI may reuse for a new communicator (OpenMPI orders
    // messages per context and peer: a stale one breaks the new communicator's traffic).
    if (notice_) abandoned_ = true;
    return poison_;
  }
  std::error_code failed_again() {
    last_error_ = "mpi: communicator poisoned by an earlier failure: " + first_message_;
    return poison_;
  }
  // This rank refuses a call its peers may have issued: poison, so its next call
  // cannot pair with the peers' refused one.
  std::error_code refuse(const std::string& why) {
    return poison(errc::invalid_argument, "mpi: rank " + std::to_string(rank_) + ": " + why +
                                              "; communicator poisoned (peers may have issued this call)");
  }

  std::error_code submit(pending_op o, const std::string& problem, kvtier::deadline dl) {
    if (poison_) return failed_again();
    if (comm_ == MPI_COMM_NULL) return set_error(errc::backend_error, "mpi: no communicator (use create())");
    if (depth_ > 0) {
      queued_.push_back(o);
      if (!problem.empty()) {
        if (group_problem_.empty()) group_problem_ = problem;
        last_error_ = problem;
        return errc::invalid_argument;
      }
      return {};
    }
    if (!problem.empty()) return refuse(problem);
    return execute(std::span<pending_op>(&o, 1), dl);
  }

  // The peers' failure notice (see the file comment): the posted receive and where it lands.
  struct notice_slot {
    std::uint64_t got = 0;   // received: the rounds that completed on the notifying rank
    std::uint64_t sent = 0;  // sent: this rank's (the send buffer, alive until MPI is done with it)
    int from = -1;           // the notifying rank, once a notice arrived
    int tag = 0;             // this communicator's notice tag (mpi_options::notice_tag)
    MPI_Request request = MPI_REQUEST_NULL;
  };
  // True once a peer's notice arrived saying the current round (rounds_done_) can never
  // complete there: the peer stopped before it.
  bool peer_failed() {
    if (!notice_) return false;
    if (notice_->request != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Status st;
      if (MPI_Test(&notice_->request, &done, &st) != MPI_SUCCESS || !done) return false;
      notice_->from = st.MPI_SOURCE;
    }
    return notice_->from >= 0 && notice_->got <= rounds_done_;
  }
  std::error_code poison_from_peer() {
    return poison(
        errc::backend_error,
        "mpi: rank " + std::to_string(notice_->from) +
            " poisoned its communicator (a collective failed there), so every rank must recover(): " +
            (what_.empty() ? std::string("this call") : what_) + " on rank " + std::to_string(rank_) +
            " gave up at once; communicator poisoned",
        /*tell_peers=*/false);
  }
  // Tells every peer that this communicator is poisoned (fire and forget: a notice no peer
  // receives any more stays with MPI, one int).
  void notify_peers() noexcept {
    if (!notice_ || comm_ == MPI_COMM_NULL) return;
    notice_->sent = rounds_done_;  // rounds before it completed here: peers may still finish them
    for (rank_t p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(&notice_->sent, 1, MPI_UINT64_T, static_cast<int>(p), notice_->tag, comm_, &r) ==
          MPI_SUCCESS)
        MPI_Request_free(&r);
    }
  }

  // Issues every op as one request each, then polls them all to `dl`.
  std::error_code execute(std::span<pending_op> ops, kvtier::deadline dl) {
    start_ = kvtier::clock::now();
    what_ = ops.size() == 1 ? describe(ops[0])
                            : "group of " + std::to_string(ops.size()) + " ops, first " + describe(ops[0]);
    if (peer_failed()) return poison_from_peer();  // its round can never complete: do not issue it
    // Lay out the staging block.
    std::size_t need = 0;
    for (auto& o : ops) {
      o.staged = opt_.stage || o.kind == op_kind::all_reduce;
      if (!o.staged) continue;
      o.stage_at = need;
      need += (o.recv.size() + 63) / 64 * 64;
    }
    if (stage_size_ < need) {
      stage_.reset(new std::byte[need]);
      stage_size_ = need;
    }
    std::byte* stage = stage_.get();
    requests_.assign(ops.size(), MPI_REQUEST_NULL);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const pending_op& o = ops[i];
      std::byte* s = o.staged ? stage + o.stage_at : nullptr;
      const int n = static_cast<int>(o.recv.size());
      int rc = MPI_SUCCESS;
      switch (o.kind) {
        case op_kind::broadcast: {
          void* buf = o.recv.data();
          if (o.staged) {
            if (rank_ == o.root && n) std::memcpy(s, o.send.data(), o.recv.size());
            buf = s;
          } else if (rank_ == o.root) {
            buf = const_cast<std::byte*>(o.send.data());  // read only at the root
          }
          rc = MPI_Ibcast(buf, n, MPI_BYTE, static_cast<int>(o.root), comm_, &requests_[i]);
          break;
        }
        case op_kind::all_gather: {
          const int per = static_cast<int>(o.send.size());
          if (o.staged) {
            if (per) std::memcpy(s + rank_ * o.send.size(), o.send.data(), o.send.size());
            rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, s, per, MPI_BYTE, comm_, &requests_[i]);
          } else if (o.send.data() == o.recv.data() + rank_ * o.send.size()) {
            rc =
                MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, o.recv.data(), per, MPI_BYTE, comm_, &requests_[i]);
          } else {
            rc = MPI_Iallgather(o.send.data(), per, MPI_BYTE, o.recv.data(), per, MPI_BYTE, comm_,
                                &requests_[i]);
          }
          break;
        }
        case op_kind::all_reduce:
          if (n) std::memcpy(s, o.send.data(), o.recv.size());
          rc = MPI_Iallreduce(MPI_IN_PLACE, s, static_cast<int>(o.recv.size() / dtype_size(o.type)),
                              mpi_type(o.type, o.reduce), mpi_op(o.reduce), comm_, &requests_[i]);
          break;
        case op_kind::group:
          break;
      }
      if (rc != MPI_SUCCESS) {
        abandon(requests_.data(), i);  // the ones already issued stay pending
        return poison(errc::backend_error, "mpi: " + describe(o) + " on rank " + std::to_string(rank_) +
                                               ": " + error_string(rc) + "; communicator poisoned");
      }
    }
    if (auto ec = wait_all(requests_.data(), ops.size(), dl)) return ec;
    ++rounds_done_;
    for (const auto& o : ops) {  // deliver
      if (o.recv.empty()) continue;
      if (o.staged)
        std::memcpy(o.recv.data(), stage + o.stage_at, o.recv.size());
      else if (o.kind == op_kind::broadcast && rank_ == o.root && o.send.data() != o.recv.data())
        std::memcpy(o.recv.data(), o.send.data(), o.recv.size());
    }
    return {};
  }

  // Short collectives finish in microseconds: yield first, then sleep so a long wait costs no CPU.
  static void pause(unsigned i) {
    if (i < 20000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  // Polls reqs[0..n) until all completed, one failed, or `dl` passed (then poisons).
  std::error_code wait_all(MPI_Request* reqs, std::size_t n, kvtier::deadline dl) {
    for (unsigned i = 0;; ++i) {
      int done = 0;
      const int rc = MPI_Testall(static_cast<int>(n), reqs, &done, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        abandon(reqs, n);
        return poison(errc::backend_error, "mpi: " + what_ + " on rank " + std::to_string(rank_) + ": " +
                                               error_string(rc) + "; communicator poisoned");
      }
      if (done) return {};
      if (peer_failed()) {  // the round can never complete on every rank: give up now
        abandon(reqs, n);
        return poison_from_peer();
      }
      if (kvtier::expired(dl)) {
        abandon(reqs, n);
        return poison(errc::timeout, "mpi: " + what_ + " on rank " + std::to_string(rank_) + " of " +
                                         std::to_string(size_) + ": " + detail::deadline_text(dl, start_) +
                                         " passed before every rank joined; communicator poisoned");
      }
      pause(i);
    }
  }

  // Requests MPI still owns after a failure: they keep the staging block alive
  // (MPI may write it, or read it, whenever the missing peer arrives).
  void abandon(MPI_Request* reqs, std::size_t n) {
    bool pending = false;
    for (std::size_t i = 0; i < n; ++i) pending |= reqs[i] != MPI_REQUEST_NULL;
    if (!pending) return;
    abandoned_ = true;
    if (stage_) leaked_stages_.push_back(std::move(stage_));
    stage_size_ = 0;
  }

  void release() noexcept {
    int fin = 1;
    MPI_Finalized(&fin);
    // A communicator with abandoned requests is never freed: OpenMPI may reuse its
    // context id for a new one while those requests still progress (seen to crash).
    if (notice_ && notice_->request != MPI_REQUEST_NULL && !fin) {
      MPI_Cancel(&notice_->request);  // a receive cancels locally; wait for it before its slot goes
      MPI_Wait(&notice_->request, MPI_STATUS_IGNORE);
    }
    if (abandoned_) (void)notice_.release();  // its sends may still read notice_->sent
    if (comm_ != MPI_COMM_NULL && !fin && !abandoned_) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    // A request MPI still holds may write its staging memory after this: never free it.
    for (auto& a : leaked_stages_) (void)a.release();
  }

  void swap(mpi_communicator& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(opt_, o.opt_);
    std::swap(depth_, o.depth_);
    queued_.swap(o.queued_);
    group_problem_.swap(o.group_problem_);
    std::swap(stage_, o.stage_);
    std::swap(stage_size_, o.stage_size_);
    std::swap(abandoned_, o.abandoned_);
    leaked_stages_.swap(o.leaked_stages_);
    requests_.swap(o.requests_);
    std::swap(poison_, o.poison_);
    first_message_.swap(o.first_message_);
    last_error_.swap(o.last_error_);
    what_.swap(o.what_);
    std::swap(start_, o.start_);
    notice_.swap(o.notice_);
    std::swap(rounds_done_, o.rounds_done_);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  rank_t rank_ = 0, size_ = 0;
  mpi_options opt_;
  std::uint32_t depth_ = 0;
  std::vector<pending_op> queued_;
  std::string group_problem_;  // first local problem of the open group
  std::unique_ptr<std::byte[]> stage_;
  std::size_t stage_size_ = 0;
  bool abandoned_ = false;  // MPI still holds requests of this communicator
  std::vector<std::unique_ptr<std::byte[]>> leaked_stages_;
  std::vector<MPI_Request> requests_;
  std::error_code poison_;
  std::string first_message_, last_error_, what_;
  kvtier::clock::time_point start_{};
  std::unique_ptr<notice_slot> notice_;  // the peers' failure notice (notify_peers)
  std::uint64_t rounds_done_ = 0;        // calls (groups) that completed: the same order on every rank
};

/// Bootstrap (see kvtier/comm/bootstrap.hpp) by broadcast from `root` over an
/// mpi_communicator: publish() on the root, fetch() on every other rank, both
/// collective. The name and size travel first, so a rank that asked for another
/// name or size gets an error instead of wrong bytes.
///
///   kvtier::comm::mpi_bootstrap boot(comm);
///   auto ec = comm.rank() == 0 ? boot.publish("nccl-id", id_bytes, dl) : boot.fetch("nccl-id", id_bytes,
///   dl);
class mpi_bootstrap {
 public:
  explicit mpi_bootstrap(mpi_communicator& comm, rank_t root = 0) : comm_(&comm), root_(root) {}

  const std::string& last_error() const noexcept { return last_error_; }

  std::error_code publish(std::string_view name, std::span<const std::byte> bytes, kvtier::deadline dl) {
    if (comm_->rank() != root_)
      return fail(errc::invalid_argument, "publish() is for rank " + std::to_string(root_));
    std::uint64_t head[2] = {name_hash(name), bytes.size()};
    if (auto ec = comm_->broadcast(std::as_bytes(std::span(head)), std::as_writable_bytes(std::span(head)),
                                   root_, dl))
      return fail(ec, comm_->last_error());
    std::vector<std::byte> copy(bytes.begin(), bytes.end());
    if (auto ec = comm_->broadcast(bytes, copy, root_, dl)) return fail(ec, comm_->last_error());
    return {};
  }

  std::error_code fetch(std::string_view name, std::span<std::byte> out, kvtier::deadline dl) {
    std::uint64_t head[2] = {0, 0};
    if (auto ec = comm_->broadcast({}, std::as_writable_bytes(std::span(head)), root_, dl))
      return fail(ec, comm_->last_error());
    // Always take the payload, so this rank stays in step with its peers.
    std::vector<std::byte> got(static_cast<std::size_t>(head[1]));
    if (auto ec = comm_->broadcast({}, got, root_, dl)) return fail(ec, comm_->last_error());
    if (head[0] != name_hash(name))
      return fail(errc::invalid_argument, "rank " + std::to_string(root_) + " published another name than '" +
                                              std::string(name) + "'");
    if (got.size() != out.size())
      return fail(errc::wrong_length, "published " + std::to_string(got.size()) + " bytes, expected " +
                                          std::to_string(out.size()));
    std::memcpy(out.data(), got.data(), got.size());
    return {};
  }

 private:
  static std::uint64_t name_hash(std::string_view s) noexcept {
    std::uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
    return h;
  }
  std::error_code fail(std::error_code ec, const std::string& why) {
    last_error_ = "mpi_bootstrap: " + why;
    return ec;
  }

  mpi_communicator* comm_;
  rank_t root_;
  std::string last_error_;
};

}  // namespace kvtier::comm
