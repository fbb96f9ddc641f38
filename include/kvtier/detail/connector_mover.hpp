// kvtier/detail/connector_mover.hpp: the moves of kvtier::connector (kvtier/connector.hpp):
// the chunks a step agreed go owner -> every rank in one grouped broadcast per layer group on
// the data communicator, into the load's staging block, and each layer group is kv_scatter'ed
// into the pages as soon as its broadcast ended. Not public API.
//
// With a data communicator distinct from the control one the moves run on the mover's thread
// (the engine computes meanwhile); with one communicator they run inside step().
#pragma once

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/comm/communicator.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/connector_state.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/ownership.hpp"

namespace kvtier::detail {

/// Chunks [begin, end) (relative to the load's first chunk) of one load, agreed in one step.
struct move_item {
  connector_request_ptr r;
  std::size_t begin = 0, end = 0;
};

template <comm::communicator Data, ownership_policy Own>
class connector_mover {
 public:
  /// `threaded`: run the moves on a thread of the mover's own (a data communicator distinct
  /// from the control one); else submit() runs them at once, in the caller's thread.
  connector_mover(Data& data, const Own& own, const connector_geometry& geo, connector_shared& shared,
                  bool threaded)
      : data_(data), own_(own), geo_(geo), shared_(shared) {
    if (threaded) worker_.start([this](std::vector<move_item>& batch) { run(batch); });
  }

  /// Moves what a step agreed (every rank submits the same batches in the same order).
  void submit(std::vector<move_item> batch) {
    if (batch.empty()) return;
    if (!worker_.running()) return run(batch);
    worker_.submit(std::move(batch));
  }

  /// Runs the batches already submitted, then joins the thread (idempotent).
  void stop() { worker_.stop(); }

 private:
  void run(const std::vector<move_item>& batch) {
    const auto me = static_cast<rank_t>(data_.rank());
    deadline dl = deadline::min();
    for (const move_item& m : batch) dl = std::max(dl, m.r->load_dl);
    for (std::uint32_t g = 0; g < geo_.groups; ++g) {
      std::error_code ec = data_.group_start();
      for (const move_item& m : batch)
        for (std::size_t i = m.begin; i < m.end; ++i) {
          const auto owner = static_cast<rank_t>(own_.owner(m.r->first_chunk + i));
          const std::span<std::byte> s = geo_.staged_group(*m.r, i, g);
          const std::error_code b = data_.broadcast(
              owner == me ? std::span<const std::byte>(s) : std::span<const std::byte>{}, s, owner, dl);
          if (b && !ec) ec = b;
        }
      if (std::error_code e = data_.group_end(dl); e && !ec) ec = e;
      if (ec) {  // no later group of this batch runs: its failure is agreed at the next step
        std::lock_guard lock(shared_.mu);
        for (const move_item& m : batch) m.r->move_failed = true;
        shared_.landed.notify_all();
        return;
      }
      for (const move_item& m : batch) scatter_group(*m.r, m.begin, m.end, g);
    }
  }

  void scatter_group(connector_request& r, std::size_t begin, std::size_t end, std::uint32_t g) {
    for (std::size_t i = begin; i < end; ++i) {
      bool ok = true;
      {
        std::lock_guard gate(r.scatter_mu);
        if (r.abandoned) return;
        ok = !kv_scatter(geo_.cache, geo_.chunk_slots(r.slots, r.first_chunk + i), geo_.staged_group(r, i, g),
                         geo_.group_layers(g));
      }
      std::lock_guard lock(shared_.mu);
      if (ok)
        r.group_landed[g] = i + 1;
      else
        r.move_failed = true;
      shared_.landed.notify_all();
      if (!ok) return;
    }
  }

  Data& data_;
  const Own& own_;
  const connector_geometry& geo_;
  connector_shared& shared_;
  serial_worker<std::vector<move_item>> worker_;  // last: it stops before the members above go
};

}  // namespace kvtier::detail
