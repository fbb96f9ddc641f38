// The failure contract (tests/comm/conformance.hpp) on the in-process backend, and
// behind the recording and checked decorators, for worlds of 1, 2 and 4 rank threads.
#include <catch2/catch.hpp>

#include "comm/conformance.hpp"
#include "kvtier/comm/checked.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"

using namespace kvtier;
namespace conf = kvtier::test::conformance;

namespace {

template <class Wrap>
void run_suite() {
  using C = decltype(Wrap{}(std::declval<comm::inproc_communicator>()));
  for (const auto& k : conf::suite<conf::host_memory, C>::cases)
    for (rank_t w : {1u, 2u, 4u}) {
      conf::sink s;
      comm::inproc_world world(w);
      comm::run_ranks(world, [&](comm::inproc_communicator& c0) {
        C c = Wrap{}(std::move(c0));
        k.run(c, s);
      });
      INFO(k.name << ", W=" << w << "\n" << s.text());
      CHECK(s.empty());
      CHECK(world.pending_rounds() == 0u);
    }
}

struct plain {
  comm::inproc_communicator operator()(comm::inproc_communicator c) const { return c; }
};
struct recorded {
  comm::recording<comm::inproc_communicator> operator()(comm::inproc_communicator c) const {
    return comm::recording<comm::inproc_communicator>(std::move(c));
  }
};

}  // namespace

static_assert(comm::rounds_fail_together<comm::inproc_communicator>);
static_assert(comm::rounds_fail_together<comm::recording<comm::inproc_communicator>>);
static_assert(comm::rounds_fail_together<comm::checked<comm::inproc_communicator>>);

TEST_CASE("conformance: in-process backend", "[unit]") { run_suite<plain>(); }

TEST_CASE("conformance: in-process backend behind the recording decorator", "[unit]") {
  run_suite<recorded>();
}
