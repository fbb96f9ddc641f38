// kvtier/store/chunk_store.hpp: the contract every chunk store meets.
//
// A store holds opaque chunk payloads under chunk keys. All calls are batched
// (one call per rank per request, not per chunk), take an absolute deadline, and
// report one status per key in a caller-provided span; they never throw on I/O.
//
//   std::vector<kvtier::chunk_status> st(keys.size());
//   std::error_code ec = store.get(keys, destinations, st, kvtier::deadline_after(50ms));
//   // st[i] == chunk_status::hit  -> destinations[i] holds exactly the stored bytes
//   // (put reports chunk_status::stored for each key it wrote)
//   // anything else               -> destinations[i] must not be used (recompute it)
//
// Contract for every implementation:
//  - status.size() == keys.size() (and == dst/src size); a size mismatch is
//    errc::invalid_argument and no key is touched.
//  - get: dst[i].size() is the payload length the caller expects. A stored value
//    of another length is chunk_status::corrupt, never a partial copy reported as
//    a hit. Bytes in a non-hit destination are unspecified and never reported.
//  - The returned error_code is empty when the call itself worked (misses are not
//    errors). A whole-batch failure (connection lost, deadline passed) returns the
//    code AND marks every unfinished key timeout or error: no key is left unset.
//  - The call returns by its deadline (plus scheduling noise), whatever the peer does.
//  - put: a key reported chunk_status::stored was written. A put that returns
//    errc::timeout (or marks a key timeout/error) may STILL have stored that value:
//    the request may have reached the server before the deadline passed. Treat
//    such a key as "unknown", never as "absent"; a later get verifies it anyway.
//  - Deadline rule: a deadline bounds how long a call waits; it is not a validity
//    window for the answer. A call whose work finished (every reply read and
//    verified) reports ok even if it returns a few ms past its deadline (the
//    scheduler ran it late); a call that is still waiting when the deadline
//    passes stops and reports timeout.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <system_error>

#include "kvtier/chunk_status.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

/// The batched store interface: exists, get into caller spans, put from caller spans.
template <class S>
concept chunk_store = requires(S& s, std::span<const chunk_key> keys,
                               std::span<const std::span<std::byte>> dst,
                               std::span<const std::span<const std::byte>> src,
                               std::span<chunk_status> status, deadline dl) {
  { s.exists(keys, status, dl) } -> std::same_as<std::error_code>;
  { s.get(keys, dst, status, dl) } -> std::same_as<std::error_code>;
  { s.put(keys, src, status, dl) } -> std::same_as<std::error_code>;
};

/// A store that can also read a batch group-major (remote_store::get_by_group): layer group 0
/// of every key, then group 1, ..., calling back after each round with the leading groups of
/// each key verified so far; format() says how many payload bytes that is
/// (value_format::groups_end). fetch_queue_options::stream_groups uses it for loads.
template <class S>
concept group_streaming_store = chunk_store<S> &&
    requires(S& s, std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
             std::span<chunk_status> status, deadline dl,
             const std::function<void(std::span<const std::size_t>)>& on_round) {
  { s.get_by_group(keys, dst, status, dl, on_round) } -> std::same_as<std::error_code>;
  { s.format() } -> std::convertible_to<value_format>;
};

/// A store whose put can take each value's checksums computed by the caller
/// (remote_store::put_prehashed: digests in format()'s layout, e.g. from a value_hasher run while
/// the caller copied the bytes), so the put makes no pass of its own over the payload. The
/// connector's saver hashes inside its gather for such a store.
template <class S>
concept prehashed_put_store = chunk_store<S> &&
    requires(S& s, std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
             std::span<const value_digest> digests, std::span<chunk_status> status, deadline dl) {
  { s.put_prehashed(keys, src, digests, status, dl) } -> std::same_as<std::error_code>;
  { s.format() } -> std::convertible_to<value_format>;
};

/// One value given in pieces (e.g. where a chunk lies in an engine's pages: kv_pieces): its
/// bytes are the pieces' concatenation, in order.
using value_pieces = std::span<const std::span<const std::byte>>;

/// A store whose put can take each value in pieces and write it from where they lie, with no
/// copy into one buffer first (remote_store::put_pieces: the pieces go to the socket with
/// writev; memory_store::put_pieces: copied once, into the stored value). `digests` is empty
/// or, for a prehashed_put_store, one per value as for put_prehashed. The connector's saver
/// puts a chunk from the pages this way when the pages hold it in pieces of a few KiB or more.
template <class S>
concept piecewise_put_store = chunk_store<S> &&
    requires(S& s, std::span<const chunk_key> keys, std::span<const value_pieces> values,
             std::span<const value_digest> digests, std::span<chunk_status> status, deadline dl) {
  { s.put_pieces(keys, values, digests, status, dl) } -> std::same_as<std::error_code>;
};

}  // namespace kvtier
