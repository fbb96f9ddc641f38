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
// Value format (value_header.hpp): version 1 (one payload checksum) by default, or version 2
// (one checksum per group of payload bytes, e.g. a few layers of a layer-major chunk) when the
// store is given value_format::v2(group_bytes). A store reads only the format it writes: a
// version-1 value read by a version-2 store has another length and is refused (corrupt, counted
// as other_format); a version-2 value whose payload was altered fails only its own group's
// checksum (counted as bad_checksum; the status is corrupt either way). The framing and checks
// live in store/detail/remote_codec.hpp, shared with cluster_store.
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

#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/pool.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/detail/remote_codec.hpp"
#include "kvtier/store/remote_stats.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

/// The L2 store: one namespace's chunks on one server, through a pool of connections.
template <resp::connection Connection>
class remote_store {
 public:
  /// `pool` sizes the connection pool (resp/pool.hpp): calls run in parallel, one per
  /// connection; a call that moves more than `small_request_bytes` of payload is `large`.
  /// `format`: the value format written and expected (version 1 unless given).
  remote_store(key_namespace ns, resp::connection_options opt, resp::pool_options pool = {},
               value_format format = value_format::v1())
      : codec_(std::move(ns), {}, format),
        where_(opt.server.describe()),
        pool_(std::move(opt), pool),
        scratch_(pool_.size()) {}
  remote_store(key_namespace ns, resp::connection_options opt, value_format format,
               resp::pool_options pool = {})
      : remote_store(std::move(ns), std::move(opt), pool, format) {}

  remote_store(const remote_store&) = delete;
  remote_store& operator=(const remote_store&) = delete;

  /// Calls moving at most this many payload bytes count as small (never wait behind large ones).
  static constexpr std::size_t small_request_bytes = 64 << 10;

  /// Presence of each key (one EXISTS per key, one round trip). hit = present, miss = absent.
  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl) {
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    return run(
        keys, status, dl, resp::request_size::small,
        [&](detail::remote_scratch& s, std::size_t, const chunk_key&, const std::string& name) {
          codec_.add_exists(s.batch, name);
        },
        [&](detail::remote_scratch&, std::size_t, const resp::value& r, const std::string& name) {
          return codec_.exists_status(r, where_, name);
        });
  }

  /// Reads each key's payload into dst[i] (its size is the expected length) and verifies it.
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) {
    if (auto ec = codec_.check_batch(keys, dst, status)) return ec;
    return run(
        keys, status, dl, size_class(dst),
        [&](detail::remote_scratch& s, std::size_t i, const chunk_key& k, const std::string& name) {
          codec_.add_get(s, i, k, name, dst[i]);
        },
        [&](detail::remote_scratch& s, std::size_t i, const resp::value& r, const std::string& name) {
          return codec_.get_status(r, s, i, keys[i], dst[i], where_, name);
        });
  }

  /// Stores src[i] under keys[i] (header + payload, scatter-gather). hit = stored.
  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) {
    if (auto ec = codec_.check_batch(keys, src, status)) return ec;
    return run(
        keys, status, dl, size_class(src),
        [&](detail::remote_scratch& s, std::size_t i, const chunk_key& k, const std::string& name) {
          codec_.add_put(s, i, k, name, src[i]);
        },
        [&](detail::remote_scratch&, std::size_t i, const resp::value& r, const std::string& name) {
          return codec_.put_status(r, src[i].size(), where_, name);
        });
  }

  /// A snapshot of the counters.
  remote_store_stats stats() const noexcept { return codec_.stats(); }

  const key_namespace& ns() const noexcept { return codec_.ns(); }
  const value_format& format() const noexcept { return codec_.format(); }
  /// The last failure in words (empty before any): a failed call's connection error with the
  /// server's address and text ("127.0.0.1:6379: SELECT: ERR DB index is out of range (server
  /// replied with an error)"), or a key's error reply ("127.0.0.1:6379: GET kv:...: WRONGTYPE ...").
  std::string last_error() const { return codec_.last_error(); }
  /// The connection pool (e.g. for its stats()).
  resp::connection_pool<Connection>& pool() noexcept { return pool_; }

 private:
  template <class Span>
  static resp::request_size size_class(Span spans) noexcept {
    std::size_t bytes = 0;
    for (const auto& x : spans) bytes += x.size();
    return bytes > small_request_bytes ? resp::request_size::large : resp::request_size::small;
  }

  // One pipelined round trip on a pooled connection: add(s, i, key, name) per key, then
  // status[i] = judge(s, i, reply, name) for each reply that came back.
  template <class Add, class Judge>
  std::error_code run(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl,
                      resp::request_size kind, Add&& add, Judge&& judge) {
    typename resp::connection_pool<Connection>::lease lease;
    std::string why;  // a deadline already passed, a server down, or no connection free in time
    if (const std::error_code aec = pool_.acquire(kind, dl, lease, &why)) {
      std::fill(status.begin(), status.end(), detail::remote_codec::unfinished(aec));
      codec_.count_call(aec, where_ + ": " + why);
      return aec;
    }
    detail::remote_scratch& s = scratch_[lease.index()];
    s.size_for(keys.size());
    std::vector<std::string>& names = s.names;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      names[i] = codec_.key_text(keys[i]);
      add(s, i, keys[i], names[i]);
    }
    const std::error_code ec = lease.conn().execute(s.batch, dl);
    for (std::size_t i = 0; i < keys.size(); ++i)
      status[i] = i < s.batch.completed() ? judge(s, i, s.batch.reply(i), names[i])
                                          : detail::remote_codec::unfinished(ec);
    codec_.count_call(ec, lease.conn().last_error());
    return ec;
  }

  detail::remote_codec codec_;
  std::string where_;
  resp::connection_pool<Connection> pool_;
  std::vector<detail::remote_scratch> scratch_;
};

}  // namespace kvtier
