// kvtier/connector/detail/errors.hpp: this rank's reasons (kvtier::request_error) for what
// ended short in kvtier::connector (kvtier/connector.hpp): a lookup's or a fetch's failed keys,
// a deadline that passed, a failed move, scatter or save, each in words that name the rank, the
// stage and the chunk, with the store's own words when it keeps them. Local only: no reason is
// ever agreed or sent to a peer. Not public API.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/chunk_status.hpp"
#include "kvtier/connector/detail/state.hpp"
#include "kvtier/connector/types.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/fetch_types.hpp"

namespace kvtier::detail {

/// Keeps `e` as r's reason for its stage unless r has one already (the first explains the rest).
/// Under the connector's mutex: the saver and mover threads note reasons too.
inline void note_error_locked(connector_request& r, request_error e) {
  for (const request_error& x : r.errors)
    if (x.what == e.what) return;
  r.errors.push_back(std::move(e));
}

/// A request_error with its message: "rank R: <stage> of chunk C: <why> (store: <words>)", the
/// store's words only when it has some and they add to `why`.
inline request_error describe_error(request_id id, request_error::stage what, rank_t rank, std::size_t chunk,
                                    std::error_code ec, std::string_view why,
                                    std::string_view store_words = {}) {
  std::string m = "rank " + std::to_string(rank) + ": " + std::string(to_string(what)) + " of chunk " +
                  std::to_string(chunk) + ": " + std::string(why);
  if (!store_words.empty() && store_words != why) m += " (store: " + std::string(store_words) + ")";
  return {id, what, chunk, ec, std::move(m)};
}

/// Why one key of a store call failed, from its status and the call's error (the call's error
/// says most: a lost connection, a refused AUTH; a corrupt value is named as such). A miss has
/// no error code: a read found the key gone since its lookup, a put (`put`) was not kept.
inline std::pair<std::error_code, std::string> key_failure(chunk_status s, std::error_code call,
                                                           bool put = false) {
  if (s == chunk_status::corrupt)
    return {make_error_code(errc::corrupt_value), "corrupt value (header or checksum mismatch)"};
  if (call) return {call, call.message()};
  switch (s) {
    case chunk_status::miss:
      return {{}, put ? "not stored (the store kept nothing)" : "not in the store (gone since its lookup)"};
    case chunk_status::timeout:
      return {make_error_code(errc::timeout), "deadline exceeded"};
    default:
      return {make_error_code(errc::backend_error), "store error"};
  }
}

/// A store call's failure as request r's reason: its first key at index k of `chunks` (the
/// prompt chunk of each key) whose status fails `ok`, else the call's error; none when neither.
/// The queue's own words for the call's error, when it has some (a store that threw: "the
/// store threw: <what()>"), replace the error code's.
template <class Store, class Ok>
std::optional<request_error> store_call_failure(const connector_request& r, request_error::stage what,
                                                rank_t rank, const fetch_result& res,
                                                const std::vector<std::size_t>& chunks, Ok ok, Store& store) {
  if (chunks.empty()) return std::nullopt;
  for (std::size_t k = 0; k < res.status.size() && k < chunks.size(); ++k) {
    if (ok(res.status[k])) continue;
    auto [ec, why] = key_failure(res.status[k], res.ec);
    if (ec == res.ec && !res.message.empty()) why = res.message;
    return describe_error(r.id, what, rank, chunks[k], ec, why, store_words(store));
  }
  if (!res.ec) return std::nullopt;
  return describe_error(r.id, what, rank, chunks.front(), res.ec,
                        res.message.empty() ? res.ec.message() : res.message, store_words(store));
}

/// This rank's reason for lookup r answering short: `res` is its result, or nullptr when the
/// lookup deadline (`timeout`) passed first. A miss is an answer, not a failure.
template <class Store>
std::optional<request_error> lookup_failure(const connector_request& r, const fetch_result* res, rank_t rank,
                                            std::chrono::milliseconds timeout, Store& store) {
  if (r.owned.empty()) return std::nullopt;
  if (!res)
    return describe_error(r.id, request_error::stage::lookup, rank, r.owned.front(),
                          make_error_code(errc::timeout),
                          "no answer by the lookup deadline (" + std::to_string(timeout.count()) + " ms)");
  return store_call_failure(
      r, request_error::stage::lookup, rank, *res, r.owned,
      [](chunk_status s) { return s == chunk_status::hit || s == chunk_status::miss; }, store);
}

/// This rank's reason for its fetch of load r ending short: `res` is its result, or nullptr
/// when the load deadline passed first (`p`: its progress then). A load the engine cancelled
/// (cancel_load: r.cancelled_by_engine) has no failure; any other fetch that ended short has
/// one, whatever its statuses say (a store that threw completes error, never cancelled).
template <class Store>
std::optional<request_error> fetch_failure(const connector_request& r, const fetch_result* res,
                                           const fetch_progress& p, rank_t rank, Store& store) {
  if (r.fetch_chunks.empty() || r.cancelled_by_engine) return std::nullopt;
  if (!res) {
    std::size_t k = 0;  // the first key not landed
    while (k + 1 < r.fetch_chunks.size() && k < p.landed_keys.size() && p.landed_keys[k]) ++k;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(r.load_dl - r.load_started).count();
    return describe_error(r.id, request_error::stage::load, rank, r.fetch_chunks[k],
                          make_error_code(errc::timeout),
                          "not fetched by the load deadline (" + std::to_string(ms) + " ms)");
  }
  return store_call_failure(
      r, request_error::stage::load, rank, *res, r.fetch_chunks,
      [](chunk_status s) { return s == chunk_status::hit; }, store);
}

/// A failed step agreement as request r's reason: `why` is connector::last_step_error()'s
/// words (the communicator's error, or which of the ranks' inputs differed).
inline request_error agreement_failure(const connector_request& r, request_error::stage what, rank_t rank,
                                       std::size_t chunk, std::error_code ec, std::string_view why) {
  return describe_error(r.id, what, rank, chunk, ec, why);
}

}  // namespace kvtier::detail
