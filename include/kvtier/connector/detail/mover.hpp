// kvtier/connector/detail/mover.hpp: the moves of kvtier::connector (kvtier/connector.hpp):
// the chunks a step agreed go owner -> every rank in one grouped broadcast per layer group on
// the data communicator, into the load's staging block, and each layer group is kv_scatter'ed
// into the pages as soon as its broadcast ended. Not public API.
//
// With a data communicator distinct from the control one the moves run on the mover's own
// threads (the engine computes meanwhile): one issues the broadcasts, the other scatters each
// layer group that has landed, in order, so the scatter of group g (a CPU copy) runs while the
// broadcast of group g + 1 (mostly waiting on the peers and the transport) is in flight. With
// one communicator the moves run inside step(), one group after the other.
//
// A move's deadline. Moves are agreed on every rank, so being late must not fail them: a batch
// gets the later of its loads' deadlines and connector_options::move_timeout from its start
// (a reach agreed as a load's deadline passed is moved after it; with the load's deadline the
// move failed at once, and over MPI or NCCL poisoned the data communicator for every later load).
//
// A failed move. With connector_options::data_writes_after_failure (a data communicator that
// may still write a receive buffer after a call to it failed, e.g. MPI with
// mpi_options::stage = false), the staging blocks of a failed batch are never reused or freed:
// the communicator can then move bytes without staging copies of its own.
//
// Exceptions. Nothing a move throws (the data communicator, an allocation, a scatter's) leaves
// the mover's threads, where it would end the process, nor step() when the moves run there: a
// batch that throws fails like a batch whose communicator returned an error (its loads' moves
// failed, their outcome agreed at the next step), with the exception's words as the reason
// ("move of layer group 1: threw: <what()>"), and a scatter that throws fails its load's move.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/comm/broadcast_group.hpp"
#include "kvtier/comm/communicator.hpp"
#include "kvtier/connector/detail/errors.hpp"
#include "kvtier/connector/detail/state.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/ownership.hpp"

namespace kvtier::detail {

/// Chunks [begin, end) (relative to the load's first chunk) of one load, agreed in one step:
/// every layer group of them, or (connector_options::stream_groups) layer group `group` only.
struct move_item {
  static constexpr std::uint32_t all_groups = ~std::uint32_t{0};
  connector_request_ptr r;
  std::size_t begin = 0, end = 0;
  std::uint32_t group = all_groups;
  bool moves(std::uint32_t g) const noexcept { return group == all_groups || group == g; }
};

/// One layer group of a batch, broadcast and waiting for its scatter.
struct landed_group {
  std::shared_ptr<const std::vector<move_item>> batch;
  std::uint32_t g = 0;
};

/// Staging blocks a communicator may still write after a failed call: held for the rest of the
/// process (reachable, so leak checkers stay quiet), never handed out or freed again.
inline void keep_forever(std::vector<std::shared_ptr<std::byte[]>> blocks) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<std::byte[]>> kept;
  std::lock_guard lock(mu);
  for (auto& b : blocks) kept.push_back(std::move(b));
}

template <comm::communicator Data, ownership_policy Own>
class connector_mover {
 public:
  /// `threaded`: run the moves on threads of the mover's own (a data communicator distinct
  /// from the control one); else submit() runs them at once, in the caller's thread.
  /// `keep_failed`: a failed batch's staging blocks are kept forever (counted in `quarantined`).
  /// `move_timeout`: the least time a batch gets from its start (connector_options::move_timeout).
  connector_mover(Data& data, const Own& own, const connector_geometry& geo, connector_shared& shared,
                  bool threaded, bool keep_failed, counter& quarantined,
                  clock::duration move_timeout = std::chrono::seconds(1))
      : data_(data),
        own_(own),
        geo_(geo),
        shared_(shared),
        threaded_(threaded),
        keep_failed_(keep_failed),
        quarantined_(quarantined),
        move_timeout_(move_timeout) {
    if (!threaded) return;
    scatterer_.start(
        [this](landed_group& job) {
          for (const move_item& m : *job.batch)
            if (m.moves(job.g)) scatter_group(*m.r, m.begin, m.end, job.g);
        },
        [this](landed_group& job) {
          if (job.batch) fail_bare(*job.batch);
        });
    worker_.start([this](std::vector<move_item>& batch) { run(batch); },
                  [this](std::vector<move_item>& batch) { fail_bare(batch); });
  }

  /// Moves what a step agreed (every rank submits the same batches in the same order).
  void submit(std::vector<move_item> batch) {
    if (batch.empty()) return;
    if (!worker_.running()) return run(batch);
    worker_.submit(std::move(batch));
  }

  /// Runs the batches already submitted and scatters what they moved, then joins the threads
  /// (idempotent).
  void stop() {
    worker_.stop();
    scatterer_.stop();
  }

 private:
  // The job boundary: a batch that throws fails (see "Exceptions" at the top of this file).
  void run(const std::vector<move_item>& items) {
    std::uint32_t g = 0;  // the layer group being moved
    try {
      run_groups(items, g);
    } catch (...) {
      const exception_words w = current_exception_words();
      if (keep_failed_) {  // the communicator may still write the blocks of the call that threw
        try {
          keep_failed_blocks(items);
        } catch (...) {  // out of memory: the blocks stay with their loads (and may be reused)
        }
      }
      std::string why;
      try {
        why = "move of layer group " + std::to_string(g) + ": threw: " + w.what;
      } catch (...) {
      }
      fail_batch(items,
                 w.out_of_memory ? std::make_error_code(std::errc::not_enough_memory)
                                 : make_error_code(errc::backend_error),
                 why);
    }
  }

  // Moves the batch group by group (`g`: the group being moved, for a reason if it throws).
  void run_groups(const std::vector<move_item>& items, std::uint32_t& g) {
    const auto batch = std::make_shared<const std::vector<move_item>>(items);
    const auto me = static_cast<rank_t>(data_.rank());
    // Agreed moves must not fail for being late (see connector_options::move_timeout).
    deadline dl = deadline_after(move_timeout_);
    for (const move_item& m : *batch) dl = std::max(dl, m.r->load_dl);
    for (g = 0; g < geo_.groups; ++g) {
      // A group no item moves issues nothing (the batch is agreed: the same on every rank).
      if (std::none_of(batch->begin(), batch->end(), [g](const move_item& m) { return m.moves(g); }))
        continue;
      // Every owner's chunks in one group, each broadcast in place in its staging block.
      const std::error_code ec = kvtier::comm::broadcast_group(
          data_,
          [&](auto&& broadcast) {
            for (const move_item& m : *batch)
              for (std::size_t i = m.begin; i < m.end && m.moves(g); ++i) {
                const auto owner = static_cast<rank_t>(own_.owner(m.r->first_chunk + i));
                const std::span<std::byte> s = geo_.staged_group(*m.r, i, g);
                broadcast(owner == me ? std::span<const std::byte>(s) : std::span<const std::byte>{}, s,
                          owner);
              }
          },
          dl);
      if (ec) {  // no later group of this batch runs: its failure is agreed at the next step
        if (keep_failed_) keep_failed_blocks(*batch);
        std::string why = "move of layer group " + std::to_string(g) + ": " + ec.message();
        if (const std::string words(data_.last_error()); !words.empty() && words != ec.message())
          why += " (" + words + ")";
        return fail_batch(*batch, ec, why);
      }
      if (threaded_)
        scatterer_.submit({batch, g});
      else
        for (const move_item& m : *batch)
          if (m.moves(g)) scatter_group(*m.r, m.begin, m.end, g);
    }
  }

  // Every load of a failed batch: its move failed, `why` (if any) its reason. Never throws (a
  // reason that cannot be allocated is dropped; the failure stands).
  void fail_batch(const std::vector<move_item>& batch, std::error_code ec, const std::string& why) noexcept {
    const auto me = static_cast<rank_t>(data_.rank());
    std::lock_guard lock(shared_.mu);
    for (const move_item& m : batch) {
      m.r->move_failed = true;
      if (why.empty()) continue;
      try {
        note_error_locked(*m.r, describe_error(m.r->id, request_error::stage::load, me,
                                               m.r->first_chunk + m.begin, ec, why));
      } catch (...) {
      }
    }
    shared_.landed.notify_all();
  }

  // serial_worker's last resort (run() and scatter_group() let nothing escape): the batch's
  // loads fail, so none waits for moves that will not come.
  void fail_bare(const std::vector<move_item>& batch) noexcept { fail_batch(batch, {}, {}); }

  // The failed batch's blocks (each once), out of the pool for good.
  void keep_failed_blocks(const std::vector<move_item>& batch) {
    std::vector<std::shared_ptr<std::byte[]>> blocks;
    for (const move_item& m : batch)
      if (m.r->staging && std::find(blocks.begin(), blocks.end(), m.r->staging) == blocks.end())
        blocks.push_back(m.r->staging);
    quarantined_.add(blocks.size());
    keep_forever(std::move(blocks));
  }

  // Scatters chunks [begin, end) of layer group g into the pages. Never throws: a scatter that
  // throws (kv_scatter allocates) fails the load's move like one that returned an error.
  void scatter_group(connector_request& r, std::size_t begin, std::size_t end, std::uint32_t g) noexcept {
    for (std::size_t i = begin; i < end; ++i) {
      std::error_code ec;
      exception_words thrown;
      bool threw = false;
      try {
        std::lock_guard gate(r.scatter_mu);
        if (r.abandoned) return;
        ec = kv_scatter(geo_.cache, geo_.chunk_slots(r.slots, r.first_chunk + i), geo_.staged_group(r, i, g),
                        geo_.group_layers(g));
      } catch (...) {
        thrown = current_exception_words();
        threw = true;
        ec = thrown.out_of_memory ? std::make_error_code(std::errc::not_enough_memory)
                                  : make_error_code(errc::backend_error);
      }
      std::lock_guard lock(shared_.mu);
      if (!ec) {
        r.group_landed[g] = i + 1;
      } else {
        r.move_failed = true;
        try {
          note_error_locked(
              r, describe_error(r.id, request_error::stage::load, static_cast<rank_t>(data_.rank()),
                                r.first_chunk + i, ec,
                                "scatter of layer group " + std::to_string(g) +
                                    " into the pages: " + (threw ? "threw: " + thrown.what : ec.message())));
        } catch (...) {  // out of memory: the failure stands without its reason
        }
      }
      shared_.landed.notify_all();
      if (ec) return;
    }
  }

  Data& data_;
  const Own& own_;
  const connector_geometry& geo_;
  connector_shared& shared_;
  const bool threaded_, keep_failed_;
  counter& quarantined_;
  clock::duration move_timeout_;
  // Last, the scatterer before the worker that feeds it: they stop (worker first) before the
  // members above go.
  serial_worker<landed_group> scatterer_;
  serial_worker<std::vector<move_item>> worker_;
};

}  // namespace kvtier::detail
