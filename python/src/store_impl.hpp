// python/src/store_impl.hpp: the stores behind kvtier.Store, type-erased so that Python can
// compose them (a TieredStore over any two, a RendezvousStore over any list), with close().
//
// Every call holds a shared lock for its whole duration (the GIL released); close() takes the
// lock exclusively, so it waits for the calls in flight (each bounded by its deadline), then
// destroys the C++ store. A call on a closed store returns errc::shutdown.
//
//   auto s = std::make_shared<kvtier_py::owned_store<kvtier::memory_store>>("MemoryStore", 1 << 20);
//   s->get(keys, dst, status, dl);   // errc::shutdown after s->close()
#pragma once

#include <atomic>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "kvtier/chunk_status.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"

namespace kvtier_py {

class store_impl {
 public:
  explicit store_impl(std::string kind) : kind_(std::move(kind)) {}
  virtual ~store_impl() = default;
  store_impl(const store_impl&) = delete;
  store_impl& operator=(const store_impl&) = delete;

  std::error_code exists(std::span<const kvtier::chunk_key> keys, std::span<kvtier::chunk_status> status,
                         kvtier::deadline dl) {
    std::shared_lock lock(mu_);
    if (closed_) return closed(status);
    return do_exists(keys, status, dl);
  }
  /// `stored_bytes` (empty, or one entry per key): where the store can tell, the payload length of
  /// each key stored with another length than dst[i] (reports_stored_bytes); other entries untouched.
  std::error_code get(std::span<const kvtier::chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<kvtier::chunk_status> status, kvtier::deadline dl,
                      std::span<std::size_t> stored_bytes = {}) {
    std::shared_lock lock(mu_);
    if (closed_) return closed(status);
    return do_get(keys, dst, status, dl, stored_bytes);
  }
  std::error_code put(std::span<const kvtier::chunk_key> keys,
                      std::span<const std::span<const std::byte>> src, std::span<kvtier::chunk_status> status,
                      kvtier::deadline dl) {
    std::shared_lock lock(mu_);
    if (closed_) return closed(status);
    return do_put(keys, src, status, dl);
  }

  /// Waits for the calls in flight, then releases the store (connections closed). Idempotent.
  void close() {
    std::unique_lock lock(mu_);
    if (closed_) return;
    closed_ = true;
    do_close();
  }
  bool is_closed() const noexcept { return closed_; }
  const std::string& kind() const noexcept { return kind_; }
  /// The server this store talks to ("host:port/db", no credentials), as rendezvous hashing names
  /// an instance; "" for a store with no single server (memory, cluster, composed stores).
  virtual std::string identity() const { return {}; }

  /// The store's last error text ("" if none); says so once closed.
  std::string last_error() const {
    std::shared_lock lock(mu_);
    if (closed_) return kind_ + " is closed";
    return do_last_error();
  }

  /// Runs `f` on the open store under the shared lock; false when closed.
  template <class F>
  bool with_open(F&& f) const {
    std::shared_lock lock(mu_);
    if (closed_) return false;
    f();
    return true;
  }

 protected:
  virtual std::error_code do_exists(std::span<const kvtier::chunk_key>, std::span<kvtier::chunk_status>,
                                    kvtier::deadline) = 0;
  virtual std::error_code do_get(std::span<const kvtier::chunk_key>, std::span<const std::span<std::byte>>,
                                 std::span<kvtier::chunk_status>, kvtier::deadline,
                                 std::span<std::size_t>) = 0;
  virtual std::error_code do_put(std::span<const kvtier::chunk_key>,
                                 std::span<const std::span<const std::byte>>, std::span<kvtier::chunk_status>,
                                 kvtier::deadline) = 0;
  virtual std::string do_last_error() const { return {}; }
  virtual void do_close() = 0;

 private:
  static std::error_code closed(std::span<kvtier::chunk_status> status) {
    for (auto& s : status) s = kvtier::chunk_status::error;
    return make_error_code(kvtier::errc::shutdown);
  }

  std::string kind_;
  mutable std::shared_mutex mu_;
  std::atomic<bool> closed_{false};
};

/// A chunk_store over a store_impl shared with Python (what TieredStore and RendezvousStore hold).
struct store_ref {
  std::shared_ptr<store_impl> s;
  std::error_code exists(std::span<const kvtier::chunk_key> k, std::span<kvtier::chunk_status> st,
                         kvtier::deadline dl) {
    return s->exists(k, st, dl);
  }
  std::error_code get(std::span<const kvtier::chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<kvtier::chunk_status> st, kvtier::deadline dl) {
    return s->get(k, d, st, dl);
  }
  std::error_code put(std::span<const kvtier::chunk_key> k, std::span<const std::span<const std::byte>> d,
                      std::span<kvtier::chunk_status> st, kvtier::deadline dl) {
    return s->put(k, d, st, dl);
  }
};

/// True for a store whose get() takes a fifth argument, stored_bytes (memory_store, remote_store,
/// cluster_store: kvtier's get with stored_bytes); the composed ones (tiered, rendezvous) do not.
template <class S>
inline constexpr bool reports_stored_bytes = false;

/// A store_impl owning a C++ store `S` (built in place), destroyed by close().
template <class S>
class owned_store : public store_impl {
 public:
  template <class... Args>
  explicit owned_store(std::string kind, Args&&... args)
      : store_impl(std::move(kind)), store_(std::make_unique<S>(std::forward<Args>(args)...)) {}

  /// The store; only under with_open() (null once closed).
  S& store() const noexcept { return *store_; }

 protected:
  std::error_code do_exists(std::span<const kvtier::chunk_key> k, std::span<kvtier::chunk_status> st,
                            kvtier::deadline dl) override {
    return store_->exists(k, st, dl);
  }
  std::error_code do_get(std::span<const kvtier::chunk_key> k, std::span<const std::span<std::byte>> d,
                         std::span<kvtier::chunk_status> st, kvtier::deadline dl,
                         std::span<std::size_t> stored_bytes) override {
    if constexpr (reports_stored_bytes<S>)
      return store_->get(k, d, st, dl, stored_bytes);
    else
      return store_->get(k, d, st, dl);
  }
  std::error_code do_put(std::span<const kvtier::chunk_key> k, std::span<const std::span<const std::byte>> d,
                         std::span<kvtier::chunk_status> st, kvtier::deadline dl) override {
    return store_->put(k, d, st, dl);
  }
  std::string do_last_error() const override {
    if constexpr (requires(const S& s) { s.last_error(); })
      return store_->last_error();
    else
      return {};
  }
  void do_close() override { store_.reset(); }

 public:
  std::string identity() const override {
    std::string id;
    if constexpr (requires(const S& s) { s.identity(); }) with_open([&] { id = store_->identity(); });
    return id;
  }

 private:
  std::unique_ptr<S> store_;
};

}  // namespace kvtier_py
