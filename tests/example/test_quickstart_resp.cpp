// The quickstart against 4 real redis-servers (one per rank), as threads and then as 4 MPI
// processes on the same servers. Both modes name their keys by one namespace (quickstart_ns) and
// write value format 2, so the processes' cold engine finds every chunk the threads stored; before,
// the --mpi path used another kv_format and format 1, and found nothing.
#include <catch2/catch.hpp>
#include <string>

#include "support/run_command.hpp"

namespace {

const std::string bin = QUICKSTART_BIN;
const std::string cold_miss = "engine A (cold)         prompt 10340 tokens: cached prefix 0, loaded 0,";
const std::string all_loaded =
    "prompt 10340 tokens: cached prefix 10240, loaded 10240, recomputed 100, wrong bytes 0";

}  // namespace

TEST_CASE("quickstart against 4 redis-servers: threads, then --mpi processes on the same values",
          "[integration]") {
  kvtier::test::four_servers srv;
  const kvtier::test::command_result t = kvtier::test::run_command(bin + " " + srv.url());
  INFO(t.out);
  REQUIRE(t.rc == 0);
  REQUIRE(t.out.find(cold_miss) != std::string::npos);
  REQUIRE(t.out.find("engine B (same prompt)  " + all_loaded) != std::string::npos);
  for (auto& s : srv.s) REQUIRE(s->call({"DBSIZE"}) != "0");  // every rank stored its share
#ifdef MPIEXEC_BIN
  const kvtier::test::command_result p = kvtier::test::run_command(
      std::string(MPIEXEC_BIN) + " -n 4 --oversubscribe --allow-run-as-root " + bin + " --mpi " + srv.url());
  INFO(p.out);
  REQUIRE(p.rc == 0);
  REQUIRE(p.out.find("engine A (cold)         " + all_loaded) != std::string::npos);
  REQUIRE(p.out.find("engine B (same prompt)  " + all_loaded) != std::string::npos);
#endif
}
