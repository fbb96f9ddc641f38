// kvtier/store/remote_store.hpp: the remote (L2) chunk store on one Redis-protocol server.
//
// remote_store<Connection> satisfies kvtier::chunk_store over any kvtier::resp::connection
// (asio_connection or uring_connection). A call is pipelined:
//   exists: EXISTS per key;  get: GET per key, each value read straight into the caller's span;
//   put: SET per key, header + caller payload written scatter-gather without a copy.
// A get/put batch is cut, in order, into pieces of at most batch_spread::max_reply_bytes (1 MiB
// unless given; a larger value goes alone) that run on up to all of the pool's large
// connections at once, one piece per connection at a time (kvtier/store/batch_spread.hpp): small
// values still pipeline, large ones never queue a whole batch in one server-side reply buffer.
// Results keep the caller's order; a connection that fails fails only its own piece's keys.
// Every value is framed by a value_header (kvtier/store/value_header.hpp). A get reads the
// header into a small buffer and the payload into the caller's span, and checks the header
// before a single payload byte reaches that span:
//  - a stored value of another total length is discarded in the parser (span untouched; get's
//    stored_bytes says the payload length it has, for a caller to name a destination of another size);
//  - a value of the right length whose header fails check_value_header() (bad magic, version
//    or header checksum, another namespace, another chunk key, another payload length) is
//    refused by a parser gate that runs as soon as the 56 header bytes are in, before the
//    payload is copied or read into the span; the payload is discarded (span untouched);
//  - only the payload checksum needs the payload itself: it runs while the bytes land (each
//    piece folded into XXH3-64 as the parser writes it to the span, value_check), so a value
//    with a valid header whose payload bytes were altered (a bit flip inside the payload) is
//    detected once its bytes were read into the span, with no second pass over them. The span then holds
//    those bytes, but the key's status is chunk_status::corrupt, never hit: a caller must not use a span
//    whose status is not hit.
// All are chunk_status::corrupt, counted (stats()) and named in last_error() (key, chunk, why).
//
// Value format (value_header.hpp): version 1 (one payload checksum) by default, or version 2
// (one checksum per group of payload bytes, e.g. a few layers of a layer-major chunk) when the
// store is given value_format::v2(group_bytes). A store reads only the format it writes: a
// version-1 value read by a version-2 store has another length and is refused (corrupt, counted
// as other_format); a version-2 value whose payload was altered fails only its own group's
// checksum (counted as bad_checksum; the status is corrupt either way). The framing and checks
// live in store/detail/remote_codec.hpp, shared with cluster_store.
//
// get_by_group() reads the same format-2 values group-major (issue 20, loads that stream by layer
// group): GETRANGE of group 0 of every key (with its header, gated as above), then group 1 of every
// key, ..., each group checked against the header read with group 0 as it lands, with a callback
// after each round saying which groups landed; a value overwritten between two ranged reads fails
// the group that changed (or its length) and is corrupt, never mixed bytes reported as a hit.
//
// Pipelined GETs rather than MGET: only a top-level bulk reply can be read into a destination
// without a second copy (MGET's values are elements of one array reply).
//
//   kvtier::resp::connection_options opt{.server = kvtier::resp::parse_url("resp://127.0.0.1:{rank+6400}",
//   rank).value}; kvtier::remote_store<kvtier::resp::asio_connection> l2(ns, opt);
//   std::vector<kvtier::chunk_status> st(keys.size());
//   std::error_code ec = l2.get(keys, dst_spans, st, kvtier::deadline_after(std::chrono::milliseconds(200)));
//
// Exceptions: a call never throws. What its own bookkeeping throws (an allocation that fails:
// the batch's pieces, its connections, a value's framing), or get_by_group's on_round, fails
// every key of the call (chunk_status::error) with std::errc::not_enough_memory
// (errc::backend_error for any other exception), named in last_error().
//
// Thread safety: calls from several threads run in parallel, each on a connection of the
// store's pool (kvtier/resp/pool.hpp; default 4 connections, one kept for small calls such as
// exists, so an EXISTS never waits behind a batch of 12 MB GETs). A call that finds no free
// connection gives up at its own deadline (every key timeout).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/pool.hpp"
#include "kvtier/store/batch_spread.hpp"
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
  /// `format`: the value format written and expected (version 1 unless given). `spread`: how a
  /// get/put batch is cut over the pool's connections (kvtier/store/batch_spread.hpp).
  remote_store(key_namespace ns, resp::connection_options opt, resp::pool_options pool = {},
               value_format format = value_format::v1(), batch_spread spread = {})
      : codec_(std::move(ns), {}, format),
        where_(opt.server.describe()),
        pool_(std::move(opt), pool),
        scratch_(pool_.size()),
        spread_(spread),
        crew_(pool_.size()) {}
  remote_store(key_namespace ns, resp::connection_options opt, value_format format,
               resp::pool_options pool = {}, batch_spread spread = {})
      : remote_store(std::move(ns), std::move(opt), pool, format, spread) {}

  remote_store(const remote_store&) = delete;
  remote_store& operator=(const remote_store&) = delete;

  /// Calls moving at most this many payload bytes count as small (never wait behind large ones).
  static constexpr std::size_t small_request_bytes = 64 << 10;

  /// Presence of each key (one EXISTS per key, one round trip). hit = present, miss = absent.
  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status,
                         deadline dl) noexcept {
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    return guarded(status, "EXISTS", [&] {
      return run(
          keys, status, dl, resp::request_size::small, {},
          [&](detail::remote_scratch& s, std::size_t, std::size_t, const std::string& name) {
            codec_.add_exists(s.batch, name);
          },
          [&](detail::remote_scratch&, std::size_t, std::size_t, const resp::value& r,
              const std::string& name) { return codec_.exists_status(r, where_, name); });
    });
  }

  /// Reads each key's payload into dst[i] (its size is the expected length) and verifies it.
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) noexcept {
    return get(keys, dst, status, dl, std::span<std::size_t>());
  }

  /// get(), and for each key whose stored value has another payload length than dst[i] (status
  /// corrupt, dst[i] untouched), that length in stored_bytes[i] (from the value's length on the
  /// server less its header); the other entries are left as they were. `stored_bytes` is empty
  /// or has one entry per key (else invalid_argument). How a caller tells a destination of the
  /// wrong size from a damaged value (kvtier.Store.get in Python raises InvalidArgument then).
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl,
                      std::span<std::size_t> stored_bytes) noexcept {
    if (auto ec = codec_.check_batch(keys, dst, status)) return ec;
    if (!stored_bytes.empty() && stored_bytes.size() != keys.size())
      return make_error_code(errc::invalid_argument);
    return guarded(status, "GET", [&] {
      return run(
          keys, status, dl, size_class(dst), value_bytes(dst),
          [&](detail::remote_scratch& s, std::size_t j, std::size_t i, const std::string& name) {
            codec_.add_get(s, j, keys[i], name, dst[i]);
          },
          [&](detail::remote_scratch& s, std::size_t j, std::size_t i, const resp::value& r,
              const std::string& name) {
            return codec_.get_status(r, s, j, keys[i], dst[i], where_, name,
                                     stored_bytes.empty() ? nullptr : &stored_bytes[i]);
          });
    });
  }

  /// Layer groups of a payload of `bytes` bytes as get_by_group reads it (1 in format 1).
  std::size_t groups_of(std::size_t bytes) const noexcept {
    return std::max<std::size_t>(1, codec_.format().groups(bytes));
  }

  /// get(), read group-major: GETRANGE of group 0 of every key (with its header), then group 1
  /// of every key still good, and so on, each round cut over the pool's connections like a get.
  /// A key's header is checked (the parser gate) before any payload byte reaches dst[i]; each
  /// group is checked against that header's checksum as its bytes land, so a value overwritten
  /// between two ranged reads fails the group that changed (or its length) and is corrupt, never
  /// a hit with mixed bytes. After each round, on the calling thread, `on_round(groups_landed)`
  /// (if set) sees per key the leading groups verified in dst[i] so far; they only grow. The final
  /// status is hit only when every group of the key landed; a key that failed a round is not
  /// read further. A deadline passing mid-stream leaves the groups that landed reported and the
  /// rest timeout.
  ///
  ///   std::vector<kvtier::chunk_status> st(keys.size());
  ///   l2.get_by_group(keys, dst, st, dl, [&](std::span<const std::size_t> landed) {
  ///     for (std::size_t i = 0; i < landed.size(); ++i) publish(i, landed[i]);  // layers below it usable
  ///   });
  std::error_code get_by_group(
      std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
      std::span<chunk_status> status, deadline dl,
      const std::function<void(std::span<const std::size_t>)>& on_round = {}) noexcept {
    if (auto ec = codec_.check_batch(keys, dst, status)) return ec;
    return guarded(status, "GETRANGE", [&]() -> std::error_code {
      const std::size_t n = keys.size();
      std::vector<value_check> checks(n);
      std::vector<std::vector<std::byte>> headers(n);
      std::vector<std::size_t> landed(n, 0), alive(n);
      std::size_t rounds = 0;
      for (std::size_t i = 0; i < n; ++i) {
        alive[i] = i;
        checks[i].expect(codec_.format(), codec_.ns().fingerprint(), keys[i], dst[i].size());
        headers[i].resize(codec_.format().header_size(dst[i].size()));
        rounds = std::max(rounds, groups_of(dst[i].size()));
      }
      std::error_code first_ec;
      std::vector<chunk_key> round_keys;
      std::vector<std::span<std::byte>> round_parts;
      std::vector<chunk_status> round_status;
      for (std::size_t g = 0; g < rounds && !alive.empty(); ++g) {
        round_keys.clear();
        round_parts.clear();
        for (std::size_t i : alive) {
          round_keys.push_back(keys[i]);
          round_parts.push_back(codec_.format().group(dst[i], g));
        }
        round_status.assign(alive.size(), chunk_status::error);
        std::vector<std::size_t> bytes(alive.size());  // what each range puts in flight (group 0: + header)
        for (std::size_t k = 0; k < alive.size(); ++k)
          bytes[k] = round_parts[k].size() + (g == 0 ? headers[alive[k]].size() : 0);
        const std::error_code ec = run(
            round_keys, round_status, dl, size_class(std::span<const std::span<std::byte>>(round_parts)),
            bytes,
            [&](detail::remote_scratch& s, std::size_t j, std::size_t k, const std::string& name) {
              const std::size_t i = alive[k];
              codec_.add_get_range(s, j, checks[i], headers[i], name, dst[i], g);
            },
            [&](detail::remote_scratch&, std::size_t, std::size_t k, const resp::value& r,
                const std::string& name) {
              const std::size_t i = alive[k];
              return codec_.range_status(r, checks[i], headers[i], keys[i], dst[i], g,
                                         g + 1 == groups_of(dst[i].size()), where_, name);
            });
        if (ec && !first_ec) first_ec = ec;
        std::size_t kept = 0;
        for (std::size_t k = 0; k < alive.size(); ++k) {
          const std::size_t i = alive[k];
          if (round_status[k] != chunk_status::hit) {
            status[i] = round_status[k];
            continue;
          }
          landed[i] = g + 1;
          if (landed[i] == groups_of(dst[i].size()))
            status[i] = chunk_status::hit;
          else
            alive[kept++] = i;
        }
        alive.resize(kept);
        if (on_round) on_round(landed);
      }
      return first_ec;
    });
  }

  /// Stores src[i] under keys[i] (header + payload, scatter-gather). hit = stored.
  /// Each value is hashed in one pass just before its piece of the batch is sent (the header,
  /// which carries the checksum, goes first): the one-pass order in which a source that changes
  /// while it is sent fails its checksum rather than storing a mix that passes. A caller that
  /// copied the bytes anyway hashes them in that copy and calls put_prehashed().
  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) noexcept {
    return put_prehashed(keys, src, {}, status, dl);
  }

  /// put() with each value's checksums already known (`digests[i]` of src[i] in this store's
  /// format(), e.g. from a value_hasher run while src[i] was copied into staging; empty: put()),
  /// so no pass over the payload runs before it is sent. Digests of another format or length:
  /// invalid_argument, nothing sent. The caller vouches that src[i] still holds the bytes hashed;
  /// if not, the stored value fails its checksum on read (corrupt), never a hit.
  ///
  ///   kvtier::value_hasher h;
  ///   h.begin(l2.format(), staging.size());
  ///   /* copy into staging, h.update(piece) per piece */
  ///   std::vector<kvtier::value_digest> d{h.digest()};
  ///   l2.put_prehashed(keys, src, d, st, dl);
  std::error_code put_prehashed(std::span<const chunk_key> keys,
                                std::span<const std::span<const std::byte>> src,
                                std::span<const value_digest> digests, std::span<chunk_status> status,
                                deadline dl) noexcept {
    if (auto ec = codec_.check_batch(keys, src, status)) return ec;
    if (!digests.empty())
      if (auto ec = codec_.check_digests(src, digests)) return ec;
    return guarded(status, "SET", [&] {
      return run(
          keys, status, dl, size_class(src), value_bytes(src),
          [&](detail::remote_scratch& s, std::size_t j, std::size_t i, const std::string& name) {
            codec_.add_put(s, j, keys[i], name, src[i], digests.empty() ? nullptr : &digests[i]);
          },
          [&](detail::remote_scratch&, std::size_t, std::size_t i, const resp::value& r,
              const std::string& name) { return codec_.put_status(r, src[i].size(), where_, name); });
    });
  }

  /// put_prehashed() of values given in pieces (`values[i]`: the pieces whose concatenation is
  /// the value, e.g. from kv_pieces: where a chunk lies in an engine's pages), written to the
  /// socket from where they lie (writev), with no copy into one buffer first. `digests` empty:
  /// each value's pieces are hashed just before its piece of the batch is sent, as put() does.
  ///
  ///   std::vector<std::span<const std::byte>> pieces;
  ///   kvtier::kv_pieces(cache, slots, {}, pieces);                 // no copy: where the bytes lie
  ///   const kvtier::value_pieces v[] = {pieces};
  ///   l2.put_pieces(keys, v, {}, st, dl);                          // keys: one key
  std::error_code put_pieces(std::span<const chunk_key> keys, std::span<const value_pieces> values,
                             std::span<const value_digest> digests, std::span<chunk_status> status,
                             deadline dl) noexcept {
    return guarded(status, "SET", [&] {  // the lengths' vector may not be allocated
      std::vector<std::size_t> lengths;
      if (auto ec = codec_.check_pieces(keys, values, digests, status, lengths)) return ec;
      return run(
          keys, status, dl, size_class(lengths), value_bytes(lengths),
          [&](detail::remote_scratch& s, std::size_t j, std::size_t i, const std::string& name) {
            codec_.add_put_pieces(s, j, keys[i], name, values[i], lengths[i],
                                  digests.empty() ? nullptr : &digests[i]);
          },
          [&](detail::remote_scratch&, std::size_t, std::size_t i, const resp::value& r,
              const std::string& name) { return codec_.put_status(r, lengths[i], where_, name); });
    });
  }

  /// A snapshot of the counters.
  remote_store_stats stats() const noexcept {
    remote_store_stats s = codec_.stats();
    pool_.add_breaker_counts(s.down_refusals, s.breaker_trips);
    return s;
  }

  const key_namespace& ns() const noexcept { return codec_.ns(); }
  const value_format& format() const noexcept { return codec_.format(); }
  const batch_spread& spread() const noexcept { return spread_; }
  /// The last failure in words (empty before any): a failed call's connection error with the
  /// server's address and text ("127.0.0.1:6379: SELECT: ERR DB index is out of range (server
  /// replied with an error)"), a key's error reply ("127.0.0.1:6379: GET kv:...: WRONGTYPE ..."),
  /// or a corrupt value with its chunk and why ("...: GET kvtier:...: (chunk 00..2a): corrupt:
  /// checksum mismatch in group 3 of 8").
  std::string last_error() const { return codec_.last_error(); }
  /// The connection pool (e.g. for its stats()).
  resp::connection_pool<Connection>& pool() noexcept { return pool_; }

 private:
  using lease = typename resp::connection_pool<Connection>::lease;

  // A call's body, never throwing (see "Exceptions" in the file comment): what it throws fails
  // every key of the call (chunk_status::error: a put's key is then "unknown", a get's unread). The lanes
  // have all returned by then (lane_crew::run throws only before it starts one, and a lane catches its own).
  template <class Body>
  std::error_code guarded(std::span<chunk_status> status, const char* command, Body&& body) noexcept {
    try {
      return body();
    } catch (...) {
      const detail::exception_words w = detail::current_exception_words();
      detail::store_fill(status, chunk_status::error);  // even a key answered: the caller sees a failed call
      const std::error_code ec = w.out_of_memory ? std::make_error_code(std::errc::not_enough_memory)
                                                 : make_error_code(errc::backend_error);
      try {
        codec_.count_call(ec,
                          where_ + ": " + command + ": " +
                              (w.out_of_memory ? "out of memory preparing the call" : "threw: " + w.what));
      } catch (...) {  // out of memory: the call is failed, unexplained
      }
      return ec;
    }
  }

  template <class Values>
  static resp::request_size size_class(const Values& values) noexcept {
    std::size_t bytes = 0;
    for (const auto& x : values) bytes += detail::payload_length(x);
    return bytes > small_request_bytes ? resp::request_size::large : resp::request_size::small;
  }
  // Bytes each value puts in flight (header + payload): what a piece of the batch is cut by.
  template <class Values>
  std::vector<std::size_t> value_bytes(const Values& values) const {
    std::vector<std::size_t> b(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      b[i] =
          detail::payload_length(values[i]) + codec_.format().header_size(detail::payload_length(values[i]));
    return b;
  }

  // The batch in pieces (batch_spread.hpp) over up to as many pooled connections, each piece one
  // pipelined round trip: add(s, j, i, name) per key (j: its slot in the piece, i: the caller's
  // index), then status[i] = judge(s, j, i, reply, name) for each reply that came back. With
  // `bytes` empty (or no spread) the whole batch is one piece on one connection.
  template <class Add, class Judge>
  std::error_code run(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl,
                      resp::request_size kind, const std::vector<std::size_t>& bytes, Add&& add,
                      Judge&& judge) {
    if (keys.empty()) return {};
    detail::batch_pieces pieces;
    if (bytes.empty() || spread_.max_reply_bytes == 0)
      pieces.starts = {0, keys.size()};
    else
      pieces = detail::cut_batch(bytes, spread_.max_reply_bytes);
    const std::size_t usable =
        kind == resp::request_size::large ? pool_.size() - pool_.reserved_small() : pool_.size();
    const std::size_t cap = spread_.max_connections == 0 ? usable : std::min(usable, spread_.max_connections);
    std::vector<lease> leases;
    std::string why;  // a deadline already passed, a server down, or no connection free in time
    std::error_code aec =
        pool_.acquire_up_to(kind, std::min(pieces.count(), std::max<std::size_t>(cap, 1)), dl, leases, &why);
    if (!aec && expired(dl))
      aec = make_error_code(errc::timeout), why = "the deadline passed while waiting for a pooled connection";
    if (aec) {
      std::fill(status.begin(), status.end(), detail::remote_codec::unfinished(aec));
      codec_.count_call(aec, where_ + ": " + why);
      return aec;
    }
    std::atomic<std::size_t> next{0};
    std::vector<std::error_code> failed(leases.size());
    auto lane = [&](std::size_t k) noexcept {
      detail::remote_scratch& s = scratch_[leases[k].index()];
      Connection& conn = leases[k].conn();
      for (std::size_t p; (p = next.fetch_add(1)) < pieces.count();) {
        const std::size_t first = pieces.starts[p], last = pieces.starts[p + 1];
        std::error_code ec;
        try {
          s.size_for(last - first);
          for (std::size_t i = first; i < last; ++i) {
            s.names[i - first] = codec_.key_text(keys[i]);
            add(s, i - first, i, s.names[i - first]);
          }
          ec = conn.execute(s.batch, dl);
          for (std::size_t i = first; i < last; ++i) {
            const std::size_t j = i - first;
            status[i] = j < s.batch.completed() ? judge(s, j, i, s.batch.reply(j), s.names[j])
                                                : detail::remote_codec::unfinished(ec);
          }
          if (ec) codec_.count_call(ec, conn.last_error());
        } catch (const std::bad_alloc&) {
          ec = std::make_error_code(std::errc::not_enough_memory);
          for (std::size_t i = first; i < last; ++i) status[i] = chunk_status::error;
          try {  // the lane is noexcept: not even the words may throw out of it
            codec_.count_call(ec, where_ + ": out of memory preparing a batch");
          } catch (...) {
          }
        }
        if (ec) {  // this connection stops here: the other lanes take the pieces left
          failed[k] = ec;
          return;
        }
      }
    };
    std::vector<std::size_t> ids(leases.size());
    for (std::size_t k = 0; k < leases.size(); ++k) ids[k] = leases[k].index();
    crew_.run(ids, lane);
    std::error_code ec;
    for (const auto& e : failed)
      if (e && (!ec || e == errc::timeout)) ec = e;
    // Pieces no lane took: every lane failed (or the deadline passed) before them.
    const std::size_t taken = std::min(next.load(), pieces.count());
    if (taken < pieces.count()) {
      if (!ec || expired(dl)) ec = make_error_code(errc::timeout);
      std::fill(status.begin() + static_cast<std::ptrdiff_t>(pieces.starts[taken]), status.end(),
                detail::remote_codec::unfinished(ec));
    }
    return ec;
  }

  detail::remote_codec codec_;
  std::string where_;
  resp::connection_pool<Connection> pool_;
  std::vector<detail::remote_scratch> scratch_;
  batch_spread spread_;
  detail::lane_crew crew_;
};

}  // namespace kvtier
