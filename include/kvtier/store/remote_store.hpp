// kvtier/store/remote_store.hpp: the remote (L2) chunk store on one Redis-protocol server.
//
// remote_store<Connection> satisfies kvtier::chunk_store over any kvtier::resp::connection
// (asio_connection or uring_connection). Each call is one pipelined round trip:
//   exists: EXISTS per key;  get: GET per key, each value read straight into the caller's span;
//   put: SET per key, header + caller payload written scatter-gather without a copy.
// Every value is framed by a value_header (kvtier/store/value_header.hpp). A get reads the
// header into a small buffer and the payload into the caller's span, and checks the header
// before a single payload byte reaches that span:
//  - a stored value of another total length is discarded in the parser (span untouched);
//  - a value of the right length whose header fails check_value_header() (bad magic, version
//    or header checksum, another namespace, another chunk key, another payload length) is
//    refused by a parser gate that runs as soon as the 56 header bytes are in, before the
//    payload is copied or read into the span; the payload is discarded (span untouched);
//  - only the payload checksum needs the payload itself: a value with a valid header whose
//    payload bytes were altered (a bit flip inside the payload) is detected after its bytes
//    were read into the span. The span then holds those bytes, but the key's status is
//    chunk_status::corrupt, never hit: a caller must not use a span whose status is not hit.
// All are chunk_status::corrupt and counted (stats()).
//
// Pipelined GETs rather than MGET: only a top-level bulk reply can be read into a destination
// without a second copy (MGET's values are elements of one array reply).
//
//   kvtier::resp::connection_options opt{.server = kvtier::resp::parse_url("resp://127.0.0.1:{rank+6400}",
//   rank).value}; kvtier::remote_store<kvtier::resp::asio_connection> l2(ns, opt);
//   std::vector<kvtier::chunk_status> st(keys.size());
//   std::error_code ec = l2.get(keys, dst_spans, st, kvtier::deadline_after(std::chrono::milliseconds(200)));
//
// Thread safety: calls from several threads run in parallel, each on a connection of the
// store's pool (kvtier/resp/pool.hpp; default 4 connections, one kept for small calls such as
// exists, so an EXISTS never waits behind a batch of 12 MB GETs). A call that finds no free
// connection gives up at its own deadline (every key timeout).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/pool.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

/// Counters of a remote_store (monotonic since construction; read with relaxed loads).
struct remote_store_stats {
  std::uint64_t hits = 0;           ///< get: verified values delivered
  std::uint64_t misses = 0;         ///< get: key absent
  std::uint64_t corrupt = 0;        ///< get: all rejected values (sum of the three below)
  std::uint64_t wrong_length = 0;   ///< get: stored length differs from the destination's
  std::uint64_t bad_header = 0;     ///< get: magic/version/header checksum/namespace/key mismatch
  std::uint64_t bad_checksum = 0;   ///< get: payload checksum mismatch
  std::uint64_t timeouts = 0;       ///< calls that hit their deadline
  std::uint64_t errors = 0;         ///< calls lost to connection/protocol errors, and error replies
  std::uint64_t bytes_fetched = 0;  ///< payload bytes of hits
  std::uint64_t bytes_stored = 0;   ///< payload bytes of successful puts
};

/// The L2 store: one namespace's chunks on one server, through a pool of connections.
template <resp::connection Connection>
class remote_store {
 public:
  /// `pool` sizes the connection pool (resp/pool.hpp): calls run in parallel, one per
  /// connection; a call that moves more than `small_request_bytes` of payload is `large`.
  remote_store(key_namespace ns, resp::connection_options opt, resp::pool_options pool = {})
      : ns_(std::move(ns)),
        fingerprint_(ns_.fingerprint()),
        pool_(std::move(opt), pool),
        scratch_(pool_.size()) {}

  remote_store(const remote_store&) = delete;
  remote_store& operator=(const remote_store&) = delete;

  /// Calls moving at most this many payload bytes count as small (never wait behind large ones).
  static constexpr std::size_t small_request_bytes = 64 << 10;

  /// Presence of each key (one EXISTS per key, one round trip). hit = present, miss = absent.
  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl) {
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    call c;
    if (std::error_code ec = enter(c, resp::request_size::small, status, dl)) return ec;
    resp::batch& b = c.s->batch;
    b.clear();
    for (const chunk_key& k : keys) {
      const std::string name = remote_key_text(ns_, k);
      b.add({"EXISTS", name});
    }
    const std::error_code ec = c.conn().execute(b, dl);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i >= b.completed()) {
        status[i] = unfinished(ec);
        continue;
      }
      const resp::value& r = b.reply(i);
      if (r.kind == resp::type::integer) {
        status[i] = r.integer > 0 ? chunk_status::hit : chunk_status::miss;
      } else {
        status[i] = chunk_status::error;
        bump(stats_.errors);
        note_reply("EXISTS", keys[i], r);
      }
    }
    count_call(c, ec);
    return ec;
  }

  /// Reads each key's payload into dst[i] (its size is the expected length) and verifies it.
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) {
    if (keys.size() != dst.size() || keys.size() != status.size())
      return make_error_code(errc::invalid_argument);
    call c;
    if (std::error_code ec = enter(c, size_class(dst), status, dl)) return ec;
    scratch& s = *c.s;
    s.batch.clear();
    s.headers.resize(keys.size());
    s.parts.resize(2 * keys.size());
    s.gates.resize(keys.size());  // sized before any address is taken: the pointers stay valid
    for (std::size_t i = 0; i < keys.size(); ++i) {
      s.parts[2 * i] = std::span<std::byte>(s.headers[i]);
      s.parts[2 * i + 1] = dst[i];
      s.gates[i] = gate_context{fingerprint_, keys[i], dst[i].size()};
      const std::string name = remote_key_text(ns_, keys[i]);
      s.batch.add_into({"GET", name}, std::span<const std::span<std::byte>>(s.parts).subspan(2 * i, 2),
                       resp::destination_gate{&header_gate, &s.gates[i]});
    }
    const std::error_code ec = c.conn().execute(s.batch, dl);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      status[i] =
          i < s.batch.completed() ? judge(s.batch.reply(i), keys[i], s.headers[i], dst[i]) : unfinished(ec);
    }
    count_call(c, ec);
    return ec;
  }

  /// Stores src[i] under keys[i] (header + payload, scatter-gather). hit = stored.
  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) {
    if (keys.size() != src.size() || keys.size() != status.size())
      return make_error_code(errc::invalid_argument);
    call c;
    if (std::error_code ec = enter(c, size_class(src), status, dl)) return ec;
    scratch& s = *c.s;
    s.batch.clear();
    s.headers.resize(keys.size());
    s.out_parts.resize(2 * keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      s.headers[i] = encode_value_header(fingerprint_, keys[i], src[i]);
      s.out_parts[2 * i] = std::span<const std::byte>(s.headers[i]);
      s.out_parts[2 * i + 1] = src[i];
      const std::string name = remote_key_text(ns_, keys[i]);
      s.batch.add_with_payload({"SET", name},
                               std::span<const std::span<const std::byte>>(s.out_parts).subspan(2 * i, 2));
    }
    const std::error_code ec = c.conn().execute(s.batch, dl);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i >= s.batch.completed()) {
        status[i] = unfinished(ec);
      } else if (s.batch.reply(i).kind == resp::type::simple_string) {
        status[i] = chunk_status::hit;
        bump(stats_.bytes_stored, src[i].size());
      } else {
        status[i] = chunk_status::error;  // e.g. OOM with maxmemory and noeviction
        bump(stats_.errors);
        note_reply("SET", keys[i], s.batch.reply(i));
      }
    }
    count_call(c, ec);
    return ec;
  }

  /// A snapshot of the counters.
  remote_store_stats stats() const noexcept {
    remote_store_stats s;
    s.hits = stats_.hits.load(std::memory_order_relaxed);
    s.misses = stats_.misses.load(std::memory_order_relaxed);
    s.wrong_length = stats_.wrong_length.load(std::memory_order_relaxed);
    s.bad_header = stats_.bad_header.load(std::memory_order_relaxed);
    s.bad_checksum = stats_.bad_checksum.load(std::memory_order_relaxed);
    s.corrupt = s.wrong_length + s.bad_header + s.bad_checksum;
    s.timeouts = stats_.timeouts.load(std::memory_order_relaxed);
    s.errors = stats_.errors.load(std::memory_order_relaxed);
    s.bytes_fetched = stats_.bytes_fetched.load(std::memory_order_relaxed);
    s.bytes_stored = stats_.bytes_stored.load(std::memory_order_relaxed);
    return s;
  }

  const key_namespace& ns() const noexcept { return ns_; }
  /// The last failure in words (empty before any): a failed call's connection error with the
  /// server's address and text ("127.0.0.1:6379: SELECT: ERR DB index is out of range (server
  /// replied with an error)"), or a key's error reply ("127.0.0.1:6379: GET kv:...: WRONGTYPE ...").
  std::string last_error() const {
    std::lock_guard<std::mutex> lock(error_mu_);
    return last_error_;
  }
  /// The connection pool (e.g. for its stats()).
  resp::connection_pool<Connection>& pool() noexcept { return pool_; }

 private:
  struct counters {
    std::atomic<std::uint64_t> hits{0}, misses{0}, wrong_length{0}, bad_header{0}, bad_checksum{0},
        timeouts{0}, errors{0}, bytes_fetched{0}, bytes_stored{0};
  };
  static void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
    c.fetch_add(n, std::memory_order_relaxed);
  }

  // What the parser's gate checks for one GET: the header, before the payload reaches dst.
  struct gate_context {
    std::uint64_t fingerprint = 0;
    chunk_key key{};
    std::size_t length = 0;
  };
  // What one call needs besides its connection; one per pooled connection, so calls on
  // different connections share nothing.
  struct scratch {
    resp::batch batch;
    std::vector<value_header_bytes> headers;
    std::vector<std::span<std::byte>> parts;
    std::vector<gate_context> gates;
    std::vector<std::span<const std::byte>> out_parts;
  };

  // A call's lease on one pooled connection and that connection's scratch.
  struct call {
    Connection& conn() const noexcept { return lease.conn(); }
    typename resp::connection_pool<Connection>::lease lease;
    scratch* s = nullptr;
  };

  template <class Span>
  static resp::request_size size_class(Span spans) noexcept {
    std::size_t bytes = 0;
    for (const auto& x : spans) bytes += x.size();
    return bytes > small_request_bytes ? resp::request_size::large : resp::request_size::small;
  }

  // Borrows a connection by the deadline; else every key timeout.
  std::error_code enter(call& c, resp::request_size kind, std::span<chunk_status> status, deadline dl) {
    const std::error_code ec = pool_.acquire(kind, dl, c.lease);
    if (ec || expired(dl)) {
      std::fill(status.begin(), status.end(), chunk_status::timeout);
      bump(stats_.timeouts);
      note(pool_.options().server.describe() + ": no pooled connection came free by the deadline");
      return make_error_code(errc::timeout);
    }
    c.s = &scratch_[c.lease.index()];
    return {};
  }

  static chunk_status unfinished(const std::error_code& ec) noexcept {
    return ec == errc::timeout ? chunk_status::timeout : chunk_status::error;
  }

  void count_call(const call& c, const std::error_code& ec) {
    if (!ec) return;
    bump(ec == errc::timeout ? stats_.timeouts : stats_.errors);
    note(c.conn().last_error());
  }

  void note(std::string text) {
    std::lock_guard<std::mutex> lock(error_mu_);
    last_error_ = std::move(text);
  }
  // A key's error reply (or a reply of the wrong type): the command, the key, the server's words.
  void note_reply(std::string_view command, const chunk_key& key, const resp::value& r) {
    std::string text = pool_.options().server.describe() + ": " + std::string(command) + " " +
                       remote_key_text(ns_, key) + ": ";
    text += r.is_error() ? r.str : "reply of type " + std::string(resp::to_string(r.kind));
    note(std::move(text));
  }

  static bool header_gate(void* context, std::span<const std::byte> header) noexcept {
    const auto& g = *static_cast<const gate_context*>(context);
    return header.size() == value_header::size &&
           check_value_header(header.first<value_header::size>(), g.fingerprint, g.key, g.length) ==
               header_check::ok;
  }

  // Status of one GET reply whose bytes went to header + dst (or did not).
  chunk_status judge(const resp::value& r, const chunk_key& key, const value_header_bytes& header,
                     std::span<std::byte> dst) {
    if (r.is_null()) {
      bump(stats_.misses);
      return chunk_status::miss;
    }
    if (r.kind != resp::type::bulk_string) {
      bump(stats_.errors);  // WRONGTYPE and the like
      note_reply("GET", key, r);
      return chunk_status::error;
    }
    if (r.refused_by_gate) {  // the header failed: nothing was written to dst
      const header_check hc = check_value_header(header, fingerprint_, key, dst.size());
      bump(hc == header_check::wrong_length ? stats_.wrong_length : stats_.bad_header);
      return chunk_status::corrupt;
    }
    if (!r.into_destination) {  // stored length != header + dst: nothing was written to dst
      bump(stats_.wrong_length);
      return chunk_status::corrupt;
    }
    // The gate passed this header already; checked again so a hit never rests on the parser alone.
    const header_check hc = check_value_header(header, fingerprint_, key, dst.size());
    if (hc == header_check::wrong_length) {
      bump(stats_.wrong_length);
      return chunk_status::corrupt;
    }
    if (hc != header_check::ok) {
      bump(stats_.bad_header);
      return chunk_status::corrupt;
    }
    if (!payload_matches(header, dst)) {  // the one check that needs the bytes in dst
      bump(stats_.bad_checksum);
      return chunk_status::corrupt;
    }
    bump(stats_.hits);
    bump(stats_.bytes_fetched, dst.size());
    return chunk_status::hit;
  }

  key_namespace ns_;
  std::uint64_t fingerprint_;
  resp::connection_pool<Connection> pool_;
  std::vector<scratch> scratch_;
  counters stats_;
  mutable std::mutex error_mu_;
  std::string last_error_;
};

}  // namespace kvtier
