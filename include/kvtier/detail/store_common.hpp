// kvtier/detail/store_common.hpp: small helpers shared by the stores and the
// fetch queue (argument checks, status filling, presence views).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <system_error>

#include "kvtier/chunk_status.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"

namespace kvtier::detail {

/// Sets every entry of `status` to `s`.
inline void store_fill(std::span<chunk_status> status, chunk_status s) noexcept {
  std::fill(status.begin(), status.end(), s);
}

/// The common prologue of a batched store call: sizes agree (else invalid_argument,
/// nothing touched) and the deadline has not passed (else every key timeout).
inline std::error_code store_precheck(std::size_t keys, std::size_t other, std::span<chunk_status> status,
                                      deadline dl) noexcept {
  if (keys != other || keys != status.size()) return make_error_code(errc::invalid_argument);
  if (expired(dl)) {
    store_fill(status, chunk_status::timeout);
    return make_error_code(errc::timeout);
  }
  return {};
}

/// A presence view (kvtier/lookup.hpp) over statuses: entry k is present iff hit.
struct store_hit_view {
  std::span<const chunk_status> status;
  bool operator[](std::size_t k) const noexcept { return status[k] == chunk_status::hit; }
};

/// A store's last failure in its own words when it keeps them (remote_store, cluster_store,
/// tiered_store over one of those: a member last_error()), else empty.
template <class Store>
std::string store_words(const Store& s) {
  if constexpr (requires {
                  { s.last_error() } -> std::convertible_to<std::string>;
                })
    return std::string(s.last_error());
  else
    return {};
}

/// What a caught exception says, for a reason in words: its what() ("std::bad_alloc" for an
/// allocation that failed), or "an exception of unknown type"; out_of_memory for std::bad_alloc.
struct exception_words {
  std::string what;  // empty when even these words could not be allocated
  bool out_of_memory = false;
};

/// Only inside a catch handler: the words of the exception being handled. Never throws.
inline exception_words current_exception_words() noexcept {
  exception_words w;
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    w.out_of_memory = true;
    try {
      w.what = e.what();
    } catch (...) {
    }
  } catch (const std::exception& e) {
    try {
      w.what = e.what();
    } catch (...) {
    }
  } catch (...) {
    try {
      w.what = "an exception of unknown type";
    } catch (...) {
    }
  }
  return w;
}

}  // namespace kvtier::detail
