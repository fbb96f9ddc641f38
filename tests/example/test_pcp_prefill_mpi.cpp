// pcp_prefill as 4 MPI processes (`mpiexec -n 4 pcp_prefill --mpi`) beside its thread form
// (`--world 4`): against 4 real redis-servers (one per rank, on consecutive loopback ports for
// the 'resp://127.0.0.1:{rank+BASE}' template) and against the embedded model L2. The engine
// verifies every loaded byte in each rank's paged cache; the summary JSON (stdout's last line,
// printed by rank 0) counts mismatched chunks summed over the processes in "errors". Both forms
// must report 0 errors, the same hit fraction, and summary JSON with the same keys.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "json_line.hpp"
#include "support/run_command.hpp"

namespace {

using ran = kvtier::test::command_result;
using kvtier::test::four_servers;

ran run(const std::string& cmd) { return kvtier::test::run_command(cmd); }

/// The summary JSON: the last non-empty line of stdout.
pcp::json_value summary_of(const ran& r) {
  std::string last;
  for (std::size_t at = 0; at < r.out.size();) {
    const std::size_t nl = std::min(r.out.find('\n', at), r.out.size());
    if (nl > at) last = r.out.substr(at, nl - at);
    at = nl + 1;
  }
  pcp::json_value v;
  std::string err;
  INFO(r.out);
  REQUIRE(pcp::parse_json(last, v, err));
  REQUIRE(v.kind == pcp::json_value::object);
  return v;
}

std::vector<std::string> keys_of(const pcp::json_value& v) {
  std::vector<std::string> k;
  for (const auto& m : v.members) k.push_back(m.first);
  std::sort(k.begin(), k.end());
  return k;
}

double num(const pcp::json_value& v, const char* key) {
  const pcp::json_value* x = v.find(key);
  REQUIRE(x != nullptr);
  REQUIRE(x->kind == pcp::json_value::number);
  return x->num;
}

const std::string bin = PCP_PREFILL_BIN;
// The oversubscribe and run-as-root flags let 4 ranks run on a 2-core CI machine as root.
std::string threads(const std::string& args) { return bin + " --world 4 " + args; }
std::string processes(const std::string& args) {
  return std::string(MPIEXEC_BIN) + " -n 4 --oversubscribe --allow-run-as-root " + bin + " --mpi " + args;
}

/// Runs both forms (`between` in between) and checks what they must share.
void compare(
    const std::string& args, const std::function<void()>& between = [] {}) {
  const ran t = run(threads(args));
  between();
  const ran p = run(processes(args));
  INFO("threads:\n" << t.out << "\nprocesses:\n" << p.out);
  REQUIRE(t.rc == 0);
  REQUIRE(p.rc == 0);
  // The process form really ran as 4 processes, and rank 0 alone printed the report.
  CHECK(p.out.find("W = 4, ") != std::string::npos);
  CHECK(p.out.find("ranks as processes (MPI)") != std::string::npos);
  CHECK(p.out.find("\"ttft_p50_s\"") == p.out.rfind("\"ttft_p50_s\""));  // one summary JSON line
  const auto st = summary_of(t), sp = summary_of(p);
  CHECK(keys_of(st) == keys_of(sp));
  CHECK(keys_of(sp).size() >= 12);
  CHECK(num(st, "errors") == 0);
  CHECK(num(sp, "errors") == 0);
  CHECK(num(st, "failed_l2_calls") == 0);
  CHECK(num(sp, "failed_l2_calls") == 0);
  // Primed with the whole trace, every full chunk loads: the fraction is set by the chunking.
  CHECK(num(sp, "hit_token_fraction") > 0.9);
  CHECK(num(sp, "hit_token_fraction") == num(st, "hit_token_fraction"));
}

}  // namespace

TEST_CASE("pcp_prefill as 4 MPI processes against 4 real redis-servers", "[mpi][integration]") {
  four_servers srv;
  compare("--generate hit-heavy --requests 12 --prime --quiet --load-timeout-s 30 --fetch-workers 2 --l2 " +
              srv.url(),
          [&] {  // the processes load what their own priming stored
            for (auto& s : srv.s) REQUIRE(s->call({"FLUSHALL"}) == "OK");
          });
  // Every rank stored its owned chunks in its own server.
  for (auto& s : srv.s) CHECK(s->call({"DBSIZE"}) != "0");
}

TEST_CASE("pcp_prefill as 4 MPI processes on the embedded model L2", "[mpi]") {
  for (const char* mode : {"async", "sync"}) {
    INFO(mode);
    compare(std::string("--generate hit-heavy --requests 12 --prime --quiet --l2-model-instances 4 --mode ") +
            mode);
  }
}
