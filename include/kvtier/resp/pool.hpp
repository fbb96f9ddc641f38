// kvtier/resp/pool.hpp: N connections to one server, shared by threads, with a deadline to get one.
//
// A connection runs one batch at a time, so one connection shared by a fetch worker streaming a
// batch of 12 MB GETs and an engine thread asking EXISTS makes the EXISTS wait for the whole
// batch. A pool holds `connections` connections to the same server (opened lazily, on first
// use) and lends one per call. Requests come in two sizes: `large` ones (GET/SET batches that
// move payloads) may use only the connections beyond `reserved_small`; `small` ones (EXISTS,
// PING, a small GET) may use any, the reserved ones first. So a small command never queues
// behind large batches: with every large connection busy, a reserved one is still free for it.
//
//   kvtier::resp::connection_pool<kvtier::resp::asio_connection> pool(opt, {.connections = 4});
//   kvtier::resp::connection_pool<kvtier::resp::asio_connection>::lease l;
//   if (std::error_code ec = pool.acquire(kvtier::resp::request_size::small, dl, l)) return ec;  // timeout
//   ec = l.conn().execute(b, dl);     // the lease gives the connection back when it goes
//   std::vector<decltype(l)> ls;       // or several at once, for a batch spread over them:
//   ec = pool.acquire_up_to(kvtier::resp::request_size::large, 3, dl, ls);   // 1..3 leases
//
// Thread-safe. acquire() waits for a free connection until its deadline (errc::timeout), never
// longer. stats() sums the counters of the connections as of their last release.
//
// A down server trips the pool: when a connection comes back in reconnect backoff (its connect
// failed: refused, wrong password, wrong CA...), acquire() fails at once with that connect error
// until the backoff ends, so no call waits for a server known to be down and the other
// connections do not each pay a connect attempt. down() / down_until() let an engine check:
//
//   if (l2.pool().down()) skip_the_tier();   // e.g. treat every chunk as a miss, no I/O at all
//
// A silent server trips it too (a black hole that accepts and never answers, a SIGSTOPped or
// hung host: the connect succeeds, so the connect backoff never starts), and so does a server
// that hangs up on every fresh connection before any reply (a TLS-only port spoken to in plain
// RESP: each call connects and is closed "before any reply"). After
// pool_options::timeouts_to_trip bad calls in a row (a call that hit its deadline, a connect or
// handshake that got no answer, a fresh connection closed before a byte came back; on any of the
// pool's connections), the server is down for a backoff (silence_backoff_min,
// doubling up to silence_backoff_max): every acquire() fails at once, with errc::timeout after
// timeouts (else the last call's error) and the words ("... 3 calls in a row timed out or failed
// to connect; the last: ..."), so a store's lookup answers at once (recompute from there) and a
// save is skipped, counted in breaker().refusals. No caller's call is the half-open probe: a
// prober thread (started at the trip, gone once the server answers) sends a PING with its own
// deadline (probe_timeout) on a free connection after each backoff; answered, the server is up
// again; not, the pool trips again with the backoff doubled. Calls are refused until a probe is
// answered, so no request ever waits on a silent server after the trip. Any answered call resets
// the count.
//
//   pool_options p{.connections = 4, .timeouts_to_trip = 2};  // 0: never trip on silence
//   if (pool.breaker().down) log(pool.breaker().last_error);
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/deadline.hpp"
#include "kvtier/detail/cv_wait.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/connection.hpp"

namespace kvtier::resp {

/// Size of a pool and how many of its connections only small requests may use.
struct pool_options {
  std::size_t connections = 4;     ///< connections to the server (at least 1)
  std::size_t reserved_small = 1;  ///< of those, kept for small requests (< connections)
  /// Calls in a row that time out or fail to connect before the server counts as down (see the
  /// header comment); 0: never (a connection's own reconnect backoff still trips the pool).
  std::size_t timeouts_to_trip = 2;
  std::chrono::milliseconds silence_backoff_min{250};   ///< first down period after a trip
  std::chrono::milliseconds silence_backoff_max{1000};  ///< cap of its doubling (each failed probe)
  std::chrono::milliseconds probe_timeout{500};         ///< the prober's PING deadline (off every call)
};

/// The pool's circuit breaker, as seen by a caller (connection_pool::breaker()).
struct breaker_status {
  bool down = false;                     ///< calls are refused at once now
  std::uint64_t trips = 0;               ///< times it tripped (calls in a row timed out or failed to connect)
  std::uint64_t refusals = 0;            ///< calls refused at once while down (any cause)
  std::uint64_t probes = 0;              ///< half-open probes (the prober's PINGs) sent
  std::size_t consecutive_timeouts = 0;  ///< calls in a row that timed out or failed to connect, now
  std::string last_error;                ///< why it is (or was last) down, in words
};

/// Which connections a request may take (see the header comment).
enum class request_size : std::uint8_t { small, large };

/// A fixed set of connections to one server, lent one per call.
template <connection Connection>
class connection_pool {
 public:
  /// A borrowed connection; gives it back when destroyed (or on release()).
  class lease {
   public:
    lease() = default;
    lease(lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), index_(o.index_) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        release();
        pool_ = std::exchange(o.pool_, nullptr);
        index_ = o.index_;
      }
      return *this;
    }
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() { release(); }

    explicit operator bool() const noexcept { return pool_ != nullptr; }
    Connection& conn() const noexcept { return *pool_->conns_[index_]; }
    /// Which connection of the pool (0 .. size()-1): lets a caller keep scratch per connection.
    std::size_t index() const noexcept { return index_; }
    void release() noexcept {
      if (pool_ != nullptr) std::exchange(pool_, nullptr)->give_back(index_);
    }

   private:
    friend class connection_pool;
    connection_pool* pool_ = nullptr;
    std::size_t index_ = 0;
  };

  explicit connection_pool(connection_options opt, pool_options p = {})
      : opt_(std::move(opt)),
        trip_after_(p.timeouts_to_trip),
        silence_min_(std::max(p.silence_backoff_min, std::chrono::milliseconds(1))),
        silence_max_(std::max(p.silence_backoff_max, silence_min_)),
        silence_backoff_(silence_min_),
        probe_timeout_(std::max(p.probe_timeout, std::chrono::milliseconds(1))),
        reserved_(std::min(p.reserved_small, std::max<std::size_t>(p.connections, 1) - 1)),
        busy_(std::max<std::size_t>(p.connections, 1), false),
        snapshots_(busy_.size()) {
    conns_.reserve(busy_.size());
    for (std::size_t i = 0; i < busy_.size(); ++i) conns_.push_back(std::make_unique<Connection>(opt_));
  }
  connection_pool(const connection_pool&) = delete;
  connection_pool& operator=(const connection_pool&) = delete;
  /// Waits for a probe under way (bounded by probe_timeout).
  ~connection_pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    prober_cv_.notify_all();
    if (prober_.joinable()) prober_.join();
  }

  /// Lends a free connection of the request's size class, waiting for one until `dl`.
  /// Fails at once (`out` stays empty) with errc::timeout when `dl` had already passed, and with
  /// the last connect error while the server is down (see down_until()); errc::timeout when no
  /// connection came free in time. `why`, when given, gets the reason in words on failure.
  std::error_code acquire(request_size kind, deadline dl, lease& out, std::string* why = nullptr) {
    out.release();
    std::unique_lock<std::mutex> lock(mu_);
    std::size_t index = npos;
    if (const std::error_code ec = wait_for_free(lock, kind, dl, why, index)) return ec;
    busy_[index] = true;
    out.pool_ = this;
    out.index_ = index;
    return {};
  }

  /// While the server is down (a connection's connect failed and its reconnect backoff has not
  /// ended, or calls in a row timed out and the silence backoff has not ended): when calls may
  /// try again. Empty once a call may try, and after any call succeeded.
  std::optional<clock::time_point> down_until() const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = clock::now();
    clock::time_point until = std::max(down_until_, silent_until_);
    // the backoff ended but the prober's PING has not answered yet: down until it ends, at most
    if (silent_ && prober_running_ && until <= now) until = now + probe_timeout_;
    if (now >= until) return std::nullopt;
    return until;
  }
  bool down() const { return down_until().has_value(); }

  /// Adds the breaker's counters (refusals, trips on silence) to `refusals` and `trips` (a
  /// store's stats(); no words, no allocation).
  void add_breaker_counts(std::uint64_t& refusals, std::uint64_t& trips) const noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    refusals += down_refusals_;
    trips += trips_;
  }

  /// The circuit breaker's state and counters (see the header comment).
  breaker_status breaker() const {
    std::lock_guard<std::mutex> lock(mu_);
    breaker_status b;
    const auto now = clock::now();
    b.down = now < down_until_ || now < silent_until_ || (silent_ && (probe_out_ || prober_running_));
    b.trips = trips_;
    b.refusals = down_refusals_;
    b.probes = probes_;
    b.consecutive_timeouts = consecutive_timeouts_;
    b.last_error = now < down_until_ ? down_text_ : silent_text_;
    return b;
  }

  /// Lends up to `n` connections of the request's size class at once (a batch spread over
  /// them): waits until `dl` for the first, then takes whichever others are free now, without
  /// waiting. Fails as acquire() does (`out` empty): the deadline had passed, the server is
  /// down, or none came free in time. `out` is cleared first.
  std::error_code acquire_up_to(request_size kind, std::size_t n, deadline dl, std::vector<lease>& out,
                                std::string* why = nullptr) {
    out.clear();
    if (n == 0) return {};
    std::vector<std::size_t> got;
    {
      std::unique_lock<std::mutex> lock(mu_);
      std::size_t index = npos;
      if (const std::error_code ec = wait_for_free(lock, kind, dl, why, index)) return ec;
      if (probe_index_ == index) n = 1;  // a half-open probe is one connection's call
      do {
        busy_[index] = true;
        got.push_back(index);
      } while (got.size() < n && (index = find_free(kind)) != npos);
    }
    out.resize(got.size());
    for (std::size_t k = 0; k < got.size(); ++k) out[k].pool_ = this, out[k].index_ = got[k];
    return {};
  }

  std::size_t size() const noexcept { return conns_.size(); }
  std::size_t reserved_small() const noexcept { return reserved_; }
  const connection_options& options() const noexcept { return opt_; }

  /// The connections' counters, summed, as of each one's last release.
  connection_stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    connection_stats s;
    for (const connection_stats& x : snapshots_) {
      s.batches += x.batches, s.commands += x.commands, s.connects += x.connects;
      s.connect_failures += x.connect_failures, s.timeouts += x.timeouts, s.failures += x.failures;
      s.health_checks += x.health_checks, s.bytes_written += x.bytes_written, s.bytes_read += x.bytes_read;
      s.down_refusals += x.down_refusals;
    }
    s.down_refusals += down_refusals_;  // acquire() refusals (no connection was lent)
    return s;
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  // Small requests take the reserved connections first, so the large ones stay free for large
  // requests; large requests never take a reserved one.
  std::size_t find_free(request_size kind) const noexcept {
    const std::size_t from = kind == request_size::large ? reserved_ : 0;
    for (std::size_t i = from; i < busy_.size(); ++i)
      if (!busy_[i]) return i;
    return npos;
  }

  // Under mu_ (held by `lock`): refuses a call whose deadline had passed or whose server is down,
  // else waits until `dl` for a free connection of the size class and names it in `index`.
  std::error_code wait_for_free(std::unique_lock<std::mutex>& lock, request_size kind, deadline dl,
                                std::string* why, std::size_t& index) {
    const auto now = clock::now();
    if (now >= dl)
      return failed(why, make_error_code(errc::timeout), "the deadline had passed before the call started");
    if (silent_ && (now < silent_until_ || probe_out_ || prober_running_)) {
      ++down_refusals_;
      if (why != nullptr) {
        *why = trip_error_ == errc::timeout ? "server down (silent: " : "server down (failing: ";
        *why += now < silent_until_
                    ? "next probe in " +
                          std::to_string(
                              std::chrono::ceil<std::chrono::milliseconds>(silent_until_ - now).count()) +
                          " ms"
                    : std::string("a probe is under way");
        *why += ") after: " + silent_text_;
      }
      return trip_error_;
    }
    if (now < down_until_) {
      ++down_refusals_;
      if (why != nullptr) *why = "server down (in reconnect backoff) after: " + down_text_;
      return down_error_;
    }
    auto pick = [&] { return (index = find_free(kind)) != npos; };
    if (!kvtier::detail::wait_until(cv_, lock, dl, pick))
      return failed(why, make_error_code(errc::timeout), "no pooled connection came free by the deadline");
    if (silent_) {  // no prober (its thread did not start): this call is the half-open probe
      if (probe_out_ || clock::now() < silent_until_) {
        ++down_refusals_;
        return failed(why, trip_error_, "server down (silent) after: " + silent_text_);
      }
      probe_out_ = true;
      probe_index_ = index;
      ++probes_;
    }
    return {};
  }

  // Under mu_: the breaker's bookkeeping for a connection given back, from how its counters
  // moved during the lease (`before`: its snapshot at the last release).
  void note_outcome(const Connection& c, const connection_stats& before, const connection_stats& after,
                    std::size_t index) {
    const bool was_probe = probe_out_ && probe_index_ == index;
    if (was_probe) probe_out_ = false, probe_index_ = npos;
    const std::uint64_t timeouts = after.timeouts - before.timeouts;
    // A connect or handshake that got no answer, or a connection opened in this lease that the
    // server closed before a byte came back (a TLS-only port spoken to in plain RESP). Other
    // failed connects (refused, a wrong password) put the connection in its reconnect backoff,
    // which trips the pool already (give_back).
    std::uint64_t failed_connects = 0;
    if constexpr (requires { c.last_connect_error(); })
      if (after.connect_failures > before.connect_failures && c.last_connect_error() == errc::timeout)
        ++failed_connects;
    if (after.connects > before.connects && after.failures > before.failures &&
        after.bytes_read == before.bytes_read)
      ++failed_connects;
    if (timeouts + failed_connects > 0) {
      consecutive_timeouts_ += timeouts + failed_connects;
      if (trip_after_ == 0 || (consecutive_timeouts_ < trip_after_ && !was_probe)) return;
      // Trip (again): the server let these calls time out or refused them.
      const auto now = clock::now();
      if (silent_ && now < silent_until_) return;  // a call lent before the trip: already down
      ++trips_;
      silent_ = true;
      silent_until_ = now + std::chrono::duration_cast<clock::duration>(silence_backoff_);
      silence_backoff_ = std::min(silence_backoff_ * 2, silence_max_);
      trip_error_ = make_error_code(timeouts > 0 ? errc::timeout : errc::connection_lost);
      if constexpr (requires { c.last_connect_error(); })
        if (timeouts == 0 && after.connect_failures > before.connect_failures)
          trip_error_ = c.last_connect_error();
      try {
        silent_text_ = std::to_string(consecutive_timeouts_) +
                       (failed_connects == 0 ? " calls in a row timed out"
                                             : " calls in a row timed out or failed to connect");
        if constexpr (requires { c.last_error(); })
          silent_text_ += "; the last: " + std::string(c.last_error());
      } catch (...) {  // out of memory: keep the older text
      }
      start_prober();
    } else if (after.batches > before.batches && after.failures == before.failures) {
      // Answered: the server is up.
      consecutive_timeouts_ = 0;
      silent_ = false;
      silent_until_ = {};
      silence_backoff_ = silence_min_;
    } else if (was_probe && silent_) {
      // No verdict (e.g. the connection was in its own reconnect backoff): probe again later.
      silent_until_ = clock::now() + std::chrono::duration_cast<clock::duration>(silence_backoff_);
    }
  }

  // Under mu_: starts the prober thread unless it runs. Without one (no thread could start), the
  // first call after each backoff is the probe (wait_for_free).
  void start_prober() noexcept {
    if (prober_running_ || closing_) return;
    if (prober_.joinable()) prober_.join();  // it has left its loop: ends at once
    try {
      prober_ = std::thread([this] { probe_until_up(); });
      prober_running_ = true;
    } catch (...) {
    }
  }

  // The prober: after each backoff, one PING with its own deadline on a free connection, until a
  // PING is answered (note_outcome clears silent_) or the pool closes.
  void probe_until_up() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!closing_ && silent_) {
      const auto now = clock::now();
      std::size_t index = npos;
      if (now < silent_until_ || now < down_until_ || probe_out_ ||
          (index = find_free(request_size::small)) == npos) {
        // the backoffs (ours, a connection's reconnect backoff: a PING then would not even try),
        // or every connection lent (to a call lent before the trip): look again then
        prober_cv_.wait_until(lock,
                              std::max({silent_until_, down_until_, now + std::chrono::milliseconds(5)}));
        continue;
      }
      busy_[index] = true;
      probe_out_ = true;
      probe_index_ = index;
      ++probes_;
      lock.unlock();
      (void)conns_[index]->ping(deadline_after(probe_timeout_));
      give_back(index);  // note_outcome: up, or tripped again with the backoff doubled
      lock.lock();
    }
    prober_running_ = false;
  }

  static std::error_code failed(std::string* why, std::error_code ec, std::string_view text) {
    if (why != nullptr) *why = text;
    return ec;
  }

  void give_back(std::size_t index) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Connection& c = *conns_[index];
      const connection_stats before = snapshots_[index];
      snapshots_[index] = c.stats();
      busy_[index] = false;
      note_outcome(c, before, snapshots_[index], index);
      if constexpr (requires {
                      c.down_until();
                      c.last_connect_error();
                      c.last_error();
                    }) {
        if (const std::optional<clock::time_point> until = c.down_until()) {  // its connect failed
          down_until_ = std::max(down_until_, *until);
          down_error_ = c.last_connect_error();
          try {
            down_text_ = c.last_error();
          } catch (...) {  // out of memory: keep the older text
          }
        } else if (c.connected()) {
          down_until_ = {};  // the server answered
        }
      }
    }
    cv_.notify_all();  // waiters of both sizes: a freed connection may suit only some of them
  }

  connection_options opt_;
  std::size_t trip_after_;
  std::chrono::milliseconds silence_min_, silence_max_, silence_backoff_, probe_timeout_;
  std::size_t reserved_;
  std::vector<std::unique_ptr<Connection>> conns_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
  std::vector<connection_stats> snapshots_;
  clock::time_point down_until_{};  // calls before it fail at once with down_error_
  std::error_code down_error_;
  std::string down_text_;
  std::uint64_t down_refusals_ = 0;
  // The silence breaker (see the header comment).
  bool silent_ = false;               // tripped on timeouts, no call answered since
  clock::time_point silent_until_{};  // calls before it are refused; after it, one probe
  bool probe_out_ = false;            // the half-open probe is lent
  std::size_t probe_index_ = npos;    // its connection
  std::size_t consecutive_timeouts_ = 0;
  std::uint64_t trips_ = 0, probes_ = 0;
  std::string silent_text_;
  std::error_code trip_error_ = make_error_code(errc::timeout);  // a refused call's, while silent_
  std::thread prober_;                                           // the half-open probes (probe_until_up)
  bool prober_running_ = false;                                  // it is in its loop
  bool closing_ = false;                                         // the destructor runs
  std::condition_variable prober_cv_;
};

}  // namespace kvtier::resp
