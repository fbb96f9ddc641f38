// kvtier/comm/nccl.hpp: the NCCL communicator backend (one GPU per rank; target kvtier::nccl).
//
// One nccl_communicator per rank, each with its own CUDA stream and a small device
// scratch area. The NCCL communicator is created non-blocking, so no NCCL call can
// block the host: every collective is enqueued on the stream and then polled
// (cudaStreamQuery + ncclCommGetAsyncError) until it completed, failed or its
// deadline passed; on a timeout or an asynchronous NCCL error the communicator is
// aborted with ncclCommAbort and stays poisoned (every later call returns
// errc::backend_error; create a new one). NCCL cannot see mismatched calls: they
// surface as errc::timeout on the ranks that wait. A collective that fails on this
// rank before NCCL got it (invalid arguments, a failed CUDA or NCCL call) aborts the
// communicator too (inside a group: when the group ends): NCCL pairs calls by
// position, so this rank's next call would otherwise pair with the peers' skipped one.
//
// Memory: broadcast, all_gather and local_copy take device memory; all_reduce takes
// host memory (it is staged through pinned host and device scratch), as the
// communicator concept specifies. The stream is non-blocking: it does not wait for
// work on other streams, the legacy default stream included (cudaMemset, and
// cudaMemcpy from pageable memory, may return before the device finished them).
// Whatever fills a send buffer must be complete, or ordered before stream() with an
// event, when the call is made; on success every result is complete on return.
//
//   ncclUniqueId id;
//   kvtier::comm::nccl_unique_id(id);                   // rank 0; share it out of band
//   kvtier::comm::nccl_communicator c;
//   auto ec = kvtier::comm::nccl_communicator::create(c, id, rank, world, /*device=*/rank,
//                                                     kvtier::deadline_after(std::chrono::seconds(30)));
//   kvtier::comm::device_buffer buf(12'400'000);
//   ec = c.broadcast(buf.bytes(), buf.bytes(), /*root=*/0, kvtier::deadline_after(std::chrono::seconds(2)));
//
// The engine's own communicator: adopt(out, engine_comm, engine_stream) wraps an
// ncclComm_t the engine created, without owning it (never finalized, destroyed or
// aborted here), and enqueues on the engine's stream. Every call records a CUDA
// event after its work and waits on that event, not on the stream, so the engine's
// later work on that stream is never waited for. Its earlier work is: the stream
// reaches kvtier's operation only after it. So on an adopted stream the budget of a
// call (dl minus the time of the call) starts when the stream reaches the operation
// (an event recorded just before it), and the wait for that is bounded by
// adopt_options::max_queue_wait past dl: a 200 ms broadcast queued behind 2 s of
// prefill kernels gets its 200 ms (kvtier/comm/nccl_policy.hpp).
//
// A failure on an adopted communicator never aborts it: ncclCommAbort frees the
// handle the engine still owns (its own ncclCommDestroy would be a use-after-free)
// and takes every peer's communicator down. kvtier reports the failure, stops using
// the communicator (every later call fails at once with the first error) and leaves
// the decision to the engine, which owns the stream that may still hold the
// operation waiting for a peer; abort_now() is the explicit way to abort it anyway.
//
// Blocking or not: adopt() works with either, but only a non-blocking communicator
// (ncclConfig_t::blocking = 0, as create() makes) keeps every call within its
// deadline. With a blocking one, NCCL may block the host inside an enqueue or
// ncclGroupEnd (e.g. while it connects to a peer that never comes) before kvtier can
// look at the clock; kvtier cannot detect which kind it was given.
//
// enqueue_broadcast()/enqueue_all_gather() only enqueue (bounded by the deadline, as
// NCCL's non-blocking enqueue may take a while) and return the event, for data moves
// ordered against the engine's compute with cudaStreamWaitEvent; wait_event(ev, dl)
// is their bounded host wait, and their failures surface there, in check() or in
// the next host-waiting call. order_after(ev) makes this communicator's stream wait
// for an event of another stream (e.g. the scatter that filled the sources):
// chunk_broadcast's broadcast_params::sources_ready hook is where to call it.
//
//   kvtier::comm::nccl_communicator c;
//   kvtier::comm::nccl_communicator::adopt(c, engine_comm, engine_stream);
//   auto [ec, ev] = c.enqueue_broadcast(src, dst, owner, dl);   // ordered on engine_stream
//   cudaStreamWaitEvent(compute_stream, ev);                     // or: c.wait_event(ev, dl)
//
// Bootstrap: create(out, boot, name, rank, size, device, dl) makes the unique id on
// rank 0 and hands it to the others through a kvtier::comm::bootstrap (MPI or RESP).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/comm/bootstrap.hpp"
#include "kvtier/comm/communicator.hpp"
#include "kvtier/comm/nccl_policy.hpp"

namespace kvtier::comm {

/// Number of CUDA devices; 0 when there is no driver or no device.
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

/// A fresh NCCL unique id (rank 0 creates it; all ranks pass the same one to create()).
inline std::error_code nccl_unique_id(ncclUniqueId& id) noexcept {
  return ncclGetUniqueId(&id) == ncclSuccess ? std::error_code{}
                                             : make_error_code(kvtier::errc::backend_error);
}

namespace detail {
inline cudaError_t device_alloc(void** p, std::size_t n) { return cudaMalloc(p, n); }
inline cudaError_t device_free(void* p) { return cudaFree(p); }
inline cudaError_t pinned_alloc(void** p, std::size_t n) { return cudaMallocHost(p, n); }
inline cudaError_t pinned_free(void* p) { return cudaFreeHost(p); }

/// An owning CUDA allocation made by Alloc and released by Free.
template <cudaError_t (*Alloc)(void**, std::size_t), cudaError_t (*Free)(void*)>
class cuda_allocation {
 public:
  cuda_allocation() = default;
  explicit cuda_allocation(std::size_t bytes) {
    if (bytes && Alloc(&p_, bytes) == cudaSuccess)
      n_ = bytes;
    else
      p_ = nullptr;
  }
  cuda_allocation(cuda_allocation&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  cuda_allocation& operator=(cuda_allocation&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~cuda_allocation() {
    if (p_) Free(p_);
  }
  /// False when the allocation failed.
  explicit operator bool() const noexcept { return p_ != nullptr; }
  std::byte* data() const noexcept { return static_cast<std::byte*>(p_); }
  std::size_t size() const noexcept { return n_; }
  std::span<std::byte> bytes() const noexcept { return {data(), n_}; }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};
}  // namespace detail

/// Owning device allocation (cudaMalloc / cudaFree).
using device_buffer = detail::cuda_allocation<&detail::device_alloc, &detail::device_free>;
/// Owning page-locked host allocation (cudaMallocHost / cudaFreeHost).
using pinned_buffer = detail::cuda_allocation<&detail::pinned_alloc, &detail::pinned_free>;

/// How adopt() wraps the engine's communicator.
struct adopt_options {
  /// How long past a call's deadline kvtier waits for the engine's stream to reach
  /// the operation (the engine's earlier work runs first; see the file comment).
  std::chrono::milliseconds max_queue_wait{10'000};
};

/// One rank's NCCL communicator; models kvtier::comm::communicator.
class nccl_communicator {
 public:
  /// A round can complete on some ranks and fail on others (see communicator.hpp).
  static constexpr bool rounds_fail_together = false;

  /// Bytes of all_reduce data one call (or one group) may carry.
  static constexpr std::size_t reduce_scratch_bytes = 64 * 1024;

  nccl_communicator() = default;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator(nccl_communicator&& o) noexcept { *this = std::move(o); }
  nccl_communicator& operator=(nccl_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      stream_ = std::exchange(o.stream_, nullptr);
      rank_ = o.rank_;
      size_ = o.size_;
      device_ = o.device_;
      owned_ = std::exchange(o.owned_, true);
      max_queue_wait_ = o.max_queue_wait_;
      done_ = std::exchange(o.done_, nullptr);
      begin_ = std::exchange(o.begin_, nullptr);
      called_ = o.called_;
      first_error_ = std::exchange(o.first_error_, {});
      first_message_ = std::move(o.first_message_);
      ring_ = std::move(o.ring_);
      ring_next_ = std::exchange(o.ring_next_, 0);
      aborted_ = std::exchange(o.aborted_, false);
      poisoned_ = std::exchange(o.poisoned_, false);
      group_depth_ = std::exchange(o.group_depth_, 0u);
      group_error_ = std::exchange(o.group_error_, {});
      group_message_ = std::move(o.group_message_);
      scratch_ = std::move(o.scratch_);
      host_scratch_ = std::move(o.host_scratch_);
      scratch_used_ = std::exchange(o.scratch_used_, 0);
      pending_host_ = std::move(o.pending_host_);
      last_error_ = std::move(o.last_error_);
    }
    return *this;
  }
  ~nccl_communicator() { release(); }

  /// Creates rank `rank` of `size` ranks sharing `id`, on CUDA device `device`.
  /// Returns by `dl` (the non-blocking init is aborted when it passes).
  static std::error_code create(nccl_communicator& out, const ncclUniqueId& id, rank_t rank, rank_t size,
                                int device, kvtier::deadline dl) {
    nccl_communicator c;
    c.rank_ = rank;
    c.size_ = size;
    c.device_ = device;
    if (auto ec = c.cuda(cudaSetDevice(device), "cudaSetDevice")) return out.adopt_error(c, ec);
    if (auto ec = c.cuda(cudaStreamCreateWithFlags(&c.stream_, cudaStreamNonBlocking), "cudaStreamCreate"))
      return out.adopt_error(c, ec);
    if (auto ec = c.make_scratch()) return out.adopt_error(c, ec);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // no NCCL call may block the host past a deadline
    ncclUniqueId uid = id;
    ncclResult_t r =
        ncclCommInitRankConfig(&c.comm_, static_cast<int>(size), uid, static_cast<int>(rank), &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      c.comm_ = nullptr;
      return out.adopt_error(c, c.nccl(r, "ncclCommInitRankConfig"));
    }
    if (auto ec = c.wait_enqueued("ncclCommInitRankConfig", dl)) return out.adopt_error(c, ec);
    out = std::move(c);
    return {};
  }

  /// Creates rank `rank` of `size` ranks with a unique id handed over by `boot`
  /// (rank 0 makes and publishes it under `name`; the others fetch it), by `dl`.
  template <bootstrap B>
  static std::error_code create(nccl_communicator& out, B& boot, std::string_view name, rank_t rank,
                                rank_t size, int device, kvtier::deadline dl) {
    ncclUniqueId id{};
    auto bytes = std::as_writable_bytes(std::span(id.internal));
    if (rank == 0) {
      if (auto ec = nccl_unique_id(id)) return out.invalid_with(ec, "ncclGetUniqueId failed");
      if (auto ec = boot.publish(name, bytes, dl))
        return out.invalid_with(ec, std::string(boot.last_error()));
    } else if (auto ec = boot.fetch(name, bytes, dl)) {
      return out.invalid_with(ec, std::string(boot.last_error()));
    }
    return create(out, id, rank, size, device, dl);
  }

  /// Wraps the engine's communicator and stream without owning either (see the file
  /// comment). Fails when NCCL cannot report the communicator's rank, size or device.
  static std::error_code adopt(nccl_communicator& out, ncclComm_t comm, cudaStream_t stream,
                               adopt_options opt = {}) {
    nccl_communicator c;
    c.owned_ = false;
    c.max_queue_wait_ = opt.max_queue_wait;
    int r = 0, n = 0, dev = 0;
    if (auto ec = c.nccl(ncclCommUserRank(comm, &r), "ncclCommUserRank")) return out.adopt_error(c, ec);
    if (auto ec = c.nccl(ncclCommCount(comm, &n), "ncclCommCount")) return out.adopt_error(c, ec);
    if (auto ec = c.nccl(ncclCommCuDevice(comm, &dev), "ncclCommCuDevice")) return out.adopt_error(c, ec);
    c.rank_ = static_cast<rank_t>(r);
    c.size_ = static_cast<rank_t>(n);
    c.device_ = dev;
    c.stream_ = stream;
    if (auto ec = c.cuda(cudaSetDevice(dev), "cudaSetDevice")) return out.adopt_error(c, ec);
    if (auto ec = c.make_scratch()) return out.adopt_error(c, ec);
    c.comm_ = comm;
    out = std::move(c);
    return {};
  }

  /// Result of an enqueue-only call: `event` completes when the operation did.
  struct enqueue_result {
    std::error_code ec;
    cudaEvent_t event = nullptr;
  };

  /// Enqueues a broadcast on stream() and returns its event; `dl` bounds the enqueue only.
  enqueue_result enqueue_broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                                   kvtier::deadline dl) {
    if (auto ec = usable()) return {ec};
    if (group_depth_ > 0) return {invalid("enqueue_broadcast inside a group")};
    if (root >= size_ || (rank_ == root && send.size() != recv.size()))
      return {skipped(invalid("enqueue_broadcast: bad root or sizes"))};
    const void* s = rank_ == root ? static_cast<const void*>(send.data()) : recv.data();
    return enqueued(
        ncclBroadcast(s, recv.data(), recv.size(), ncclUint8, static_cast<int>(root), comm_, stream_),
        "ncclBroadcast", dl);
  }

  /// Enqueues an all-gather on stream() and returns its event; `dl` bounds the enqueue only.
  enqueue_result enqueue_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                                    kvtier::deadline dl) {
    if (auto ec = usable()) return {ec};
    if (group_depth_ > 0) return {invalid("enqueue_all_gather inside a group")};
    if (recv.size() != send.size() * size_)
      return {skipped(invalid("enqueue_all_gather: recv size != size() * send size"))};
    return enqueued(ncclAllGather(send.data(), recv.data(), send.size(), ncclUint8, comm_, stream_),
                    "ncclAllGather", dl);
  }

  /// Waits for an event an enqueue-only call returned, by `dl`: success once it
  /// completed; a timeout or an NCCL/CUDA error makes the communicator unusable (and
  /// aborts it when kvtier owns it; see the file comment). The event belongs to a
  /// ring of 32: wait for it before 32 more enqueue-only calls.
  std::error_code wait_event(cudaEvent_t ev, kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (!ev) return invalid("wait_event: no event");
    for (unsigned i = 0;; ++i) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return {};
      if (q != cudaErrorNotReady) {
        auto ec = cuda(q, "wait_event");
        fail_comm(last_error_, ec);
        return ec;
      }
      if (auto ec = async_error("wait_event")) return ec;
      if (kvtier::expired(dl)) {
        fail_comm("wait_event: deadline passed before the enqueued operation completed (" +
                      detail::deadline_text(dl, kvtier::clock::now()) + ")",
                  kvtier::errc::timeout);
        return kvtier::errc::timeout;
      }
      pause(i);
    }
  }

  /// Makes this communicator's stream wait for `ev` (recorded on another stream, e.g.
  /// after the kernel that filled the sources) before its next operation; never blocks.
  std::error_code order_after(cudaEvent_t ev) {
    if (auto ec = usable()) return ec;
    return cuda(cudaStreamWaitEvent(stream_, ev, 0), "cudaStreamWaitEvent");
  }

  /// Reports (and aborts on) an asynchronous NCCL error of enqueued work; never blocks.
  std::error_code check() {
    if (auto ec = usable()) return ec;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess || state == ncclInProgress) return {};
    auto ec = nccl(state, "enqueued work");
    fail_comm(last_error_, ec);
    return ec;
  }

  /// Gives up on this communicator and aborts it, also when adopted (the one case
  /// kvtier aborts the engine's: the caller asked for it); later calls fail.
  void abort_now(const std::string& why) {
    if (!failed()) record_first("aborted: " + why, kvtier::errc::backend_error);
    if (comm_ && !aborted_) ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
  }

  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  /// False for an adopted communicator (the engine owns it and its stream).
  bool owned() const noexcept { return owned_; }
  cudaStream_t stream() const noexcept { return stream_; }
  ncclComm_t native() const noexcept { return comm_; }
  /// True after a failure made the communicator unusable for kvtier (aborted when
  /// owned, or poisoned only when adopted; see nccl_policy::failure_action).
  bool aborted() const noexcept { return aborted_ || poisoned_; }
  /// The first failure, kept whatever follows (every later call reports it).
  std::error_code first_error() const noexcept { return first_error_; }
  const std::string& last_error() const noexcept { return last_error_; }

  std::error_code broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                            kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (root >= size_ || (rank_ == root && send.size() != recv.size()))
      return skipped(invalid("broadcast: bad root or sizes"));
    const void* s = rank_ == root ? static_cast<const void*>(send.data()) : recv.data();
    if (auto ec = mark_begin()) return ec;
    return issue(
        ncclBroadcast(s, recv.data(), recv.size(), ncclUint8, static_cast<int>(root), comm_, stream_),
        "ncclBroadcast", dl);
  }

  std::error_code all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (recv.size() != send.size() * size_)
      return skipped(invalid("all_gather: recv size != size() * send size"));
    if (auto ec = mark_begin()) return ec;
    return issue(ncclAllGather(send.data(), recv.data(), send.size(), ncclUint8, comm_, stream_),
                 "ncclAllGather", dl);
  }

  std::error_code all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, dtype type,
                             reduce_op op, kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (const std::string_view why = all_reduce_args_problem(send.size(), recv.size(), type); !why.empty())
      return skipped(invalid(why));
    const std::size_t bytes = recv.size();
    const std::size_t count = bytes / dtype_size(type);
    if (scratch_used_ + bytes > reduce_scratch_bytes)
      return skipped(invalid("all_reduce: more than reduce_scratch_bytes"));
    std::byte* host = host_scratch_.data() + scratch_used_;
    std::byte* dev = scratch_.data() + scratch_used_;
    if (group_depth_ > 0) scratch_used_ += (bytes + 15) / 16 * 16;
    if (auto ec = mark_begin()) return ec;
    if (bytes) std::memcpy(host, send.data(), bytes);
    if (auto ec = cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync"))
      return skipped(ec);
    const ncclResult_t r = ncclAllReduce(dev, dev, count, nccl_type(type), nccl_op(op), comm_, stream_);
    if (group_depth_ > 0) {  // results are copied back after group_end
      pending_host_.push_back({dev, host, recv.data(), bytes});
      return r == ncclSuccess || r == ncclInProgress ? std::error_code{} : skipped(nccl(r, "ncclAllReduce"));
    }
    pending_host_.push_back({dev, host, recv.data(), bytes});
    return issue(r, "ncclAllReduce", dl);
  }

  /// A group_start that fails opens no group (do not call group_end for it).
  std::error_code group_start() {
    if (auto ec = usable()) return ec;
    if (auto ec = mark_begin()) return ec;  // before any of the group's work
    if (auto ec = nccl(ncclGroupStart(), "ncclGroupStart")) {
      if (group_depth_ == 0) return skipped(ec);                           // no group open: poison now
      if (!group_error_) group_error_ = ec, group_message_ = last_error_;  // the outer group ends it
      return ec;
    }
    if (group_depth_++ == 0) scratch_used_ = 0;
    return {};
  }

  std::error_code group_end(kvtier::deadline dl) {
    if (group_depth_ == 0) {
      if (failed()) return usable();  // keep the first error
      return invalid("group_end without group_start");
    }
    --group_depth_;
    const ncclResult_t r = ncclGroupEnd();  // always: it balances NCCL's per-thread group depth
    if (failed()) {
      pending_host_.clear();
      return usable();
    }
    if (group_depth_ > 0) {
      if (auto ec = nccl(r, "ncclGroupEnd")) return skipped(ec);
      return {};
    }
    scratch_used_ = 0;
    if (group_error_) {  // an operation of the group never reached NCCL: its peers' will not pair
      const std::error_code ec = std::exchange(group_error_, {});
      pending_host_.clear();
      fail_comm(group_message_ + "; the group was incomplete", ec);
      return ec;
    }
    return issue(r, "ncclGroupEnd", dl);
  }

  /// Device-to-device (or any cudaMemcpyDefault) copy on this rank's stream; waits for it by `dl`.
  std::error_code local_copy(std::span<std::byte> dst, std::span<const std::byte> src, kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (dst.size() != src.size()) return invalid("local_copy: sizes differ");
    if (dst.empty() || dst.data() == src.data()) return {};
    if (auto ec = mark_begin()) return ec;
    if (auto ec = cuda(cudaMemcpyAsync(dst.data(), src.data(), dst.size(), cudaMemcpyDefault, stream_),
                       "cudaMemcpyAsync"))
      return skipped(ec);
    if (group_depth_ > 0) return {};  // ordered before the group's collectives; completes with them
    return wait_stream("local_copy", dl);
  }

 private:
  struct host_copy {
    std::byte* dev;
    std::byte* pinned;
    std::byte* recv;
    std::size_t bytes;
  };

  static ncclDataType_t nccl_type(dtype t) noexcept {
    switch (t) {
      case dtype::i32:
        return ncclInt32;
      case dtype::u32:
        return ncclUint32;
      case dtype::i64:
        return ncclInt64;
      case dtype::u64:
        return ncclUint64;
      case dtype::bytes:
        break;
    }
    return ncclUint8;
  }
  static ncclRedOp_t nccl_op(reduce_op op) noexcept {
    return op == reduce_op::min ? ncclMin : op == reduce_op::max ? ncclMax : ncclSum;
  }

  static constexpr std::size_t event_ring = 32;

  // Scratch for all_reduce and the events every call records.
  std::error_code make_scratch() {
    scratch_ = device_buffer(reduce_scratch_bytes);
    host_scratch_ = pinned_buffer(reduce_scratch_bytes);
    if (!scratch_ || !host_scratch_) {
      last_error_ = "could not allocate the all_reduce scratch";
      return kvtier::errc::backend_error;
    }
    if (auto ec = cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate"))
      return ec;
    if (auto ec = cuda(cudaEventCreateWithFlags(&begin_, cudaEventDisableTiming), "cudaEventCreate"))
      return ec;
    ring_.assign(event_ring, nullptr);
    for (auto& e : ring_)
      if (auto ec = cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate")) return ec;
    return {};
  }

  std::error_code invalid_with(std::error_code ec, std::string why) {
    last_error_ = std::move(why);
    return ec;
  }

  // An enqueue-only call was handed to NCCL: wait until it is enqueued, record its event.
  enqueue_result enqueued(ncclResult_t r, const char* what, kvtier::deadline dl) {
    if (r != ncclSuccess && r != ncclInProgress) return {skipped(nccl(r, what))};
    if (auto ec = wait_enqueued(what, dl)) return {ec};
    cudaEvent_t ev = ring_[ring_next_++ % ring_.size()];
    if (auto ec = cuda(cudaEventRecord(ev, stream_), "cudaEventRecord")) return {skipped(ec)};
    return {{}, ev};
  }

  std::error_code adopt_error(nccl_communicator& failed, std::error_code ec) {
    last_error_ = failed.last_error_;
    return ec;
  }

  std::error_code invalid(std::string_view what) {
    last_error_ = what;
    return kvtier::errc::invalid_argument;
  }
  std::error_code usable() {
    if (failed()) {
      last_error_ = "communicator unusable after an earlier failure: " + first_message_;
      return kvtier::errc::backend_error;
    }
    if (!comm_) {
      last_error_ = "no communicator";
      return kvtier::errc::backend_error;
    }
    // The calling thread may differ from the creator.
    if (auto ec = cuda(cudaSetDevice(device_), "cudaSetDevice")) return skipped(ec);
    return {};
  }

  // This rank failed an operation before NCCL got it, but its peers may issue theirs:
  // as NCCL pairs calls by position, any later call would pair with a skipped one
  // (other sizes, other buffers). Abort now, or inside a group once it is closed.
  std::error_code skipped(std::error_code ec) {
    if (group_depth_ > 0) {
      if (!group_error_) group_error_ = ec, group_message_ = last_error_;
    } else {
      fail_comm(last_error_ + " (the peers may have issued this collective)", ec);
    }
    return ec;
  }
  std::error_code cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return {};
    last_error_ = std::string(what) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();
    return kvtier::errc::backend_error;
  }
  std::error_code nccl(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return {};
    last_error_ = std::string(what) + ": " + ncclGetErrorString(r);
    if (comm_) {
      const char* detail = ncclGetLastError(comm_);
      if (detail && *detail) last_error_ += std::string(" (") + detail + ")";
    }
    return kvtier::errc::backend_error;
  }

  bool failed() const noexcept { return aborted_ || poisoned_; }
  void record_first(const std::string& why, std::error_code ec) {
    first_error_ = ec ? ec : make_error_code(kvtier::errc::backend_error);
    first_message_ = why;
  }

  // A failure: the first one is kept; the NCCL communicator is aborted only when
  // kvtier owns it (nccl_policy::failure_action), else poisoned for kvtier only.
  void fail_comm(const std::string& why, std::error_code ec) {
    if (failed()) {  // a later failure: report the first
      last_error_ = "communicator unusable after an earlier failure: " + first_message_;
      return;
    }
    const auto action = nccl_policy::failure_action(owned_);
    record_first(why + "; " + std::string(nccl_policy::to_string(action)), ec);
    last_error_ = first_message_;
    if (action == nccl_policy::on_failure::abort_communicator) {
      if (comm_) ncclCommAbort(comm_);  // frees the communicator
      comm_ = nullptr;
      aborted_ = true;
    } else {
      poisoned_ = true;  // comm_ stays the engine's; native() still names it
    }
  }

  // The stream reaches this call's operation when begin_ completes (see op_clock).
  // Top level only: a group is marked once, at its outermost group_start.
  std::error_code mark_begin() {
    if (group_depth_ > 0) return {};
    called_ = kvtier::clock::now();
    if (auto ec = cuda(cudaEventRecord(begin_, stream_), "cudaEventRecord")) return skipped(ec);
    return {};
  }

  // An asynchronous NCCL error of this communicator, reported (and failed on) once seen.
  std::error_code async_error(const char* what) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess || state == ncclInProgress) return {};
    auto ec = nccl(state, what);
    fail_comm(last_error_, ec);
    return ec;
  }

  // Short collectives finish in microseconds: yield first, then sleep so a long wait costs no CPU.
  static void pause(unsigned i) {
    if (i < 2000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  // Polls the non-blocking communicator until the last call was enqueued.
  std::error_code wait_enqueued(const char* what, kvtier::deadline dl) {
    for (unsigned i = 0;; ++i) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) {
        auto ec = nccl(r, "ncclCommGetAsyncError");
        fail_comm(last_error_, ec);
        return ec;
      }
      if (state == ncclSuccess) return {};
      if (state != ncclInProgress) {
        auto ec = nccl(state, what);
        fail_comm(last_error_, ec);
        return ec;
      }
      if (kvtier::expired(dl)) {
        fail_comm(std::string(what) + ": deadline passed before NCCL enqueued it", kvtier::errc::timeout);
        return kvtier::errc::timeout;
      }
      pause(i);
    }
  }

  // Records this call's event and polls it until this rank's work finished, failed
  // or its deadline passed (an event, not the stream: an adopted stream carries the
  // engine's work too). On an adopted stream the budget starts when begin_ (recorded
  // before the operation) completed; see nccl_policy::op_clock.
  std::error_code wait_stream(const char* what, kvtier::deadline dl) {
    if (auto ec = cuda(cudaEventRecord(done_, stream_), "cudaEventRecord")) {
      fail_comm(last_error_, ec);
      return ec;
    }
    const auto clk = nccl_policy::op_clock::make(owned_, called_, dl, max_queue_wait_);
    bool started = !clk.from_start;
    kvtier::deadline limit = started ? dl : clk.queue_limit();
    for (unsigned i = 0;; ++i) {
      if (!started) {
        const cudaError_t b = cudaEventQuery(begin_);
        if (b == cudaSuccess) {
          started = true;
          limit = clk.op_deadline(kvtier::clock::now());
        } else if (b != cudaErrorNotReady) {
          auto ec = cuda(b, what);
          fail_comm(last_error_, ec);
          return ec;
        }
      }
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return {};
      if (q != cudaErrorNotReady) {
        auto ec = cuda(q, what);
        fail_comm(last_error_, ec);
        return ec;
      }
      if (auto ec = async_error(what)) return ec;
      if (kvtier::expired(limit)) {
        fail_comm(std::string(what) +
                      (started ? ": deadline passed (peers missing or calls mismatched)"
                               : ": the engine's stream did not reach the operation within max_queue_wait "
                                 "past the deadline"),
                  kvtier::errc::timeout);
        return kvtier::errc::timeout;
      }
      pause(i);
    }
  }

  // A top-level operation was handed to NCCL: wait until it is enqueued and done,
  // then deliver all_reduce results to their host buffers.
  std::error_code issue(ncclResult_t r, const char* what, kvtier::deadline dl) {
    if (r != ncclSuccess && r != ncclInProgress) {
      if (group_depth_ == 0) pending_host_.clear();  // a group's are dropped when it ends
      return skipped(nccl(r, what));
    }
    if (group_depth_ > 0) return {};
    if (auto ec = wait_enqueued(what, dl)) {
      pending_host_.clear();
      return ec;
    }
    for (const auto& h : pending_host_)
      if (auto ec = cuda(cudaMemcpyAsync(h.pinned, h.dev, h.bytes, cudaMemcpyDeviceToHost, stream_),
                         "cudaMemcpyAsync")) {
        pending_host_.clear();
        return skipped(ec);  // the collective ran: abort so its in-flight copies cannot race the next call
      }
    auto ec = wait_stream(what, dl);
    if (!ec)
      for (const auto& h : pending_host_) std::memcpy(h.recv, h.pinned, h.bytes);
    pending_host_.clear();
    return ec;
  }

  void release() noexcept {
    if (done_) cudaEventDestroy(done_);
    done_ = nullptr;
    if (begin_) cudaEventDestroy(begin_);
    begin_ = nullptr;
    for (auto& e : ring_)
      if (e) cudaEventDestroy(e);
    ring_.clear();
    if (!owned_) {  // the engine's communicator and stream: not ours to end
      comm_ = nullptr;
      stream_ = nullptr;
      return;
    }
    if (comm_ && !aborted_) {
      // Finalize flushes outstanding work; bounded so a dead peer cannot hang the destructor.
      ncclResult_t state = ncclCommFinalize(comm_);
      const auto dl = kvtier::deadline_after(std::chrono::seconds(5));
      for (unsigned i = 0; state == ncclSuccess || state == ncclInProgress; ++i) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
        if (state != ncclInProgress || kvtier::expired(dl)) break;
        pause(i);
      }
      if (state == ncclSuccess)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    comm_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  rank_t rank_ = 0, size_ = 0;
  int device_ = 0;
  bool owned_ = true;  // false after adopt(): never finalize/destroy/abort comm_ or stream_
  std::chrono::milliseconds max_queue_wait_{10'000};
  cudaEvent_t done_ = nullptr;   // recorded after each host-waiting call's work
  cudaEvent_t begin_ = nullptr;  // recorded before each host-waiting call's work
  kvtier::clock::time_point called_{};
  bool poisoned_ = false;  // adopted and failed: kvtier no longer uses comm_
  std::error_code first_error_;
  std::string first_message_;
  std::vector<cudaEvent_t> ring_;  // handed out by the enqueue-only calls
  std::size_t ring_next_ = 0;
  bool aborted_ = false;
  std::uint32_t group_depth_ = 0;
  std::error_code group_error_;  // first local failure inside the open group
  std::string group_message_;
  device_buffer scratch_;
  pinned_buffer host_scratch_;
  std::size_t scratch_used_ = 0;
  std::vector<host_copy> pending_host_;
  std::string last_error_;
};

}  // namespace kvtier::comm
