// The MPI backend's failure paths across processes (ctest label `mpi`, 3 processes):
//  - create() that timed out on one rank: a late peer's create() and this rank's
//    retry pair with the pending MPI_Comm_idup and end with the same communicator;
//    a failed create() names this rank of the parent, not "rank 0 of 0";
//  - a poisoned data communicator keeps its first error through a grouped
//    chunk_broadcast (group_end only after a group_start that succeeded);
//  - recover(): every rank recreates its communicator and agrees on the request
//    index and the budget after one rank poisoned its own.
// Ranks are made late by point-to-point messages, never by sleeping.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/mpi_world.hpp"
#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/mpi.hpp"
#include "kvtier/comm/recover.hpp"

using namespace kvtier;
using namespace std::chrono_literals;
using kvtier::test::mpi_world;

namespace {
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
// Rank 0 tells every other rank that it is done with something (they wait for it).
void release_others() {
  int token = 1;
  for (int r = 1; r < world_size(); ++r) MPI_Send(&token, 1, MPI_INT, r, 77, MPI_COMM_WORLD);
}
void wait_for_rank0() {
  int token = 0;
  MPI_Recv(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}
}  // namespace

TEST_CASE("mpi: a create() that timed out pairs its retry with the late peers' create()", "[mpi]") {
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &parent);  // a parent of this case's own
  const int me = world_rank(), w = world_size();
  comm::mpi_communicator c;
  if (me == 0) {
    // The others are not there yet: this create() times out, its idup stays pending.
    const auto ec = comm::mpi_communicator::create(c, parent, deadline_after(50ms));
    CHECK(ec == errc::timeout);
    INFO(c.last_error());
    CHECK(c.last_error().find("on rank 0 of " + std::to_string(w)) != std::string::npos);
    CHECK(c.last_error().find("retry of create()") != std::string::npos);
    CHECK(comm::mpi_communicator::create_pending(parent));
    release_others();
  } else {
    wait_for_rank0();  // late on purpose: rank 0 has given up by now
    CHECK(!comm::mpi_communicator::create_pending(parent));
  }
  // Everyone (again, for rank 0) creates: the retry must pair with the pending idup.
  const auto ec = comm::mpi_communicator::create(c, parent, deadline_after(20s));
  INFO(c.last_error());
  REQUIRE(!ec);
  CHECK(!comm::mpi_communicator::create_pending(parent));
  CHECK(c.size() == static_cast<rank_t>(w));
  // The ranks hold the same communicator: a collective on it completes on every rank.
  std::uint64_t v = static_cast<std::uint64_t>(me) + 1;
  CHECK(!comm::all_reduce_value(c, v, comm::reduce_op::sum, deadline_after(20s)));
  CHECK(v == static_cast<std::uint64_t>(w) * (w + 1) / 2);
  // And the parent is in step again: its next collective pairs normally.
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, parent);
  CHECK(sum == w);
}

TEST_CASE("mpi: a poisoned data communicator keeps its first error through a grouped broadcast", "[mpi]") {
  comm::mpi_communicator ctrl = mpi_world(MPI_COMM_WORLD, {}), data = mpi_world(MPI_COMM_WORLD, {});
  const rank_t r = ctrl.rank(), w = ctrl.size();
  const modulo_ownership own(w);
  const std::size_t n = 2 * w, cb = 32;
  std::vector<std::byte> src(n * cb, static_cast<std::byte>(0x40 + r)), dst(n * cb);
  chunk_span_buffers b;
  for (std::size_t k = 0; k < n; ++k) {
    b.sources.push_back(std::span<const std::byte>(src).subspan(k * cb, cb));
    b.destinations.push_back(std::span<std::byte>(dst).subspan(k * cb, cb));
  }
  broadcast_params p{
      .n_chunks = n, .chunk_tokens = 8, .chunk_bytes = cb, .mode = broadcast_mode::grouped, .request_id = 9};
  data.abort("the engine gave up on this world");  // every rank: the data world is poisoned
  REQUIRE(data.first_error() == errc::backend_error);
  auto res = chunk_broadcast(ctrl, data, own, n * 8, b, p, deadline_after(20s));
  INFO(res.message);
  CHECK(res.ec == errc::backend_error);
  CHECK(res.agreed_tokens == 0u);
  CHECK(res.message.find("aborted: the engine gave up on this world") != std::string::npos);
  CHECK(res.message.find("group_end without group_start") == std::string::npos);
  CHECK(data.first_error() == errc::backend_error);  // not overwritten by a later misuse
  CHECK(data.last_error().find("aborted: the engine gave up") != std::string::npos);
  // A direct misuse on the poisoned communicator reports the first error, too.
  CHECK(data.group_end(deadline_after(1s)) == errc::backend_error);
  CHECK(data.first_error() == errc::backend_error);
  CHECK(data.last_error().find("aborted: the engine gave up") != std::string::npos);
  std::uint64_t v = 1;  // ctrl stayed aligned
  CHECK(!comm::all_reduce_value(ctrl, v, comm::reduce_op::sum, deadline_after(20s)));
  CHECK(v == w);
}

TEST_CASE("mpi: recover() recreates the communicator and realigns the request index and budget", "[mpi]") {
  comm::mpi_communicator c = mpi_world(MPI_COMM_WORLD, {});
  const rank_t me = c.rank(), w = c.size();
  // Request 0 on every rank.
  std::uint64_t v = 1;
  {
    const auto ec = comm::all_reduce_value(c, v, comm::reduce_op::sum, deadline_after(20s));
    INFO(c.last_error());
    REQUIRE(!ec);
  }
  // Request 1: rank 0 gave up before it (its communicator poisoned); it tells its peers, whose
  // call fails at once (not by its deadline: 20 s here, past which it would be a timeout) and
  // poisons theirs, naming rank 0.
  if (me == 0) {
    c.abort("request 1 failed on this rank");
  } else {
    CHECK(comm::all_reduce_value(c, v, comm::reduce_op::sum, deadline_after(20s)) == errc::backend_error);
    INFO(c.last_error());
    CHECK(c.last_error().find("rank 0 poisoned its communicator") != std::string::npos);
  }
  CHECK(c.poisoned());
  // The ranks are not in step on the request index: rank 0 goes on with 2, the last rank
  // believes it is at 5. Budgets differ too.
  const std::uint64_t next = me + 1 == w ? 5 : 2;
  const auto budget = std::chrono::milliseconds(me == 1 ? 300 : 900);
  auto rec = comm::recover(
      c,
      [](comm::mpi_communicator& fresh, deadline d) {
        return comm::mpi_communicator::create(fresh, MPI_COMM_WORLD, d);
      },
      next, budget, deadline_after(30s));
  INFO(rec.message);
  REQUIRE(!rec.ec);
  CHECK(rec.request == (w > 1 ? 5u : 2u));
  CHECK(rec.budget == std::chrono::duration_cast<clock::duration>(w > 1 ? 300ms : 900ms));
  CHECK(!c.poisoned());
  v = me;  // the recreated communicator works on every rank
  CHECK(!comm::all_reduce_value(c, v, comm::reduce_op::max, rec.local_deadline() + 20s));
  CHECK(v == w - 1);
}

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return 2;
  const int rc = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return rc;
}
