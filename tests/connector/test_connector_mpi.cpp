// The connector across MPI processes, one real redis-server per rank (started by that rank):
// a prompt computed and saved, then loaded into every rank's pages byte for byte; then a byte
// flipped in one layer group of one rank's value: every rank agrees to recompute from that
// chunk. Every rank's recorded collectives are identical (compared by hash across processes).
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "comm/mpi_world.hpp"
#include "connector/connector_rig.hpp"
#include "kvtier/comm/mpi.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/url.hpp"
#include "kvtier/store/remote_store.hpp"
#include "support/redis_server.hpp"

using namespace kvtier;
using namespace kvtier::test;
using l2_store = remote_store<resp::asio_connection>;

namespace {

constexpr std::size_t T = rig_chunk_tokens;
constexpr std::uint32_t per_group = 2;

std::uint64_t calls_hash(const std::vector<comm::collective_call>& calls) {
  std::uint64_t h = calls.size();
  for (const auto& c : calls)
    for (std::uint64_t v : {std::uint64_t(c.op), std::uint64_t(c.root), c.bytes, std::uint64_t(c.type),
                            std::uint64_t(c.reduce), std::uint64_t(c.group_depth)})
      h = kvtier::detail::step_fp_mix(h, v);
  return h;
}

// Every rank's value of `v` (MPI_Allgather on the world).
std::vector<std::uint64_t> gather(std::uint64_t v) {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(w));
  MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

struct mpi_outcome {
  std::uint64_t cached = 0, loaded_end = 0, errors = 0, wrong = 0, calls = 0;
  // This rank's own reasons for the load (errors(id)): how many, and the chunk of the first
  // one that names a corrupt value (none_named when none does).
  std::uint64_t load_reasons = 0, corrupt_chunk = none_named;
  static constexpr std::uint64_t none_named = ~std::uint64_t{0};
};

// One rank's lifecycle; `flip_on` (a rank) flips the last byte of its first owned chunk's value.
mpi_outcome run_rank(redis_server& srv, int flip_on) {
  comm::recording<comm::mpi_communicator> ctrl(mpi_world(MPI_COMM_WORLD, {}));
  const rank_t r = ctrl.rank(), W = ctrl.size();
  const modulo_ownership own(W);
  const key_namespace ns = rig_ns(own.geometry());
  l2_store store(ns, resp::connection_options{.server = resp::parse_url(srv.url()).value},
                 value_format::v2(layer_group_bytes(rig_layout(), T, per_group)));
  host_kv_cache cache(rig_layout());
  connector_options opt = rig_options();
  opt.layers_per_group = per_group;
  connector conn(chunker<>(ns), own, store, ctrl, cache.view(), opt);
  const std::vector<token_id> prompt = rig_prompt(6 * T + 7, 40 + flip_on);
  mpi_outcome out;
  REQUIRE(compute_and_save(conn, cache, 1, prompt));
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's saves are in before anyone looks
  if (static_cast<int>(r) == flip_on) {
    const std::string key = remote_key_text(ns, chunker<>(ns).keys(prompt)[r]);
    std::string len = srv.call({"STRLEN", key});
    if (!len.empty() && len[0] == ':') len.erase(0, 1);
    const std::string at = std::to_string(std::stoll(len) - 1);
    const std::string last = srv.call({"GETRANGE", key, at, at});
    srv.call({"SETRANGE", key, at, std::string(1, static_cast<char>(last.empty() ? 1 : last.back() ^ 0x20))});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto plan = lookup_agreed(conn, 2, prompt);
  REQUIRE(plan);
  out.cached = plan->cached_tokens;
  host_kv_cache::sequence seq;
  REQUIRE(cache.reserve(seq, prompt.size()));
  if (plan->tokens_to_load()) {
    REQUIRE_FALSE(conn.load(2, slots_of(cache, seq, prompt.size())));
    REQUIRE(step_until(conn, [&] { return conn.load_result(2).has_value(); }));
    const auto o = conn.load_result(2);
    out.loaded_end = o->loaded_end_token;
    out.errors = conn.load_errors(2).size();
    out.wrong = wrong_bytes(cache, seq, o->load_first_token, o->loaded_end_token);
    for (const request_error& e : conn.errors(2)) {
      if (e.what != request_error::stage::load) continue;
      ++out.load_reasons;
      if (e.ec == errc::corrupt_value && out.corrupt_chunk == mpi_outcome::none_named)
        out.corrupt_chunk = e.chunk;
    }
  }
  conn.finish(2);
  out.calls = calls_hash(ctrl.calls());
  return out;
}

void check_same(const mpi_outcome& o) {
  for (std::uint64_t v : gather(o.cached)) CHECK(v == o.cached);
  for (std::uint64_t v : gather(o.loaded_end)) CHECK(v == o.loaded_end);
  for (std::uint64_t v : gather(o.errors)) CHECK(v == o.errors);
  for (std::uint64_t v : gather(o.calls)) CHECK(v == o.calls);
  CHECK(o.wrong == 0);
}

}  // namespace

TEST_CASE("connector over MPI: a saved prompt loads into every rank's pages byte for byte", "[mpi]") {
  redis_server srv;  // this rank's own server
  const mpi_outcome o = run_rank(srv, -1);
  check_same(o);
  CHECK(o.cached == 6 * T);
  CHECK(o.loaded_end == 6 * T);
  CHECK(o.errors == 0);
  CHECK(o.load_reasons == 0);
}

TEST_CASE("connector over MPI: a flipped byte on one rank's server is recomputed from its chunk everywhere",
          "[mpi]") {
  redis_server srv;
  const mpi_outcome o = run_rank(srv, 1);
  check_same(o);
  CHECK(o.cached == 6 * T);
  CHECK(o.loaded_end == 1 * T);  // rank 1 owns chunk 1
  CHECK(o.errors == 5);
  // Only the rank whose server held the flipped byte has a reason, and it names the chunk.
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r == 1) {
    CHECK(o.corrupt_chunk == 1);
  } else {
    CHECK(o.load_reasons == 0);
  }
}

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return 2;
  const int rc = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return rc;
}
