// kvtier/fetch_queue.hpp: asynchronous loads, lookups, prefetches and write-backs
// (puts) over a chunk store, so a slow server delays only its own request, never
// the engine step.
//
// Worker threads run the store's blocking batched calls with each request's
// deadline. The caller polls (never blocks), waits with a deadline, or registers
// a callback. Every submission completes exactly once, whatever races with it
// (cancel, shutdown, a callback registered after completion). Requests and bytes
// in flight are bounded: over the bound a submission fails at once with
// errc::queue_full, which the caller sees and answers by recomputing.
//
//   kvtier::memory_store l1(8ull << 30);
//   kvtier::fetch_queue q(l1, {.workers = 2});
//   auto layout = kvtier::chunk_layout::owned(owned_starts, end_tokens);
//   auto h = q.submit(req_id, owned_keys, destinations, layout, kvtier::deadline_after(500ms));
//   ... engine steps other requests ...
//   if (std::optional<kvtier::fetch_result> r = q.poll(h))  // empty while pending; never blocks
//     use(r->answer_tokens);                                // done or failed: recompute from there
//
// While a load runs, progress(h) (never blocks) and wait_progress(h, chunks, dl)
// report what has landed so far, after every store call: the keys whose value is
// in its destination and verified, and the loaded prefix so far (fetch_progress).
// With max_batch_chunks = 1 it grows chunk by chunk; it drives pipelined_broadcast:
//
//   auto p = q.wait_progress(h, next_chunks, kvtier::deadline_after(2ms));
//   pb.step(p.answer_tokens, p.complete, request_dl);    // chunks agreed so far move now
//
// Lookup (exists) and prefetch (get into queue-owned staging) report the same
// prefix as kvtier::rank_answer over the layout. A later submit() with the same
// request id takes the prefetched chunks from staging (one memcpy each) instead
// of reading them from the store again.
//
// The request types (request_id, chunk_layout, fetch_state, fetch_result,
// fetch_progress, fetch_handle, fetch_queue_options) are in kvtier/fetch_types.hpp.
//
// A write-back runs the store's put off the caller's thread, with the same
// completion, bounds and cancellation; its result has one status per key
// (chunk_status::stored for each key written):
//
//   auto w = q.put(req_id, keys, sources, kvtier::deadline_after(2s));  // sources: the queue's now
//   ... later: if (auto r = q.poll(w)) { release_sources(); count(r->answer_chunks); }
//
// Destinations (and a put's sources) must stay valid, and must not be reused
// (sources: not changed), until the request has completed (poll()/wait() return
// a value); after that the queue never touches them. A cancelled running request completes only when its
// store call has returned, so reusing buffers after cancel() means waiting for the completion.
//
// Deadlines: kvtier::no_deadline means "no limit" here as everywhere (waits
// without a timeout, never an overflowed one).
//
// Failures never throw out of a worker. A store call that throws completes the
// request as done with errc::store_threw: the keys earlier calls answered keep
// their statuses, the rest are chunk_status::error, and fetch_result::message
// says what it threw ("the store threw: <what()>"). An allocation of the queue's
// own that fails in a worker completes it as failed/backend_error, every key
// chunk_status::error. A failed allocation in submit() before anything was queued may throw
// std::bad_alloc to the caller; once queue bookkeeping starts, it is rolled back
// and the request completes as failed/queue_full. If a worker thread cannot be
// started the constructor joins the ones it started and rethrows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/cv_wait.hpp"
#include "kvtier/detail/queue_request.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/fetch_types.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier {

template <chunk_store Store>
class fetch_queue {
  using req_ptr = std::shared_ptr<detail::queue_request>;
  using detail_kind = detail::queue_kind;
  using where = detail::queue_where;
  using access = detail::fetch_handle_access;

 public:
  /// Starts opt.workers threads. The store is held by reference and must outlive the queue.
  /// Throws what thread creation throws (std::system_error) after joining the
  /// workers it did start.
  explicit fetch_queue(Store& store, fetch_queue_options opt = {}) : store_(store), opt_(std::move(opt)) {
    if (opt_.workers == 0) opt_.workers = 1;
    try {
      workers_.reserve(opt_.workers);
      for (std::size_t i = 0; i < opt_.workers; ++i) {
        inject(fetch_queue_fault::start_thread);
        workers_.emplace_back([this] { work(); });
      }
    } catch (...) {
      shutdown();  // destroying a joinable std::thread would terminate the process
      throw;
    }
  }
  fetch_queue(const fetch_queue&) = delete;
  fetch_queue& operator=(const fetch_queue&) = delete;
  ~fetch_queue() { shutdown(); }

  /// Loads keys[i] into dst[i]. If a prefetch with the same id is held, its
  /// staged hits are copied from there and only the rest is read.
  fetch_handle submit(request_id id, std::span<const chunk_key> keys,
                      std::span<const std::span<std::byte>> dst, chunk_layout layout, deadline dl) {
    auto r = make(detail_kind::load, id, keys, std::move(layout), dl);
    if (dst.size() != keys.size()) return reject(r, errc::invalid_argument);
    r->dst.assign(dst.begin(), dst.end());
    if (!count_bytes(*r, dst)) return reject(r, errc::too_large);
    return enqueue(std::move(r));
  }

  /// Asks the store which keys exist; answer_tokens is the rank answer.
  fetch_handle lookup(request_id id, std::span<const chunk_key> keys, chunk_layout layout, deadline dl) {
    return enqueue(make(detail_kind::lookup, id, keys, std::move(layout), dl));
  }

  /// Writes src[i] under keys[i] (a write-back), off the caller's thread. The sources
  /// belong to the queue until the request completes: they must stay valid and
  /// unchanged. They count against bytes in flight, so a put over the bound is
  /// too_large and one that does not fit now is queue_full, like a load.
  /// The result: status[i] per key (stored, or timeout/error: "unknown", a later get
  /// verifies it; see chunk_store.hpp), answer_chunks the leading stored keys, and
  /// answer_tokens 0 (a put has no layout). A put cancelled while running reports
  /// every key cancelled, though keys of batches that ran may be stored.
  ///
  ///   auto w = q.put(id, new_keys, new_values, kvtier::deadline_after(2s));
  ///   q.on_complete(w, [&](const kvtier::fetch_result&) { free_pages(id); });  // sources free now
  fetch_handle put(request_id id, std::span<const chunk_key> keys,
                   std::span<const std::span<const std::byte>> src, deadline dl) {
    auto r = make(detail_kind::put, id, keys, chunk_layout{}, dl);
    if (src.size() != keys.size()) return reject(r, errc::invalid_argument);
    r->src.assign(src.begin(), src.end());
    if (!count_bytes(*r, src)) return reject(r, errc::too_large);
    return enqueue(std::move(r));
  }

  /// Reads the keys (chunk_bytes each) into queue-owned staging and keeps them
  /// for a later submit() with the same id; answer_tokens is the rank answer over
  /// what was staged, so a prefetch doubles as the lookup. A held prefetch counts
  /// against bytes in flight until a load consumes it or release_prefetch(id); one
  /// that completes failed (cancelled, shut down) is dropped at once.
  fetch_handle prefetch(request_id id, std::span<const chunk_key> keys, std::size_t chunk_bytes,
                        chunk_layout layout, deadline dl) {
    auto r = make(detail_kind::prefetch, id, keys, std::move(layout), dl);
    r->chunk_bytes = chunk_bytes;
    // A wrapped product would allocate too little staging for the spans cut from it.
    if (!keys.empty() && chunk_bytes > std::numeric_limits<std::size_t>::max() / keys.size())
      return reject(r, errc::too_large);
    r->bytes = chunk_bytes * keys.size();
    if (r->bytes <= opt_.max_bytes_in_flight && r->bytes > 0) {  // allocate outside the queue lock
      try {
        r->staging = std::make_unique_for_overwrite<std::byte[]>(r->bytes);  // no zero-fill
      } catch (const std::bad_alloc&) {
        return reject(r, errc::too_large);
      }
      r->dst.resize(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i)
        r->dst[i] = std::span<std::byte>(r->staging.get() + i * chunk_bytes, chunk_bytes);
    } else if (r->bytes == 0) {
      r->dst.assign(keys.size(), std::span<std::byte>());
    }
    return enqueue(std::move(r));
  }

  /// Drops a held prefetch (no-op if none). A load that already took it keeps it.
  void release_prefetch(request_id id) {
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return;
    it->second->retained = false;
    maybe_release_staging(*it->second);
    held_.erase(it);
  }

  /// Never blocks. Empty while the request is pending; once it has completed,
  /// its result (and the caller owns the destinations again). An invalid handle
  /// gives a failed result (errc::invalid_argument).
  std::optional<fetch_result> poll(const fetch_handle& h) const {
    if (!h.valid()) return failed_result(errc::invalid_argument);
    const auto& r = access::get(h);
    if (!r->completed.load(std::memory_order_acquire)) return std::nullopt;
    return r->result;
  }

  /// Blocks until the request completes (its result) or `dl` passes (empty).
  std::optional<fetch_result> wait(const fetch_handle& h, deadline dl) const {
    if (!h.valid()) return failed_result(errc::invalid_argument);
    auto& r = *access::get(h);
    std::unique_lock lock(r.mu);
    detail::wait_until(r.cv, lock, dl, [&] { return r.completed.load(std::memory_order_acquire); });
    if (!r.completed.load(std::memory_order_acquire)) return std::nullopt;
    return r.result;
  }

  /// Never blocks. What has landed so far (see fetch_progress); once the request has
  /// completed, its result's hits and answer. An invalid handle reports nothing landed.
  fetch_progress progress(const fetch_handle& h) const {
    if (!h.valid()) return {};
    auto& r = *access::get(h);
    std::lock_guard lock(r.mu);
    return detail::queue_progress_locked(r);
  }

  /// Blocks until the first `chunks` keys of the request have landed, the request has
  /// completed, or `dl` passes; returns the progress then (check answer_chunks and complete).
  fetch_progress wait_progress(const fetch_handle& h, std::size_t chunks, deadline dl) const {
    if (!h.valid()) return {};
    auto& r = *access::get(h);
    std::unique_lock lock(r.mu);
    detail::wait_until(r.cv, lock, dl, [&] {
      return r.completed.load(std::memory_order_acquire) || detail::queue_leading_landed(r.landed) >= chunks;
    });
    return detail::queue_progress_locked(r);
  }

  /// Blocks until every key of the request has at least its first `bytes` payload bytes in its
  /// destination and verified (a landed key counts whole; a key shorter than `bytes` counts
  /// once it landed), the request has completed, or `dl` passes; returns the progress then.
  /// With stream_groups, `bytes` = the end of layer group g waits for group g of every key:
  ///
  ///   auto p = q.wait_landed_bytes(h, group_end(g), kvtier::deadline_after(20ms));
  fetch_progress wait_landed_bytes(const fetch_handle& h, std::size_t bytes, deadline dl) const {
    if (!h.valid()) return {};
    auto& r = *access::get(h);
    std::unique_lock lock(r.mu);
    detail::wait_until(r.cv, lock, dl, [&] {
      if (r.completed.load(std::memory_order_acquire)) return true;
      for (std::size_t i = 0; i < r.keys.size(); ++i) {
        const bool landed = i < r.landed.size() && r.landed[i] == chunk_status::hit;
        const std::size_t need = std::min(bytes, detail::queue_key_bytes(r, i));
        if (!landed && !(need > 0 && i < r.landed_bytes.size() && r.landed_bytes[i] >= need)) return false;
      }
      return true;
    });
    return detail::queue_progress_locked(r);
  }

  /// Runs `cb(result)` once the request completes: at once, in this thread, if
  /// it already has (a completion is never lost to a late registration), else in
  /// the completing thread (a worker, or the thread calling cancel/close). One
  /// callback per request; a later one replaces it. Callbacks must be short and
  /// must not call shutdown() or destroy the queue. They should not throw: an
  /// exception reaches the thread that ran the callback (on a worker it ends the
  /// program); close() still completes every other queued request first.
  void on_complete(const fetch_handle& h, std::function<void(const fetch_result&)> cb) {
    if (!h.valid()) return;
    auto& r = *access::get(h);
    {
      std::lock_guard lock(r.mu);
      if (!r.completed.load(std::memory_order_acquire)) {
        r.callback = std::move(cb);
        return;
      }
    }
    cb(r.result);
  }

  /// Cancels. Returns true if the request will complete as failed/cancelled:
  /// at once if it was still queued, else when its running store call returns.
  /// False if it had already completed (or its completion was already decided).
  bool cancel(const fetch_handle& h) {
    if (!h.valid()) return false;
    const req_ptr& r = access::get(h);
    bool was_queued = false;
    {
      std::lock_guard lock(mu_);
      if (r->where == where::queued) {
        r->where = where::detached;  // the worker that pops it skips it
        --queued_;
        gauge_add(&metrics::queue_depth, -1);
        was_queued = true;
      }
    }
    if (was_queued) return finish_failed(r, errc::cancelled);
    std::lock_guard lock(r->mu);
    if (r->claimed) return false;
    r->cancel_requested = true;
    return true;
  }

  /// Stops intake: later submissions fail with errc::shutdown, queued requests
  /// complete at once as failed/shutdown, held prefetches are dropped. Running
  /// requests finish normally (by their deadlines). Does not wait.
  void close() {
    std::vector<req_ptr> drained;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      for (auto& r : pending_)
        if (r->where == where::queued) {
          r->where = where::detached;
          drained.push_back(r);
        }
      gauge_add(&metrics::queue_depth, -static_cast<std::int64_t>(queued_));
      queued_ = 0;
      pending_.clear();
      for (auto& [id, p] : held_) {
        p->retained = false;
        maybe_release_staging(*p);
      }
      held_.clear();
    }
    cv_.notify_all();
    // A throwing callback must not leave the rest of the drained requests pending forever.
    std::exception_ptr thrown;
    for (auto& r : drained) {
      try {
        finish_failed(r, errc::shutdown);
      } catch (...) {
        if (!thrown) thrown = std::current_exception();
      }
    }
    if (thrown) std::rethrow_exception(thrown);
  }

  /// close(), then waits for the running requests and joins the workers.
  void shutdown() {
    close();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
  }

  fetch_queue_stats stats() const {
    std::lock_guard lock(mu_);
    return {queued_, requests_, bytes_, held_.size()};
  }

  Store& store() noexcept { return store_; }

 private:
  static fetch_result failed_result(errc e) noexcept {
    fetch_result res;
    res.state = fetch_state::failed;
    res.ec = make_error_code(e);
    return res;
  }

  // Adds the spans' sizes to r.bytes; false if the sum would pass SIZE_MAX (it would wrap and
  // slip under the bytes-in-flight bound).
  template <class Span>
  static bool count_bytes(detail::queue_request& r, std::span<const Span> spans) noexcept {
    for (const Span& x : spans) {
      if (x.size() > std::numeric_limits<std::size_t>::max() - r.bytes) return false;
      r.bytes += x.size();
    }
    return true;
  }

  void inject(fetch_queue_fault at) const {
    if (opt_.fault_injector) opt_.fault_injector(at);
  }

  void gauge_add(gauge metrics::*g, std::int64_t n) {
    if (opt_.metrics) (opt_.metrics->*g).add(n);
  }

  req_ptr make(detail_kind k, request_id id, std::span<const chunk_key> keys, chunk_layout layout,
               deadline dl) {
    auto r = std::make_shared<detail::queue_request>();
    r->kind = k;
    r->id = id;
    r->keys.assign(keys.begin(), keys.end());
    r->layout = std::move(layout);
    r->dl = dl;
    r->submitted = clock::now();
    return r;
  }

  // A submission that never enters the queue still completes exactly once.
  fetch_handle reject(const req_ptr& r, errc e) {
    r->where = where::detached;
    publish(r, fail_status(*r, e));
    if (opt_.metrics) opt_.metrics->rejected.add();
    return access::make(r);
  }

  fetch_handle enqueue(req_ptr r) {
    if (r->kind != detail_kind::put && r->layout.starts.size() != r->keys.size())
      return reject(r, errc::invalid_argument);
    if (r->bytes > opt_.max_bytes_in_flight) return reject(r, errc::too_large);
    errc refused{};  // decided under the lock; once queued, `r` belongs to the workers too
    {
      std::lock_guard lock(mu_);
      if (closed_) {
        refused = errc::shutdown;
      } else if (requests_ + 1 > opt_.max_requests || r->bytes > opt_.max_bytes_in_flight - bytes_) {
        refused = errc::queue_full;
      } else if (!reserve_slot(r)) {
        refused = errc::queue_full;  // out of memory for the bookkeeping: nothing changed
      } else {
        // Nothing below allocates or throws: the counters never run ahead of the queue.
        ++requests_;
        bytes_ += r->bytes;
        ++queued_;
        if (r->kind == detail_kind::load) adopt_prefetch(*r);
        gauge_add(&metrics::queue_depth, 1);
        gauge_add(&metrics::requests_in_flight, 1);
        gauge_add(&metrics::bytes_in_flight, static_cast<std::int64_t>(r->bytes));
      }
    }
    if (refused != errc{}) return reject(r, refused);
    cv_.notify_one();
    return access::make(std::move(r));
  }

  // Under mu_: the allocating steps of enqueue (the pending_ entry, a prefetch's
  // entry in held_), all or nothing. False if one threw (bad_alloc).
  bool reserve_slot(const req_ptr& r) noexcept {
    try {
      inject(fetch_queue_fault::enqueue);
      pending_.push_back(r);
    } catch (...) {
      return false;
    }
    if (r->kind != detail_kind::prefetch) return true;
    try {
      hold_prefetch(r);
    } catch (...) {
      pending_.pop_back();
      return false;
    }
    return true;
  }

  // Under mu_: a load takes the held prefetch with its id, if any.
  void adopt_prefetch(detail::queue_request& load) {
    auto it = held_.find(load.id);
    if (it == held_.end()) return;
    load.source = it->second;
    load.source->retained = false;
    load.source->consumer_alive = true;
    held_.erase(it);
  }

  // Under mu_: a new prefetch replaces an older one with the same id. Only the
  // map insertion can throw, and then nothing has changed.
  void hold_prefetch(const req_ptr& p) {
    auto [it, inserted] = held_.try_emplace(p->id, p);
    p->staging_accounted = p->bytes;
    p->retained = true;
    if (!inserted) {
      it->second->retained = false;
      maybe_release_staging(*it->second);
      it->second = p;
    }
  }

  // Under mu_: frees a prefetch's staging once nobody can read it any more.
  void maybe_release_staging(detail::queue_request& p) {
    if (p.staging_accounted == 0 || !p.work_finished || p.retained || p.consumer_alive) return;
    bytes_ -= p.staging_accounted;
    gauge_add(&metrics::bytes_in_flight, -static_cast<std::int64_t>(p.staging_accounted));
    p.staging_accounted = 0;
    p.staging.reset();
    p.dst.clear();
  }

  // ---- worker side -------------------------------------------------------------

  void work() {
    for (;;) {
      req_ptr r;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !pending_.empty() || closed_; });
        if (pending_.empty()) return;  // closed and drained
        r = std::move(pending_.front());
        pending_.pop_front();
        if (r->where != where::queued) continue;  // cancelled while queued
        r->where = where::running;
        --queued_;
        gauge_add(&metrics::queue_depth, -1);
      }
      if (opt_.metrics) opt_.metrics->queue_wait.observe(clock::now() - r->submitted);
      run(r);
    }
  }

  void run(const req_ptr& r) {
    std::vector<chunk_status> status;
    std::error_code ec;
    bool cancelled = false;
    bool in_store = false;  // a store call is running (call_store): an exception now is the store's
    try {  // everything that allocates is inside: a bad_alloc fails the request, not the process
      inject(fetch_queue_fault::worker_alloc);
      status.assign(r->keys.size(), chunk_status::error);
      if (cancel_requested(*r)) {
        cancelled = true;
      } else if (expired(r->dl)) {
        detail::store_fill(status, chunk_status::timeout);
        ec = make_error_code(errc::timeout);
      } else {
        std::vector<std::size_t> todo;
        if (r->kind == detail_kind::load && r->source) {
          todo = take_from_prefetch(*r, status);
          std::vector<std::size_t> all(r->keys.size());
          for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
          detail::queue_note_landed(*r, all, status);  // the reused hits have landed
        } else {
          todo.resize(r->keys.size());
          for (std::size_t i = 0; i < todo.size(); ++i) todo[i] = i;
        }
        ec = call_store(*r, todo, status, cancelled, in_store);
      }
    } catch (...) {
      // Whatever threw, the request still completes exactly once. The queue's own allocation
      // failed: nothing a store said is lost. A store threw: the keys of the calls that returned
      // keep their statuses, the throwing call's and later ones stay error (status was filled
      // with error before the first call).
      if (!in_store) {
        finish_failed(r, errc::backend_error);
        return;
      }
      std::string words;
      try {
        words = "the store threw: " + detail::current_exception_words().what;
      } catch (...) {  // out of memory: ec alone says it
      }
      finish(r, std::move(status), make_error_code(errc::store_threw), std::move(words));
      return;
    }
    if (cancelled) {
      finish_failed(r, errc::cancelled);
      return;
    }
    finish(r, std::move(status), ec);
  }

  static bool cancel_requested(detail::queue_request& r) {
    std::lock_guard lock(r.mu);
    return r.cancel_requested;
  }

  // Copies the source prefetch's staged hits; returns the indexes still to read.
  std::vector<std::size_t> take_from_prefetch(detail::queue_request& r, std::span<chunk_status> status) {
    detail::queue_request& p = *r.source;
    {  // FIFO: the prefetch was popped before this load, so it is running or done.
      std::unique_lock lock(p.mu);
      detail::wait_until(p.cv, lock, r.dl, [&] { return p.completed.load(std::memory_order_acquire); });
    }
    std::vector<std::size_t> todo;
    if (!p.completed.load(std::memory_order_acquire)) {
      todo.resize(r.keys.size());  // the load's deadline passed first: call_store marks timeouts
      for (std::size_t i = 0; i < todo.size(); ++i) todo[i] = i;
      return todo;
    }
    const std::vector<chunk_status>& ps = p.result.status;
    std::unordered_map<chunk_key, std::size_t, chunk_key_hash> where_in_p;
    auto find = [&](std::size_t i) -> std::ptrdiff_t {
      if (i < p.keys.size() && p.keys[i] == r.keys[i]) return static_cast<std::ptrdiff_t>(i);
      if (where_in_p.empty())
        for (std::size_t j = 0; j < p.keys.size(); ++j) where_in_p.emplace(p.keys[j], j);
      auto it = where_in_p.find(r.keys[i]);
      return it == where_in_p.end() ? -1 : static_cast<std::ptrdiff_t>(it->second);
    };
    std::uint64_t reused = 0;
    for (std::size_t i = 0; i < r.keys.size(); ++i) {
      const std::ptrdiff_t j = find(i);
      if (j >= 0 && ps.size() == p.keys.size() && ps[j] == chunk_status::hit &&
          p.chunk_bytes == r.dst[i].size() && (p.staging || p.chunk_bytes == 0)) {
        if (p.chunk_bytes) std::memcpy(r.dst[i].data(), p.dst[j].data(), p.chunk_bytes);
        status[i] = chunk_status::hit;
        ++reused;
      } else {
        todo.push_back(i);
      }
    }
    if (reused && opt_.metrics) opt_.metrics->prefetch_reused.add(reused);
    return todo;
  }

  // Runs the store calls for keys `todo` (batched per max_batch_chunks).
  // `in_store` is true while a store call runs (what throws then is the store's).
  std::error_code call_store(detail::queue_request& r, const std::vector<std::size_t>& todo,
                             std::span<chunk_status> status, bool& cancelled, bool& in_store) {
    const std::size_t batch =
        opt_.max_batch_chunks ? opt_.max_batch_chunks : std::max<std::size_t>(todo.size(), 1);
    std::error_code first_ec;
    std::vector<chunk_key> keys;
    std::vector<std::span<std::byte>> dst;
    std::vector<std::span<const std::byte>> src;
    std::vector<chunk_status> st;
    for (std::size_t begin = 0; begin < todo.size(); begin += batch) {
      if (begin > 0 && cancel_requested(r)) {
        cancelled = true;
        return first_ec;
      }
      const std::size_t end = std::min(todo.size(), begin + batch);
      keys.clear();
      dst.clear();
      src.clear();
      for (std::size_t k = begin; k < end; ++k) {
        keys.push_back(r.keys[todo[k]]);
        if (r.kind == detail_kind::put)
          src.push_back(r.src[todo[k]]);
        else if (r.kind != detail_kind::lookup)
          dst.push_back(r.dst[todo[k]]);
      }
      st.assign(keys.size(), chunk_status::error);
      const auto which = std::span<const std::size_t>(todo).subspan(begin, end - begin);
      in_store = true;
      std::error_code ec = r.kind == detail_kind::lookup ? store_.exists(keys, st, r.dl)
                           : r.kind == detail_kind::put  ? store_.put(keys, src, st, r.dl)
                                                         : get(r, keys, dst, st, which);
      in_store = false;
      for (std::size_t k = begin; k < end; ++k) status[todo[k]] = st[k - begin];
      detail::queue_note_landed(r, which, status);
      if (ec && !first_ec) first_ec = ec;
    }
    return first_ec;
  }

  // A load's (or prefetch's) store call: group-major with stream_groups when the store can,
  // publishing each round's verified bytes of the keys `which` as they land.
  std::error_code get(detail::queue_request& r, std::span<const chunk_key> keys,
                      std::span<const std::span<std::byte>> dst, std::span<chunk_status> st,
                      std::span<const std::size_t> which) {
    if constexpr (group_streaming_store<Store>) {
      if (opt_.stream_groups) {
        std::vector<std::size_t> bytes(keys.size());
        const value_format f = store_.format();
        return store_.get_by_group(keys, dst, st, r.dl, [&](std::span<const std::size_t> groups) {
          for (std::size_t k = 0; k < bytes.size(); ++k) bytes[k] = f.groups_end(dst[k].size(), groups[k]);
          detail::queue_note_bytes(r, which, bytes);
        });
      }
    }
    return store_.get(keys, dst, st, r.dl);
  }

  // noexcept: it runs on the failure paths, where a throw would end the process.
  // Keys are cancelled only when the request was (cancel, shutdown); otherwise (refused, or the
  // queue failed: backend_error) error, so no one reads a failure as a cancel.
  static fetch_result fail_status(const detail::queue_request& r, errc e) noexcept {
    fetch_result res = failed_result(e);
    const bool cancelled = e == errc::cancelled || e == errc::shutdown;
    try {
      res.status.assign(r.keys.size(), cancelled ? chunk_status::cancelled : chunk_status::error);
    } catch (...) {  // out of memory: the result stays valid with an empty status vector
    }
    res.answer_tokens = r.layout.starts.empty() ? r.layout.end_tokens : r.layout.starts.front();
    if (r.layout.starts.size() != r.keys.size()) res.answer_tokens = 0;
    return res;
  }

  bool finish_failed(const req_ptr& r, errc e) {
    const claim_result c = claim(*r);
    if (c == claim_result::lost) return false;
    if (c == claim_result::won_cancelled) e = errc::cancelled;
    settle(r, true);
    if (opt_.metrics && e == errc::cancelled) opt_.metrics->cancelled.add();
    publish(r, fail_status(*r, e));
    return true;
  }

  void finish(const req_ptr& r, std::vector<chunk_status> status, std::error_code ec,
              std::string message = {}) {
    const claim_result c = claim(*r);
    if (c == claim_result::lost) return;
    settle(r, c == claim_result::won_cancelled);
    if (c == claim_result::won_cancelled) {
      if (opt_.metrics) opt_.metrics->cancelled.add();
      publish(r, fail_status(*r, errc::cancelled));
      return;
    }
    fetch_result res;
    res.state = fetch_state::done;
    res.ec = ec;
    res.status = std::move(status);
    res.message = std::move(message);
    if (r->kind == detail_kind::put) {
      while (res.answer_chunks < res.status.size() && res.status[res.answer_chunks] == chunk_status::stored)
        ++res.answer_chunks;
    } else {
      const detail::store_hit_view hits{res.status};
      res.answer_tokens =
          rank_answer(std::span<const std::uint64_t>(r->layout.starts), hits, r->layout.end_tokens);
      res.answer_chunks = contiguous_hit_count(hits, res.status.size());
    }
    if (auto* m = opt_.metrics) {
      const auto latency = clock::now() - r->submitted;
      if (r->kind == detail_kind::put) {
        m->puts.add();
        m->put_latency.observe(latency);
        std::uint64_t chunks = 0, b = 0;
        for (std::size_t i = 0; i < res.status.size(); ++i)
          if (res.status[i] == chunk_status::stored) ++chunks, b += r->src[i].size();
        m->chunks_stored.add(chunks);
        m->bytes_stored.add(b);
      } else if (r->kind == detail_kind::load) {
        m->loads.add();
        m->load_latency.observe(latency);
        m->chunks_loaded.add(res.answer_chunks);
        std::uint64_t b = 0;
        for (std::size_t i = 0; i < res.answer_chunks; ++i) b += r->dst[i].size();
        m->bytes_loaded.add(b);
      } else {
        m->lookups.add();
        m->lookup_latency.observe(latency);
      }
      if (r->kind != detail_kind::put) m->chunks_requested.add(res.status.size());
      std::uint64_t corrupt = 0;
      for (chunk_status s : res.status) corrupt += s == chunk_status::corrupt;
      if (corrupt) m->corrupt_values.add(corrupt);
      if (ec == errc::timeout || std::count(res.status.begin(), res.status.end(), chunk_status::timeout))
        m->timeouts.add();
    }
    publish(r, std::move(res));
  }

  enum class claim_result { won, won_cancelled, lost };

  // Decides the one completion: lost if it was already decided; won_cancelled if
  // a cancel was requested first (the completion is then "cancelled").
  static claim_result claim(detail::queue_request& r) {
    std::lock_guard lock(r.mu);
    if (r.claimed) return claim_result::lost;
    r.claimed = true;
    return r.cancel_requested ? claim_result::won_cancelled : claim_result::won;
  }

  // After the claim: give back the slot and bytes BEFORE publishing, so a caller
  // who sees the completion can submit again without a spurious queue_full.
  // A failed prefetch staged nothing: it stops being held, so its staging does not
  // stay counted in flight until a load or release_prefetch() that may never come.
  void settle(const req_ptr& r, bool failed) {
    std::lock_guard lock(mu_);
    if (r->where == where::finished) return;
    r->where = where::finished;
    --requests_;
    const std::size_t own = r->kind == detail_kind::prefetch ? 0 : r->bytes;  // staging settles separately
    bytes_ -= own;
    gauge_add(&metrics::requests_in_flight, -1);
    gauge_add(&metrics::bytes_in_flight, -static_cast<std::int64_t>(own));
    if (r->kind == detail_kind::prefetch) {
      r->work_finished = true;
      if (failed && r->retained) {
        if (auto it = held_.find(r->id); it != held_.end() && it->second == r) held_.erase(it);
        r->retained = false;
      }
      maybe_release_staging(*r);
    }
    if (r->source) {
      r->source->consumer_alive = false;
      maybe_release_staging(*r->source);
    }
  }

  static void publish(const req_ptr& r, fetch_result res) {
    std::function<void(const fetch_result&)> cb;
    {
      std::lock_guard lock(r->mu);
      r->claimed = true;
      r->result = std::move(res);
      r->completed.store(true, std::memory_order_release);
      cb = std::move(r->callback);
    }
    r->cv.notify_all();
    if (cb) cb(r->result);
  }

  Store& store_;
  fetch_queue_options opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<req_ptr> pending_;
  std::unordered_map<request_id, req_ptr> held_;  // prefetches kept for a later load
  std::size_t queued_ = 0, requests_ = 0, bytes_ = 0;
  bool closed_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvtier
