// kvtier/deployment_check.hpp: find configuration that differs between ranks once, at setup.
//
// A rank started with another ownership policy, chunk size, key namespace, value format
// or (kvtier::connector) layer grouping would otherwise load its chunks for every request and only then be refused
// by chunk_broadcast's agreement ("different broadcast parameters"), forever. Call
// agree_deployment() once, when the communicator (or the engine) is set up: one
// all-reduce (host memory, so the control communicator or NCCL both work) gathers
// every rank's fingerprint, and every rank returns the same verdict, naming the
// field that differs and the first rank whose value differs from rank 0's.
//
//   auto fp = kvtier::deployment_fingerprint::of(ns, owners, chunk_bytes, store.format());
//   auto r = kvtier::agree_deployment(comm, fp, kvtier::deadline_after(5s));
//   if (r.ec) throw std::runtime_error(r.message);
//   // e.g. "deployment check: ranks differ in chunk_bytes: rank 0 has 4096, rank 2 has 8192"
//
// It is a collective: every rank calls it at the same point, with the same world.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/comm/communicator.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

/// What every rank of one deployment must share. Build it with of(), or set the
/// fields by hand when a component is not used (leave it at its default on every rank).
struct deployment_fingerprint {
  std::uint64_t namespace_fingerprint = 0;  ///< key_namespace::fingerprint() (model, KV format, layout, ...)
  std::string ownership_geometry{};         ///< ownership_policy::geometry(), e.g. "mod:8"
  std::uint64_t chunk_tokens = 0;           ///< tokens per chunk
  std::uint64_t chunk_bytes = 0;            ///< bytes per chunk as moved by chunk_broadcast
  std::uint64_t value_format_version = 1;   ///< value_format::version the store writes and reads
  std::uint64_t value_group_bytes = 0;      ///< value_format::group_bytes
  std::uint64_t layers_per_group = 0;       ///< layers moved together (kvtier::connector; 0 elsewhere)
  std::uint64_t stream_groups = 0;          ///< 1: loads stream by layer group (kvtier::connector)

  template <ownership_policy P>
  static deployment_fingerprint of(const kvtier::key_namespace& ns, const P& owners, std::size_t chunk_bytes,
                                   value_format format = value_format::v1()) {
    return {ns.fingerprint(),  std::string(owners.geometry()), ns.chunk_tokens, chunk_bytes, format.version,
            format.group_bytes, 0, 0};
  }
};

struct deployment_check_result {
  std::error_code ec;   ///< invalid_argument when ranks differ; a collective's error otherwise
  std::string message;  ///< why, when ec is set (the same fields and ranks on every rank)
  std::string field;    ///< the first field that differs ("" when none or the collective failed)
  rank_t rank = 0;      ///< the first rank whose `field` differs from rank 0's
};

namespace detail {
/// Field names in the order they are reported (the most specific first: the key
/// namespace also covers chunk_tokens and the geometry, so it is named last).
inline constexpr std::array<std::string_view, 8> deployment_fields = {
    "ownership_geometry", "chunk_tokens",     "chunk_bytes",   "value_format_version", "value_group_bytes",
    "layers_per_group",   "stream_groups", "namespace_fingerprint"};
inline constexpr std::size_t geometry_field = 0, namespace_field = deployment_fields.size() - 1;

inline std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

inline std::array<std::uint64_t, deployment_fields.size()> deployment_row(const deployment_fingerprint& f) {
  return {fnv1a64(f.ownership_geometry), f.chunk_tokens,     f.chunk_bytes,  f.value_format_version,
          f.value_group_bytes,           f.layers_per_group, f.stream_groups, f.namespace_fingerprint};
}

/// How a field's value reads in a message: numbers as numbers, hashes in hex.
inline std::string deployment_value_text(std::size_t field, std::uint64_t v) {
  if (field != geometry_field && field != namespace_field) return std::to_string(v);
  static constexpr char hex[] = "0123456789abcdef";
  std::string s = field == geometry_field ? "geometry hash " : "namespace ";
  for (int i = 60; i >= 0; i -= 4) s += hex[(v >> i) & 0xf];
  return s;
}

/// The verdict from every rank's row (`table` holds world rows, rank-major).
/// Pure: every rank computes it from the same table, so every rank agrees.
inline deployment_check_result judge_deployment(std::span<const std::uint64_t> table, rank_t world,
                                                const deployment_fingerprint& mine, rank_t me) {
  deployment_check_result res;
  constexpr std::size_t F = deployment_fields.size();
  std::string differ;
  for (std::size_t f = 0; f < F; ++f) {
    for (rank_t r = 1; r < world; ++r) {
      const std::uint64_t v0 = table[f], vr = table[static_cast<std::size_t>(r) * F + f];
      if (v0 == vr) continue;
      if (res.field.empty()) {
        res.field = std::string(deployment_fields[f]);
        res.rank = r;
        differ = ": rank 0 has " + deployment_value_text(f, v0) + ", rank " + std::to_string(r) + " has " +
                 deployment_value_text(f, vr);
        if (f == geometry_field)
          differ += " (this rank, " + std::to_string(me) + ", has \"" + mine.ownership_geometry + "\")";
      } else {
        differ += "; also " + std::string(deployment_fields[f]);
      }
      break;
    }
  }
  if (!res.field.empty()) {
    res.ec = errc::invalid_argument;
    res.message = "deployment check: ranks differ in " + res.field + differ;
  }
  return res;
}
}  // namespace detail

/// Agrees on the deployment with every rank of `comm` (one all-reduce; see the file
/// comment). Returns invalid_argument and names the field and rank when ranks differ.
template <comm::communicator C>
deployment_check_result agree_deployment(C& comm, const deployment_fingerprint& mine, deadline dl) {
  constexpr std::size_t F = detail::deployment_fields.size();
  const rank_t world = static_cast<rank_t>(comm.size());
  const rank_t me = static_cast<rank_t>(comm.rank());
  // An all-gather over host memory: each rank fills its own row, the sum adds zeros elsewhere.
  std::vector<std::uint64_t> table(static_cast<std::size_t>(world) * F, 0);
  const auto row = detail::deployment_row(mine);
  std::copy(row.begin(), row.end(), table.begin() + static_cast<std::ptrdiff_t>(me * F));
  if (auto ec = comm::all_reduce(comm, std::span<const std::uint64_t>(table), std::span<std::uint64_t>(table),
                                 comm::reduce_op::sum, dl)) {
    deployment_check_result res;
    res.ec = ec;
    res.message = "deployment check: " + std::string(comm.last_error());
    return res;
  }
  return detail::judge_deployment(table, world, mine, me);
}

}  // namespace kvtier
