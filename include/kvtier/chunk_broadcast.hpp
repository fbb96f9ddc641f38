// kvtier/chunk_broadcast.hpp: the load protocol that moves loaded chunks from their owners to every rank.
//
// Each rank fetched (part of) the chunks it owns; its fetch may have been cut short
// by eviction, a timeout or an error. chunk_broadcast then runs on every rank:
//   1. one all-reduce (min) agrees on the loaded prefix: the longest prefix of the
//      prompt whose every chunk was loaded by its owner;
//   2. every chunk below that prefix moves from its owner to every rank's
//      destination buffer; nothing at or past it is touched.
// The collectives issued depend only on the agreed prefix, W, the ownership
// policy and the mode, so every rank issues the same sequence.
//
//   kvtier::modulo_ownership own(W);
//   kvtier::chunk_span_buffers bufs{sources, destinations};   // per rank
//   kvtier::broadcast_params p{.n_chunks = 64, .chunk_tokens = 256, .chunk_bytes = 12'400'000,
//                              .mode = kvtier::broadcast_mode::grouped, .request_id = req};
//   std::uint64_t loaded = kvtier::rank_answer_loaded(own, comm.rank(), 64, 256, n_loaded_owned);
//   auto r = kvtier::chunk_broadcast(comm, own, loaded, bufs, p, kvtier::deadline_after(2s));
//   if (r.ec) recompute_from(0); else recompute_from(r.agreed_tokens);
//
// Modes (collective counts for P agreed chunks; 64 chunks and W = 8 give 65 / 9 / 2):
//   per_chunk: one broadcast per chunk from its owner: 1 + P collectives.
//   grouped:   one group per owner that owns chunks below P, holding that owner's
//              broadcasts: 1 + (number of such owners) <= 1 + W. Zero-copy.
//   gathered:  each owner packs its chunks into its equal-sized slot of a staging
//              buffer (padded to the largest owner's share), one in-place
//              all-gather, then every rank unpacks: 1 + (P > 0) collectives, at
//              the cost of two local copies per chunk and a staging buffer of
//              gathered_staging_bytes() (backend memory).
//
// The all-reduce also carries a validity flag and a fingerprint of the
// parameters, so a rank with invalid arguments, or ranks whose n_chunks,
// chunk_tokens, chunk_bytes, mode, request_id or ownership geometry differ, make
// every rank return errc::invalid_argument at the same point instead of
// desynchronising. On any error the result's agreed_tokens is 0 (recompute
// everything); destination bytes below the would-be prefix may then be partial.
//
// "Every rank ends with the same agreed_tokens", per backend (the failure
// contract of communicator.hpp):
//   - in-process (rounds fail together): every rank returns the same result, error
//     or success, always.
//   - MPI and NCCL: a collective can complete on some ranks and fail on others, so
//     the protocol ends with a confirmation (one more all-reduce, on backends
//     whose rounds do not fail together): a rank that failed anywhere before it
//     has poisoned/aborted its communicator and never confirms, so its peers'
//     confirmation fails by their deadline and every rank returns an error. A
//     failure injected into any collective of one rank ends with an error on
//     every rank (tests/comm/test_comm_mpi.cpp, the property test). The one case
//     left is the deadline race inside the confirmation itself: a rank whose
//     deadline passes after every peer contributed reports an error (and poisons)
//     while its peers succeed; their next collective on that world then fails.
//     An engine therefore runs the collectives of the prefill that follows on the
//     same world (or ends the request on any later error): no rank's computation
//     can complete from a prefix its peers did not also agree on.
//
// Control and data communicators: the overload taking (ctrl, data, ...) runs the
// agreement and the confirmation on `ctrl` (host memory: MPI or in-process) and
// moves the bytes on `data` (NCCL, or the same host world), keeping the small
// agreement off the GPU. A rank whose moves fail on `data` still confirms on
// `ctrl` (with "failed"), so every rank learns of it at once and `ctrl` stays
// aligned; the moves stop a quarter of the time left (1 ms..500 ms) before dl to
// leave time for that. Both must have the same rank and size.
//
//   auto r = kvtier::chunk_broadcast(mpi, nccl, own, loaded, bufs, p, dl);
//
// broadcast_params::sources_ready (optional) runs on each rank before the agreement,
// e.g. to order an NCCL data stream after the event of the kernel that filled the
// sources (nccl_communicator::order_after); its failure fails every rank there.
//
// Pipelined variant: pipelined_broadcast runs the same two steps in stages while
// the fetch is still running (each stage: one agreement, then the newly agreed
// chunks), so the first chunks move while later ones are still being fetched. Its
// collectives, too, derive only from agreed values. In-process with a simulated
// fetch (bench_chunk_broadcast) it finished 1.3-1.9x sooner than fetch-then-broadcast.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "kvtier/comm/broadcast_group.hpp"
#include "kvtier/comm/communicator.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/ownership.hpp"

namespace kvtier {

enum class broadcast_mode : std::uint8_t { per_chunk, grouped, gathered };

constexpr std::string_view to_string(broadcast_mode m) noexcept {
  switch (m) {
    case broadcast_mode::per_chunk:
      return "per_chunk";
    case broadcast_mode::grouped:
      return "grouped";
    case broadcast_mode::gathered:
      return "gathered";
  }
  return "?";
}

/// One rank's view of the chunk bytes (backend memory):
/// source(c) = the owner's loaded chunk c (only called on c's owner, for c below
/// the agreed prefix; may be the same memory as destination(c));
/// destination(c) = this rank's buffer for chunk c (only called for c below the
/// agreed prefix). Both must be chunk_bytes long.
template <class B>
concept chunk_buffers = requires(B& b, std::size_t c) {
  { b.source(c) } -> std::convertible_to<std::span<const std::byte>>;
  { b.destination(c) } -> std::convertible_to<std::span<std::byte>>;
};

/// chunk_buffers over two vectors of spans indexed by chunk (sources may hold
/// empty spans for chunks this rank does not own).
struct chunk_span_buffers {
  std::vector<std::span<const std::byte>> sources;
  std::vector<std::span<std::byte>> destinations;
  std::span<const std::byte> source(std::size_t c) const {
    return c < sources.size() ? sources[c] : std::span<const std::byte>{};
  }
  std::span<std::byte> destination(std::size_t c) const {
    return c < destinations.size() ? destinations[c] : std::span<std::byte>{};
  }
};

/// Which load a chunk_broadcast belongs to (e.g. the engine's request number).
/// It has no default on purpose: a broadcast_params that omits it does not
/// compile, so the guard it feeds (see broadcast_params::request_id) cannot be
/// switched off by forgetting it.
struct load_id {
  constexpr load_id(std::uint64_t v) noexcept : value(v) {}  // NOLINT: implicit from the caller's id
  std::uint64_t value;
  friend constexpr bool operator==(load_id, load_id) = default;
};

/// Parameters every rank must pass identically (staging excepted).
struct broadcast_params {
  std::size_t n_chunks = 0;        ///< chunks of the request
  std::uint64_t chunk_tokens = 0;  ///< tokens per chunk (> 0)
  std::size_t chunk_bytes = 0;     ///< bytes per chunk (> 0)
  broadcast_mode mode = broadcast_mode::per_chunk;
  /// gathered mode only: this rank's staging buffer in backend memory, at least
  /// gathered_staging_bytes(owners, n_chunks, chunk_bytes) bytes.
  std::span<std::byte> staging{};
  /// Which load this is (e.g. the engine's request number); required. Folded into
  /// the agreement's fingerprint: a rank that fell one load behind its peers (it
  /// skipped a call) fails the agreement on every rank instead of pairing its
  /// broadcasts with another request's.
  load_id request_id;
  /// Optional: called on this rank before the agreement (each step, for
  /// pipelined_broadcast) to order the moves after whatever fills the sources, e.g.
  /// `[&](kvtier::deadline) { return nccl_data.order_after(scatter_done); }` (an event of
  /// the engine's stream; kvtier/comm/nccl.hpp). An error becomes this rank's local
  /// problem: every rank then fails at the agreement, before any move.
  std::function<std::error_code(deadline)> sources_ready{};
};

struct broadcast_result {
  std::error_code ec;               ///< first error; comm.last_error() explains collective ones
  std::uint64_t agreed_tokens = 0;  ///< every rank holds tokens [0, agreed_tokens); 0 on error
  std::size_t agreed_chunks = 0;    ///< agreed_tokens / chunk_tokens
  std::size_t collectives = 0;      ///< collectives issued by this call (a group counts once)
  std::string message;              ///< why, when ec is set
};

/// This rank's loaded prefix, in tokens, after it loaded the first `loaded_owned`
/// of its owned chunks (in ascending order): the start token of its first owned
/// chunk not loaded, or n_chunks * chunk_tokens when all its owned chunks loaded
/// (a rank that owns none reports the full length, never 0).
template <ownership_policy P>
std::uint64_t rank_answer_loaded(const P& owners, rank_t rank, std::size_t n_chunks,
                                 std::uint64_t chunk_tokens, std::size_t loaded_owned) {
  std::size_t k = 0;
  for (std::size_t c = 0; c < n_chunks; ++c) {
    if (static_cast<rank_t>(owners.owner(c)) != rank) continue;
    if (k++ == loaded_owned) return static_cast<std::uint64_t>(c) * chunk_tokens;
  }
  return static_cast<std::uint64_t>(n_chunks) * chunk_tokens;
}

/// Chunks each owner holds among the first `n` chunks.
template <ownership_policy P>
std::vector<std::size_t> owner_counts(const P& owners, std::size_t n) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(owners.world_size()), 0);
  for (std::size_t c = 0; c < n; ++c) ++counts[static_cast<std::size_t>(owners.owner(c))];
  return counts;
}

/// Staging bytes the gathered mode needs on every rank for up to n_chunks chunks;
/// SIZE_MAX when that does not fit in a size_t (no staging buffer is then large enough).
template <ownership_policy P>
std::size_t gathered_staging_bytes(const P& owners, std::size_t n_chunks, std::size_t chunk_bytes) {
  const auto counts = owner_counts(owners, n_chunks);
  const std::size_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  const auto world = static_cast<std::size_t>(owners.world_size());
  // Saturate: a wrapped product would let any staging buffer pass the size check.
  if (most != 0 && chunk_bytes > SIZE_MAX / most) return SIZE_MAX;
  const std::size_t slice = most * chunk_bytes;
  if (slice != 0 && world > SIZE_MAX / slice) return SIZE_MAX;
  return world * slice;
}

/// Collectives chunk_broadcast issues (on success) for `agreed_chunks` chunks;
/// `confirmed`: plus the closing confirmation (backends whose rounds do not fail together).
template <ownership_policy P>
std::size_t expected_collectives(broadcast_mode mode, const P& owners, std::size_t agreed_chunks,
                                 bool confirmed = false) {
  const std::size_t c = confirmed ? 1 : 0;
  switch (mode) {
    case broadcast_mode::per_chunk:
      return c + 1 + agreed_chunks;
    case broadcast_mode::grouped: {
      const auto counts = owner_counts(owners, agreed_chunks);
      return c + 1 + static_cast<std::size_t>(std::count_if(counts.begin(), counts.end(), [](auto n) {
               return n > 0;
             }));
    }
    case broadcast_mode::gathered:
      return c + 1 + (agreed_chunks > 0 ? 1 : 0);
  }
  return 0;
}

namespace detail {
inline std::uint64_t fp_mix(std::uint64_t h, std::uint64_t v) noexcept {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

/// What is wrong with this rank's arguments ("" if nothing). Every buffer the
/// protocol may touch lies below this rank's own loaded prefix (the agreed prefix
/// is never larger), so checking those up front keeps later failures symmetric.
template <ownership_policy P, chunk_buffers B>
std::string validate(rank_t me, rank_t world, const P& owners, B& buffers, const broadcast_params& p,
                     std::uint64_t loaded_tokens) {
  if (p.chunk_tokens == 0 || p.chunk_bytes == 0) return "chunk_tokens and chunk_bytes must be > 0";
  if (static_cast<rank_t>(owners.world_size()) != world)
    return "ownership world size " + std::to_string(owners.world_size()) + " != communicator size " +
           std::to_string(world);
  if (p.mode == broadcast_mode::gathered &&
      p.staging.size() < gathered_staging_bytes(owners, p.n_chunks, p.chunk_bytes))
    return "staging buffer smaller than gathered_staging_bytes()";
  const std::uint64_t total = static_cast<std::uint64_t>(p.n_chunks) * p.chunk_tokens;
  const std::size_t mine = static_cast<std::size_t>(std::min(loaded_tokens, total) / p.chunk_tokens);
  for (std::size_t c = 0; c < mine; ++c) {
    if (std::span<std::byte>(buffers.destination(c)).size() != p.chunk_bytes)
      return "destination(" + std::to_string(c) + ") is not chunk_bytes long";
    if (static_cast<rank_t>(owners.owner(c)) == me &&
        std::span<const std::byte>(buffers.source(c)).size() != p.chunk_bytes)
      return "source(" + std::to_string(c) + ") is not chunk_bytes long";
  }
  return {};
}

/// Runs broadcast_params::sources_ready, if set; what went wrong, or "".
inline std::string sources_ready_problem(const broadcast_params& p, deadline dl) {
  if (!p.sources_ready) return {};
  if (auto ec = p.sources_ready(dl)) return "sources_ready: " + ec.message();
  return {};
}

/// Parameters all ranks must share, folded into one number.
template <ownership_policy P>
std::uint64_t fingerprint(const P& owners, const broadcast_params& p) {
  std::uint64_t fp =
      fp_mix(fp_mix(fp_mix(p.n_chunks, p.chunk_tokens), p.chunk_bytes), static_cast<std::uint64_t>(p.mode));
  fp = fp_mix(fp, p.request_id.value);
  for (char ch : owners.geometry()) fp = fp_mix(fp, static_cast<unsigned char>(ch));
  return fp;
}

/// The agreement: one all-reduce (min) of [loaded prefix, ok, fp, ~fp, extra...]
/// (min of fp and of ~fp give the min and max fingerprint). On success
/// v[0] is the agreed loaded prefix in tokens; otherwise res holds the error.
template <comm::communicator C, std::size_t N>
bool agree(C& comm, std::uint64_t (&v)[N], const std::string& local_problem, broadcast_result& res,
           deadline dl) {
  ++res.collectives;
  if (auto ec = kvtier::comm::all_reduce(comm, std::span<const std::uint64_t>(v), std::span<std::uint64_t>(v),
                                         kvtier::comm::reduce_op::min, dl)) {
    res.ec = ec;
    res.message = "agreement: " + std::string(comm.last_error());
    return false;
  }
  if (v[1] == 0 || v[2] != ~v[3]) {
    res.ec = errc::invalid_argument;
    res.message = !local_problem.empty() ? local_problem
                  : v[1] == 0            ? "another rank passed invalid arguments"
                                         : "ranks passed different broadcast parameters";
    return false;
  }
  return true;
}

/// Whether the protocol must end with a confirmation on the control communicator.
template <class Ctrl, class Data>
inline constexpr bool needs_confirm = !(comm::rounds_fail_together<Ctrl> && comm::rounds_fail_together<Data>);

/// The closing confirmation: one all-reduce (min) of "my moves succeeded". A rank
/// whose control communicator failed never gets here; its peers fail here by dl.
template <comm::communicator C>
bool confirm(C& ctrl, bool moved, broadcast_result& res, deadline dl) {
  ++res.collectives;
  std::uint64_t ok = moved ? 1 : 0;
  if (auto ec = comm::all_reduce_value(ctrl, ok, comm::reduce_op::min, dl)) {
    if (!res.ec) res.ec = ec, res.message = "confirmation: " + std::string(ctrl.last_error());
    return false;
  }
  if (ok == 0 && !res.ec) {
    res.ec = errc::backend_error;
    res.message = "confirmation: another rank failed to move its chunks";
  }
  return ok != 0;
}

/// Problems of a (ctrl, data) pair: both must be the same rank of the same world size.
template <comm::communicator Ctrl, comm::communicator Data>
std::string pair_problem(const Ctrl& ctrl, const Data& data) {
  if (static_cast<rank_t>(ctrl.rank()) == static_cast<rank_t>(data.rank()) &&
      static_cast<rank_t>(ctrl.size()) == static_cast<rank_t>(data.size()))
    return {};
  return "control communicator is rank " + std::to_string(ctrl.rank()) + " of " +
         std::to_string(ctrl.size()) + " but data communicator is rank " + std::to_string(data.rank()) +
         " of " + std::to_string(data.size());
}

/// Moves chunks [begin, end) from their owners to every rank in p.mode; the
/// collectives depend only on begin, end, W, the ownership policy and the mode.
template <comm::communicator C, ownership_policy P, chunk_buffers B>
std::error_code move_chunks(C& comm, const P& owners, B& buffers, const broadcast_params& p,
                            std::size_t begin, std::size_t end, broadcast_result& res, deadline dl) {
  const rank_t me = static_cast<rank_t>(comm.rank());
  const rank_t world = static_cast<rank_t>(comm.size());
  auto fail = [&](std::error_code ec, const char* what) {
    res.ec = ec;
    res.message = std::string(what) + ": " + std::string(comm.last_error());
    return ec;
  };
  auto source = [&](std::size_t c, rank_t root) {
    return root == me ? std::span<const std::byte>(buffers.source(c)) : std::span<const std::byte>{};
  };
  switch (p.mode) {
    case broadcast_mode::per_chunk:
      for (std::size_t c = begin; c < end; ++c) {
        const rank_t root = static_cast<rank_t>(owners.owner(c));
        ++res.collectives;
        if (auto ec = comm.broadcast(source(c, root), buffers.destination(c), root, dl))
          return fail(ec, "per-chunk broadcast");
      }
      break;
    case broadcast_mode::grouped:
      for (rank_t o = 0; o < world; ++o) {
        const auto owns = [&](std::size_t c) { return static_cast<rank_t>(owners.owner(c)) == o; };
        bool any = false;
        for (std::size_t c = begin; c < end && !any; ++c) any = owns(c);
        if (!any) continue;  // an owner with no chunk below the prefix: no group (agreed on every rank)
        ++res.collectives;
        const std::error_code ec = kvtier::comm::broadcast_group(
            comm,
            [&](auto&& broadcast) {
              for (std::size_t c = begin; c < end; ++c)
                if (owns(c)) broadcast(source(c, o), buffers.destination(c), o);
            },
            dl);
        if (ec) return fail(ec, "grouped broadcast");
      }
      break;
    case broadcast_mode::gathered: {
      if (begin >= end) break;
      std::vector<std::size_t> slot(end - begin);  // chunk c's index within its owner's slot
      std::vector<std::size_t> seen(world, 0);
      for (std::size_t c = begin; c < end; ++c)
        slot[c - begin] = seen[static_cast<std::size_t>(owners.owner(c))]++;
      const std::size_t slice = *std::max_element(seen.begin(), seen.end()) * p.chunk_bytes;
      std::span<std::byte> all = p.staging.first(slice * world);
      std::span<std::byte> mine = all.subspan(slice * me, slice);
      for (std::size_t c = begin; c < end; ++c) {
        if (static_cast<rank_t>(owners.owner(c)) != me) continue;
        if (auto ec = comm.local_copy(mine.subspan(slot[c - begin] * p.chunk_bytes, p.chunk_bytes),
                                      buffers.source(c), dl))
          return fail(ec, "gathered pack");  // local only: peers fail at the all-gather by their deadline
      }
      ++res.collectives;
      if (auto ec = comm.all_gather(mine, all, dl)) return fail(ec, "gathered all-gather");
      for (std::size_t c = begin; c < end; ++c) {
        const std::size_t o = static_cast<std::size_t>(owners.owner(c));
        if (auto ec =
                comm.local_copy(buffers.destination(c),
                                all.subspan(o * slice + slot[c - begin] * p.chunk_bytes, p.chunk_bytes), dl))
          return fail(ec, "gathered unpack");
      }
      break;
    }
  }
  return {};
}
/// The protocol on a control and a data communicator (the same object for the single form).
template <comm::communicator Ctrl, comm::communicator Data, ownership_policy P, chunk_buffers B>
broadcast_result run_protocol(Ctrl& ctrl, Data& data, const P& owners, std::uint64_t loaded_tokens,
                              B& buffers, const broadcast_params& p, deadline dl) {
  broadcast_result res;
  const rank_t me = static_cast<rank_t>(ctrl.rank());
  const rank_t world = static_cast<rank_t>(ctrl.size());
  const std::uint64_t total = static_cast<std::uint64_t>(p.n_chunks) * p.chunk_tokens;
  // Local validation; its outcome travels in the agreement so that all ranks see it.
  std::string problem = pair_problem(ctrl, data);
  if (problem.empty()) problem = validate(me, world, owners, buffers, p, loaded_tokens);
  if (problem.empty()) problem = sources_ready_problem(p, dl);
  const std::uint64_t fp = fingerprint(owners, p);
  std::uint64_t v[4] = {std::min(loaded_tokens, total), problem.empty() ? 1u : 0u, fp, ~fp};
  if (!agree(ctrl, v, problem, res, dl)) return res;
  const std::size_t n = static_cast<std::size_t>(v[0] / p.chunk_tokens);
  const bool one = static_cast<const void*>(&ctrl) == static_cast<const void*>(&data);
  // Two communicators: the moves stop a little before dl, so that a rank whose peer
  // failed on `data` still has time to confirm "failed" on `ctrl` and keep it aligned.
  deadline move_dl = dl;
  if (needs_confirm<Ctrl, Data> && !one)
    move_dl = dl - std::clamp<clock::duration>(time_left(dl) / 4, std::chrono::milliseconds(1),
                                               std::chrono::milliseconds(500));
  const bool moved = !move_chunks(data, owners, buffers, p, 0, n, res, move_dl);
  if constexpr (needs_confirm<Ctrl, Data>) {
    // One communicator that failed is poisoned: a confirmation would only fail again.
    if ((moved || !one) && !confirm(ctrl, moved, res, dl)) return res;
  }
  if (!moved) return res;
  res.agreed_chunks = n;
  res.agreed_tokens = static_cast<std::uint64_t>(n) * p.chunk_tokens;
  return res;
}

}  // namespace detail

/// Runs the load protocol on this rank. See the file comment.
template <comm::communicator C, ownership_policy P, chunk_buffers B>
broadcast_result chunk_broadcast(C& comm, const P& owners, std::uint64_t loaded_tokens, B& buffers,
                                 const broadcast_params& p, deadline dl) {
  return detail::run_protocol(comm, comm, owners, loaded_tokens, buffers, p, dl);
}

/// The load protocol with the agreement on `ctrl` and the chunk moves on `data`
/// (same rank, same world size). See the file comment.
template <comm::communicator Ctrl, comm::communicator Data, ownership_policy P, chunk_buffers B>
broadcast_result chunk_broadcast(Ctrl& ctrl, Data& data, const P& owners, std::uint64_t loaded_tokens,
                                 B& buffers, const broadcast_params& p, deadline dl) {
  return detail::run_protocol(ctrl, data, owners, loaded_tokens, buffers, p, dl);
}

/// The load protocol in stages, overlapping the broadcast with the fetch: while a
/// rank's fetch is still running, every rank calls step() in lockstep with what it
/// has loaded so far; each step agrees on the loaded prefix (one all-reduce) and
/// moves the chunks that became agreed since the previous step. done() turns true
/// on every rank at the same step: when the prefix reached n_chunks, or a rank whose
/// fetch has finished stops it from growing. A step issues 1 + (collectives of the
/// newly agreed range) collectives, derived only from agreed values.
///
///   kvtier::pipelined_broadcast pb(comm, own, bufs, params);
///   while (!pb.done()) pb.step(loaded_tokens_now(), fetch_finished(), dl);
///   auto r = pb.result();   // as chunk_broadcast's; r.collectives sums all steps
template <comm::communicator C, ownership_policy P, chunk_buffers B>
class pipelined_broadcast {
 public:
  pipelined_broadcast(C& comm, const P& owners, B& buffers, broadcast_params p)
      : comm_(&comm), owners_(&owners), buffers_(&buffers), p_(p) {}

  bool done() const noexcept { return done_; }
  const broadcast_result& result() const noexcept { return res_; }
  /// Chunks agreed and moved so far, as this rank saw it. On backends whose rounds
  /// fail together (in-process) every rank holds them. On MPI and NCCL a move can
  /// complete here and fail on a peer, so they are confirmed only by the next
  /// step's agreement (a peer that failed never joins it: this rank's step then
  /// fails) or, after the last step, by the final confirmation: use these chunks
  /// early only where a later failure of the load can still be undone (e.g. start
  /// attention kernels, but let result() decide what the request keeps).
  std::size_t agreed_chunks() const noexcept { return res_.agreed_chunks; }
  /// Chunks every rank is known to hold: agreed_chunks() on backends whose rounds fail
  /// together; elsewhere the chunks of all steps before the last one that every rank
  /// joined (the agreement of step k confirms the moves of step k-1), and
  /// result().agreed_chunks once done() without error.
  std::size_t confirmed_chunks() const noexcept { return confirmed_; }

  /// One stage. `loaded_tokens`: this rank's loaded prefix now (never below what
  /// it reported before); `fetch_done`: it will not grow any more.
  const broadcast_result& step(std::uint64_t loaded_tokens, bool fetch_done, deadline dl) {
    if (done_) return res_;
    const rank_t me = static_cast<rank_t>(comm_->rank());
    const rank_t world = static_cast<rank_t>(comm_->size());
    const std::uint64_t total = static_cast<std::uint64_t>(p_.n_chunks) * p_.chunk_tokens;
    std::string problem = detail::validate(me, world, *owners_, *buffers_, p_, loaded_tokens);
    if (problem.empty() && std::min(loaded_tokens, total) < res_.agreed_tokens)
      problem = "loaded prefix went backwards below the agreed prefix";
    if (problem.empty()) problem = detail::sources_ready_problem(p_, dl);
    const std::uint64_t fp = detail::fingerprint(*owners_, p_);
    const std::uint64_t loaded = std::min(loaded_tokens, total);
    // v[4]: the smallest loaded prefix among ranks whose fetch is done (the most the prefix can still reach).
    std::uint64_t v[5] = {loaded, problem.empty() ? 1u : 0u, fp, ~fp, fetch_done ? loaded : total};
    if (!detail::agree(*comm_, v, problem, res_, dl)) return finish_with_error();
    // Every rank joined this agreement, so every rank's earlier moves succeeded.
    confirmed_ = res_.agreed_chunks;
    const std::size_t n = static_cast<std::size_t>(v[0] / p_.chunk_tokens);
    if (detail::move_chunks(*comm_, *owners_, *buffers_, p_, res_.agreed_chunks, n, res_, dl))
      return finish_with_error();
    res_.agreed_chunks = n;
    res_.agreed_tokens = static_cast<std::uint64_t>(n) * p_.chunk_tokens;
    done_ = n == p_.n_chunks || static_cast<std::size_t>(v[4] / p_.chunk_tokens) <= n;
    // Each step's agreement confirms the previous step's moves; the last step's need one more.
    if constexpr (detail::needs_confirm<C, C>) {
      if (done_ && !detail::confirm(*comm_, true, res_, dl)) return finish_with_error();
      if (done_) confirmed_ = n;
    } else {
      confirmed_ = n;  // rounds fail together: a move that succeeded here succeeded everywhere
    }
    return res_;
  }

 private:
  const broadcast_result& finish_with_error() {
    done_ = true;
    res_.agreed_chunks = 0;  // as chunk_broadcast: recompute everything
    res_.agreed_tokens = 0;
    confirmed_ = 0;
    return res_;
  }

  C* comm_;
  const P* owners_;
  B* buffers_;
  broadcast_params p_;
  broadcast_result res_;
  std::size_t confirmed_ = 0;
  bool done_ = false;
};

}  // namespace kvtier
