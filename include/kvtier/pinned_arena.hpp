// kvtier/pinned_arena.hpp: one large host region carved into equal chunk-sized slots, for the
// staging buffers of loads and the values of the L1 store.
//
// Page-locking memory is slow and the number of registrations is limited, so the arena makes
// exactly one allocation (or one registration) for its whole life and hands out slots of it:
// never one allocation per value. Where the region comes from is a host_region_source:
//   - aligned_host_source() (here): an anonymous mmap, page aligned, optionally bound to a NUMA
//     node with mbind(2) (a raw system call: no libnuma) and pre-faulted there;
//   - kvtier/cuda/cuda_host_memory.hpp (target kvtier::cuda): cudaHostAlloc of mapped, portable
//     pinned memory, or cudaHostRegister of the same mmap, so devices copy from it at full speed.
//
// Exhaustion never crashes: try_acquire() gives errc::resource_exhausted at once, acquire(dl)
// waits for a slot until the deadline and then gives errc::timeout. The allocator() view lets a
// basic_memory_store keep its values in slots (a value larger than a slot, or no free slot, is a
// put the store reports as error, never an abort).
//
//   std::error_code ec;
//   std::string why;
//   auto arena = kvtier::pinned_arena::create({.slot_bytes = 12'400'000, .slots = 64}, ec, &why);
//   if (!arena) return ec;                                 // why says what was wrong
//   auto buf = arena->acquire(kvtier::deadline_after(50ms), ec);   // a slot, or timeout
//   queue.submit(..., buf.bytes());                        // a load lands in pinned memory
//   kvtier::basic_memory_store<kvtier::pinned_arena::allocator> l1(48 * 12'400'000, arena->get_allocator());
#pragma once

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"

namespace kvtier {

/// Where an arena's one region comes from and how it goes back. `allocate` returns the region
/// (at least page aligned) or an error code, with a sentence in *why; `release` undoes it.
struct host_region_source {
  const char* name = "";
  std::error_code (*allocate)(void* ctx, std::size_t bytes, int numa_node, std::byte** out,
                              std::string* why) = nullptr;
  void (*release)(void* ctx, std::byte* p, std::size_t bytes) noexcept = nullptr;
  void* ctx = nullptr;
  bool device_mapped = false;  ///< slots are mapped into the device address space (cudaHostAllocMapped)
};

namespace detail {

inline std::error_code region_fail(errc e, std::string* why, std::string text) {
  if (why) *why = std::move(text);
  return make_error_code(e);
}

/// An anonymous private mapping of `bytes`, bound to `numa_node` (if >= 0) and pre-faulted.
inline std::error_code mmap_region(std::size_t bytes, int numa_node, std::byte** out, std::string* why) {
  constexpr int max_nodes = 1024;
  if (numa_node >= max_nodes)
    return region_fail(errc::invalid_argument, why,
                       "numa_node " + std::to_string(numa_node) + " is not below 1024");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return region_fail(errc::backend_error, why,
                       "mmap of " + std::to_string(bytes) + " bytes failed: " + std::strerror(errno));
  if (numa_node >= 0) {
#ifdef SYS_mbind
    constexpr unsigned long mpol_bind = 2;  // MPOL_BIND from <linux/mempolicy.h>
    unsigned long mask[max_nodes / (8 * sizeof(unsigned long))] = {};
    mask[numa_node / (8 * sizeof(unsigned long))] = 1ul << (numa_node % (8 * sizeof(unsigned long)));
    if (::syscall(SYS_mbind, p, bytes, mpol_bind, mask, static_cast<unsigned long>(max_nodes + 1), 0u) != 0) {
      const int e = errno;
      ::munmap(p, bytes);
      return region_fail(errc::backend_error, why,
                         "mbind to NUMA node " + std::to_string(numa_node) + " failed: " + std::strerror(e));
    }
#else
    ::munmap(p, bytes);
    return region_fail(errc::invalid_argument, why, "numa_node is set but this system has no mbind");
#endif
  }
  std::memset(p, 0, bytes);  // fault every page in now (on the bound node), not on the first load
  *out = static_cast<std::byte*>(p);
  return {};
}

inline void munmap_region(std::byte* p, std::size_t bytes) noexcept { ::munmap(p, bytes); }

}  // namespace detail

/// The CPU fallback: page-aligned anonymous memory, optionally NUMA-bound (not page-locked).
inline host_region_source aligned_host_source() noexcept {
  host_region_source s;
  s.name = "aligned host memory (mmap)";
  s.allocate = [](void*, std::size_t bytes, int node, std::byte** out, std::string* why) {
    return detail::mmap_region(bytes, node, out, why);
  };
  s.release = [](void*, std::byte* p, std::size_t bytes) noexcept { detail::munmap_region(p, bytes); };
  return s;
}

/// One region, equal slots, a free list. Thread-safe. Not movable: slots and allocators point at it.
class pinned_arena {
 public:
  struct options {
    std::size_t slot_bytes = 0;    ///< usable bytes per slot (e.g. one chunk's value)
    std::size_t slots = 0;         ///< number of slots
    int numa_node = -1;            ///< bind the region to this node; -1 = no binding
    std::size_t alignment = 4096;  ///< slot start alignment (a power of two, at most 4096)
  };

  /// Counts since creation.
  struct stats_type {
    std::uint64_t acquired = 0;   ///< slots handed out
    std::uint64_t exhausted = 0;  ///< try_acquire / allocator calls that found no free slot
    std::uint64_t waited = 0;     ///< acquire calls that had to wait
    std::uint64_t timeouts = 0;   ///< acquire calls that reached their deadline without a slot
    std::size_t in_use = 0, peak_in_use = 0;
  };

  /// A slot held by its owner until destroyed or released. Move-only.
  class slot {
   public:
    slot() = default;
    slot(slot&& o) noexcept : arena_(std::exchange(o.arena_, nullptr)), index_(o.index_) {}
    slot& operator=(slot&& o) noexcept {
      if (this != &o) {
        release();
        arena_ = std::exchange(o.arena_, nullptr);
        index_ = o.index_;
      }
      return *this;
    }
    ~slot() { release(); }
    explicit operator bool() const noexcept { return arena_ != nullptr; }
    /// The slot's slot_bytes() bytes (empty for an empty slot).
    std::span<std::byte> bytes() const noexcept {
      return arena_ ? std::span<std::byte>(arena_->slot_data(index_), arena_->slot_bytes())
                    : std::span<std::byte>{};
    }
    std::size_t index() const noexcept { return index_; }
    /// Gives the slot back now.
    void release() noexcept {
      if (arena_) std::exchange(arena_, nullptr)->put_back(index_);
    }

   private:
    friend class pinned_arena;
    slot(pinned_arena* a, std::size_t i) noexcept : arena_(a), index_(i) {}
    pinned_arena* arena_ = nullptr;
    std::size_t index_ = 0;
  };

  /// A standard allocator of std::byte over the arena's slots, for basic_memory_store: each
  /// allocate(n) takes one slot (n <= slot_bytes), without waiting; none free or n too large
  /// throws std::bad_alloc. The arena must outlive every copy.
  class allocator {
   public:
    using value_type = std::byte;
    explicit allocator(pinned_arena& a) noexcept : arena_(&a) {}
    std::byte* allocate(std::size_t n) {
      if (n > arena_->slot_bytes()) throw std::bad_alloc();
      std::size_t i = 0;
      if (!arena_->take_now(i)) throw std::bad_alloc();
      return arena_->slot_data(i);
    }
    void deallocate(std::byte* p, std::size_t) noexcept { arena_->put_back(arena_->slot_of(p)); }
    friend bool operator==(const allocator& a, const allocator& b) noexcept { return a.arena_ == b.arena_; }

   private:
    pinned_arena* arena_;
  };

  /// An arena of opt.slots slots of opt.slot_bytes, from `source`; null and an error (with a
  /// sentence in *why) when the options are unusable or the region could not be had.
  static std::unique_ptr<pinned_arena> create(const options& opt, std::error_code& ec,
                                              std::string* why = nullptr,
                                              host_region_source source = aligned_host_source()) {
    ec = {};
    auto invalid = [&](std::string text) {
      ec = detail::region_fail(errc::invalid_argument, why, "pinned_arena: " + std::move(text));
      return nullptr;
    };
    if (opt.slot_bytes == 0) return invalid("slot_bytes must be positive");
    if (opt.slots == 0) return invalid("slots must be positive");
    if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)) != 0 || opt.alignment > 4096)
      return invalid("alignment " + std::to_string(opt.alignment) + " is not a power of two up to 4096");
    if (opt.slot_bytes > SIZE_MAX / 2) return invalid("slot_bytes is too large");
    const std::size_t stride = (opt.slot_bytes + opt.alignment - 1) & ~(opt.alignment - 1);
    if (opt.slots > SIZE_MAX / 2 / stride) return invalid("slots * slot_bytes overflows");
    const std::size_t page = 4096, bytes = (opt.slots * stride + page - 1) & ~(page - 1);
    std::byte* base = nullptr;
    std::string inner;
    if ((ec = source.allocate(source.ctx, bytes, opt.numa_node, &base, &inner))) {
      if (why) *why = std::string("pinned_arena: ") + source.name + ": " + inner;
      return nullptr;
    }
    return std::unique_ptr<pinned_arena>(new pinned_arena(opt, stride, bytes, base, source));
  }

  pinned_arena(const pinned_arena&) = delete;
  pinned_arena& operator=(const pinned_arena&) = delete;
  /// Releases the region. Every slot must have been given back (a held slot would dangle).
  ~pinned_arena() { source_.release(source_.ctx, base_, region_bytes_); }

  /// A free slot now, or an empty slot and errc::resource_exhausted.
  slot try_acquire(std::error_code& ec) {
    std::size_t i = 0;
    if (!take_now(i)) {
      ec = make_error_code(errc::resource_exhausted);
      return {};
    }
    ec = {};
    return slot(this, i);
  }

  /// A free slot, waiting for one until `dl`; past it an empty slot and errc::timeout.
  slot acquire(deadline dl, std::error_code& ec) {
    std::unique_lock lock(mu_);
    if (free_.empty()) {
      ++stats_.waited;
      auto some = [this] { return !free_.empty(); };
      if (dl == no_deadline)
        cv_.wait(lock, some);
      else if (!cv_.wait_until(lock, dl, some)) {
        ++stats_.timeouts;
        ec = make_error_code(errc::timeout);
        return {};
      }
    }
    ec = {};
    return slot(this, take_locked());
  }

  allocator get_allocator() noexcept { return allocator(*this); }

  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  std::size_t slot_count() const noexcept { return slots_; }
  /// Distance between slot starts (slot_bytes rounded up to the alignment).
  std::size_t slot_stride() const noexcept { return stride_; }
  /// The one region: slot i starts at region().data() + i * slot_stride().
  std::span<std::byte> region() const noexcept { return {base_, region_bytes_}; }
  bool device_mapped() const noexcept { return source_.device_mapped; }
  const char* source_name() const noexcept { return source_.name; }
  std::size_t free_slots() const {
    std::lock_guard lock(mu_);
    return free_.size();
  }
  stats_type stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  /// True when p points into a slot of this arena.
  bool contains(const void* p) const noexcept {
    auto* b = static_cast<const std::byte*>(p);
    return b >= base_ && b < base_ + slots_ * stride_;
  }

 private:
  pinned_arena(const options& opt, std::size_t stride, std::size_t bytes, std::byte* base,
               host_region_source src)
      : slot_bytes_(opt.slot_bytes),
        slots_(opt.slots),
        stride_(stride),
        region_bytes_(bytes),
        base_(base),
        source_(src) {
    free_.reserve(slots_);
    for (std::size_t i = slots_; i > 0; --i) free_.push_back(i - 1);  // slot 0 handed out first
  }

  std::byte* slot_data(std::size_t i) const noexcept { return base_ + i * stride_; }
  std::size_t slot_of(const std::byte* p) const noexcept {
    return static_cast<std::size_t>(p - base_) / stride_;
  }

  std::size_t take_locked() {
    const std::size_t i = free_.back();
    free_.pop_back();
    ++stats_.acquired;
    if (++stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    return i;
  }
  bool take_now(std::size_t& i) {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      ++stats_.exhausted;
      return false;
    }
    i = take_locked();
    return true;
  }
  void put_back(std::size_t i) noexcept {
    {
      std::lock_guard lock(mu_);
      free_.push_back(i);  // capacity reserved for every slot: never allocates
      --stats_.in_use;
    }
    cv_.notify_one();
  }

  std::size_t slot_bytes_, slots_, stride_, region_bytes_;
  std::byte* base_;
  host_region_source source_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::size_t> free_;
  stats_type stats_;
};

}  // namespace kvtier
