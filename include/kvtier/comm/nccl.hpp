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
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/comm/communicator.hpp"

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

/// One rank's NCCL communicator; models kvtier::comm::communicator.
class nccl_communicator {
 public:
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
      aborted_ = std::exchange(o.aborted_, false);
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
    c.scratch_ = device_buffer(reduce_scratch_bytes);
    c.host_scratch_ = pinned_buffer(reduce_scratch_bytes);
    if (!c.scratch_ || !c.host_scratch_) {
      c.last_error_ = "could not allocate the all_reduce scratch";
      return out.adopt_error(c, kvtier::errc::backend_error);
    }
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

  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  ncclComm_t native() const noexcept { return comm_; }
  /// True after a timeout or asynchronous error aborted the communicator.
  bool aborted() const noexcept { return aborted_; }
  const std::string& last_error() const noexcept { return last_error_; }

  std::error_code broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                            kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (root >= size_ || (rank_ == root && send.size() != recv.size()))
      return skipped(invalid("broadcast: bad root or sizes"));
    const void* s = rank_ == root ? static_cast<const void*>(send.data()) : recv.data();
    return issue(
        ncclBroadcast(s, recv.data(), recv.size(), ncclUint8, static_cast<int>(root), comm_, stream_),
        "ncclBroadcast", dl);
  }

  std::error_code all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (recv.size() != send.size() * size_)
      return skipped(invalid("all_gather: recv size != size() * send size"));
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

  std::error_code group_start() {
    if (auto ec = usable()) return ec;
    if (group_depth_++ == 0) scratch_used_ = 0;
    if (auto ec = nccl(ncclGroupStart(), "ncclGroupStart")) return skipped(ec);
    return {};
  }

  std::error_code group_end(kvtier::deadline dl) {
    if (group_depth_ == 0) return invalid("group_end without group_start");
    --group_depth_;
    const ncclResult_t r = ncclGroupEnd();  // always: it balances NCCL's per-thread group depth
    if (aborted_) {
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
      abort(group_message_ + "; the group was incomplete, communicator aborted");
      return ec;
    }
    return issue(r, "ncclGroupEnd", dl);
  }

  /// Device-to-device (or any cudaMemcpyDefault) copy on this rank's stream; waits for it by `dl`.
  std::error_code local_copy(std::span<std::byte> dst, std::span<const std::byte> src, kvtier::deadline dl) {
    if (auto ec = usable()) return ec;
    if (dst.size() != src.size()) return invalid("local_copy: sizes differ");
    if (dst.empty() || dst.data() == src.data()) return {};
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

  std::error_code adopt_error(nccl_communicator& failed, std::error_code ec) {
    last_error_ = failed.last_error_;
    return ec;
  }

  std::error_code invalid(std::string_view what) {
    last_error_ = what;
    return kvtier::errc::invalid_argument;
  }
  std::error_code usable() {
    if (!comm_ || aborted_) {
      last_error_ =
          aborted_ ? "communicator was aborted after an earlier timeout or error" : "no communicator";
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
      abort(last_error_ + "; communicator aborted (the peers may have issued this collective)");
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

  void abort(std::string why) {
    last_error_ = std::move(why);
    if (comm_ && !aborted_) ncclCommAbort(comm_);  // frees the communicator
    comm_ = nullptr;
    aborted_ = true;
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
        abort(last_error_);
        return ec;
      }
      if (state == ncclSuccess) return {};
      if (state != ncclInProgress) {
        auto ec = nccl(state, what);
        abort(last_error_);
        return ec;
      }
      if (kvtier::expired(dl)) {
        abort(std::string(what) + ": deadline passed before NCCL enqueued it; communicator aborted");
        return kvtier::errc::timeout;
      }
      pause(i);
    }
  }

  // Polls the stream until this rank's work finished, failed or `dl` passed.
  std::error_code wait_stream(const char* what, kvtier::deadline dl) {
    for (unsigned i = 0;; ++i) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return {};
      if (q != cudaErrorNotReady) {
        auto ec = cuda(q, what);
        abort(last_error_);
        return ec;
      }
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        auto ec = nccl(state, what);
        abort(last_error_);
        return ec;
      }
      if (kvtier::expired(dl)) {
        abort(std::string(what) +
              ": deadline passed (peers missing or calls mismatched); communicator aborted");
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
