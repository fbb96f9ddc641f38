// agree_deployment: ranks whose configuration differs are found once, at setup, and
// every rank names the same field and rank.
#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/deployment_check.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

key_namespace test_ns() {
  return key_namespace{
      .model = "m", .kv_format = "bf16", .chunk_tokens = 256, .layout_version = 1, .ownership = "mod:3"};
}

// Runs agree_deployment on 3 ranks; `tweak(rank, fp)` changes one rank's fingerprint.
template <class Tweak>
std::vector<deployment_check_result> run3(Tweak tweak) {
  comm::inproc_world world(3);
  std::vector<deployment_check_result> out(3);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    auto fp = deployment_fingerprint::of(test_ns(), modulo_ownership(3), 4096, value_format::v2(1024));
    tweak(c.rank(), fp);
    out[c.rank()] = agree_deployment(c, fp, deadline_after(10s));
  });
  return out;
}

}  // namespace

TEST_CASE("agree_deployment: identical ranks agree with one collective", "[deployment]") {
  comm::inproc_world world(3);
  std::vector<deployment_check_result> out(3);
  std::vector<std::size_t> calls(3);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    comm::recording<comm::inproc_communicator&> rec(c);
    out[c.rank()] = agree_deployment(rec, deployment_fingerprint::of(test_ns(), modulo_ownership(3), 4096),
                                     deadline_after(10s));
    calls[c.rank()] = rec.calls().size();
  });
  for (rank_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << out[r].message);
    CHECK(!out[r].ec);
    CHECK(out[r].field.empty());
    CHECK(calls[r] == 1);
  }
}

TEST_CASE("agree_deployment: every rank names the field and the rank that differ", "[deployment]") {
  struct one_case {
    const char* field;
    void (*tweak)(deployment_fingerprint&);
  };
  const one_case cases[] = {
      {"chunk_bytes", [](deployment_fingerprint& f) { f.chunk_bytes = 8192; }},
      {"chunk_tokens", [](deployment_fingerprint& f) { f.chunk_tokens = 128; }},
      {"value_format_version", [](deployment_fingerprint& f) { f.value_format_version = 1; }},
      {"value_group_bytes", [](deployment_fingerprint& f) { f.value_group_bytes = 2048; }},
      {"ownership_geometry", [](deployment_fingerprint& f) { f.ownership_geometry = "block:2:3"; }},
      {"namespace_fingerprint",
       [](deployment_fingerprint& f) {
         auto ns = test_ns();
         ns.model = "other";
         f.namespace_fingerprint = ns.fingerprint();
       }},
  };
  for (const auto& k : cases) {
    for (rank_t odd : {rank_t{1}, rank_t{2}}) {
      const auto out = run3([&](rank_t r, deployment_fingerprint& f) {
        if (r == odd) k.tweak(f);
      });
      for (rank_t r = 0; r < 3; ++r) {
        INFO(k.field << ", odd rank " << odd << ", rank " << r << ": " << out[r].message);
        CHECK(out[r].ec == errc::invalid_argument);
        CHECK(out[r].field == k.field);
        CHECK(out[r].rank == odd);
        CHECK(out[r].message.find(std::string("differ in ") + k.field) != std::string::npos);
        CHECK(out[r].message.find("rank " + std::to_string(odd) + " has") != std::string::npos);
      }
    }
  }
}

TEST_CASE("agree_deployment: numbers read as numbers, the geometry names this rank's value", "[deployment]") {
  auto out = run3([](rank_t r, deployment_fingerprint& f) {
    if (r == 2) f.chunk_bytes = 8192;
  });
  CHECK(out[0].message == "deployment check: ranks differ in chunk_bytes: rank 0 has 4096, rank 2 has 8192");
  out = run3([](rank_t r, deployment_fingerprint& f) {
    if (r == 1) f.ownership_geometry = "block:2:3";
  });
  CHECK(out[1].message.find("this rank, 1, has \"block:2:3\"") != std::string::npos);
  CHECK(out[0].message.find("this rank, 0, has \"mod:3\"") != std::string::npos);
}

TEST_CASE("agree_deployment: a rank that never calls makes every caller time out", "[deployment]") {
  comm::inproc_world world(2);
  std::vector<deployment_check_result> out(2);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    if (c.rank() == 1) return;
    out[0] = agree_deployment(c, deployment_fingerprint{}, deadline_after(50ms));
  });
  CHECK(out[0].ec == errc::timeout);
  CHECK(out[0].message.rfind("deployment check: ", 0) == 0);
  CHECK(out[0].field.empty());
}
