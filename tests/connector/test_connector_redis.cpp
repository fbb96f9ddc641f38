// The connector's lifecycle against real redis-server processes, one per rank (remote_store,
// value format 2 with one checksum per layer group): loaded byte for byte, and a byte flipped
// in one layer group of one stored value shortens the agreed prefix on every rank to that chunk;
// a save puts chunks from the pages (put_pieces, with the checksums computed in the pages) and a
// chunk in small pieces gathered, in one batch, and they load back byte for byte.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "connector/connector_rig.hpp"
#include "connector/pages_save.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/kv_copy.hpp"
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

struct redis_ranks {
  std::vector<std::unique_ptr<redis_server>> servers;
  explicit redis_ranks(rank_t W) {
    for (rank_t r = 0; r < W; ++r) servers.push_back(std::make_unique<redis_server>());
  }
  auto store_for(rank_t W) {
    return [this, W](rank_t r, memory_store&) {
      return std::make_unique<l2_store>(
          rig_ns(modulo_ownership(W).geometry()),
          resp::connection_options{.server = resp::parse_url(servers[r]->url()).value},
          value_format::v2(layer_group_bytes(rig_layout(), T, per_group)));
    };
  }
};

}  // namespace

TEST_CASE("connector on redis: a saved prompt loads into every rank's pages byte for byte", "[connector]") {
  for (bool two : {false, true}) {
    INFO("two communicators = " << two);
    constexpr rank_t W = 2;
    redis_ranks redis(W);
    load_scenario sc{.world = W, .two_comms = two};
    sc.opt.layers_per_group = per_group;
    const auto reps = run_load(sc, redis.store_for(W));
    for (const rank_load_report& rep : reps) {
      REQUIRE(rep.plan);
      CHECK(rep.plan->cached_tokens == 6 * T);
      REQUIRE(rep.outcome);
      CHECK(rep.outcome->complete());
      CHECK(rep.wrong == 0);
      CHECK(rep.calls == reps[0].calls);
    }
  }
}

TEST_CASE("connector on redis: a flipped byte in one layer group is recomputed from its chunk on every rank",
          "[connector]") {
  constexpr rank_t W = 2;
  redis_ranks redis(W);
  load_scenario sc{.world = W};
  sc.opt.layers_per_group = per_group;
  const std::vector<chunk_key> keys = chunker<>(rig_ns("mod:2")).keys(rig_prompt(sc.prompt_tokens));
  sc.after_save = [&](rank_t r) {
    if (r != 1) return;  // rank 1 owns chunk 1: flip the last byte of its value (the last layer group)
    const std::string key = remote_key_text(rig_ns("mod:2"), keys[1]);
    std::string len = redis.servers[1]->call({"STRLEN", key});
    if (!len.empty() && len[0] == ':') len.erase(0, 1);
    const long long offset = std::stoll(len) - 1;
    const std::string last =
        redis.servers[1]->call({"GETRANGE", key, std::to_string(offset), std::to_string(offset)});
    const std::string flipped(1, static_cast<char>(last.empty() ? 1 : last.back() ^ 0x20));
    redis.servers[1]->call({"SETRANGE", key, std::to_string(offset), flipped});
  };
  const auto reps = run_load(sc, redis.store_for(W));
  for (const rank_load_report& rep : reps) {
    REQUIRE(rep.plan);
    CHECK(rep.plan->cached_tokens == 6 * T);  // present: the lookup does not read values
    REQUIRE(rep.outcome);
    CHECK(rep.outcome->loaded_end_token == 1 * T);
    CHECK(rep.errors == std::vector<std::size_t>{1, 2, 3, 4, 5});
    CHECK(rep.wrong == 0);
    CHECK(rep.calls == reps[0].calls);
  }
}

TEST_CASE(
    "connector on redis: a save puts chunks from the pages with their checksums, a chunk in small "
    "pieces gathered, and loads back byte for byte",
    "[connector]") {
  redis_server srv;
  l2_store l2(rig_ns(modulo_ownership(1).geometry()),
              resp::connection_options{.server = resp::parse_url(srv.url()).value},
              value_format::v2(layer_group_bytes(rig_layout(), T, per_group)));
  require_save_from_pages_loads_back(l2, /*expect_digests=*/true);
  CHECK(l2.stats().bad_checksum == 0);
}
