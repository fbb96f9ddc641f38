// Unit tests of the sans-io cluster routing (kvtier/resp/cluster.hpp): CRC16 and hash tags, the
// redirect replies, CLUSTER SLOTS / CLUSTER SHARDS parsed from wire bytes (whole and byte by
// byte), and resp+cluster:// URLs.
#include <rapidcheck.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "kvtier/resp/cluster.hpp"
#include "resp_codec/feed.hpp"
#include "support/property.hpp"

using namespace kvtier::resp;
using kvtier::errc;

namespace {

const std::size_t one_byte[] = {1};

// The one reply that `wire` encodes, parsed whole and byte by byte (both must agree).
value reply_of(std::string_view wire) {
  const auto whole = kvtier::test::parse_all(wire);
  const auto bytes = kvtier::test::parse_all(wire, one_byte);
  REQUIRE_FALSE(whole.ec);
  REQUIRE(whole.values.size() == 1);
  REQUIRE(bytes.values == whole.values);
  return whole.values[0];
}

const cluster_node from{"10.0.0.9", 7009};

}  // namespace

TEST_CASE("cluster: CRC16-XMODEM and hash slots match the cluster specification", "[unit]") {
  STATIC_REQUIRE(crc16("123456789") == 0x31C3);  // the spec's check value
  STATIC_REQUIRE(hash_slot("foo") == 12182);
  CHECK(hash_slot("bar") == 5061);
  CHECK(hash_slot("hello") == 866);
  CHECK(hash_slot("") == 0);
  // Hash tags: the text between the first '{' and the first '}' after it, when not empty.
  CHECK(hash_slot("{user1000}.following") == hash_slot("user1000"));
  CHECK(hash_slot("{user1000}.followers") == hash_slot("{user1000}.following"));
  CHECK(hash_slot("foo{}{bar}") == crc16("foo{}{bar}") % 16384);  // empty tag: the whole key
  CHECK(hash_slot("foo{{bar}}zap") == hash_slot("{bar"));         // from the first '{'
  CHECK(hash_slot("foo{bar}{zap}") == hash_slot("bar"));          // to the first '}'
  CHECK(hash_slot("x{") == crc16("x{") % 16384);
  CHECK(hash_slot("}{a}") == hash_slot("a"));
}

TEST_CASE("cluster: redirect replies", "[unit]") {
  auto r = parse_redirect("MOVED 3999 127.0.0.1:6381", from);
  CHECK(r.kind == redirect_kind::moved);
  CHECK(r.slot == 3999);
  CHECK(r.node == cluster_node{"127.0.0.1", 6381});
  r = parse_redirect("ASK 16383 node-3.example:7000", from);
  CHECK(r.kind == redirect_kind::ask);
  CHECK(r.slot == 16383);
  CHECK(r.node == cluster_node{"node-3.example", 7000});
  // IPv6: the port follows the last colon (bare or bracketed).
  CHECK(parse_redirect("MOVED 1 ::1:7001", from).node == cluster_node{"::1", 7001});
  CHECK(parse_redirect("MOVED 1 [::1]:7001", from).node == cluster_node{"::1", 7001});
  // Unknown endpoint: the node that sent the reply.
  CHECK(parse_redirect("MOVED 5 :7002", from).node == cluster_node{"10.0.0.9", 7002});
  CHECK(parse_redirect("ASK 5 ?:7002", from).node == cluster_node{"10.0.0.9", 7002});
  CHECK(parse_redirect("TRYAGAIN Multiple keys request during rehashing of slot", from).kind ==
        redirect_kind::tryagain);
  CHECK(parse_redirect("CLUSTERDOWN The cluster is down", from).kind == redirect_kind::clusterdown);
  CHECK(parse_redirect("CLUSTERDOWN", from).kind == redirect_kind::clusterdown);
  // Malformed redirects and other errors are plain errors, never a redirect to a made-up node.
  for (const char* bad :
       {"MOVED", "MOVED 3999", "MOVED 16384 127.0.0.1:6381", "MOVED -1 h:1", "MOVED x h:1", "MOVED 1 h",
        "MOVED 1 h:0", "MOVED 1 h:65536", "MOVED 1 h:12a", "MOVED 1 h:1 extra", "MOVED  1 h:1", "ASK 1",
        "ERR unknown command", "WRONGTYPE Operation", "MOVEDX 1 h:1", "moved 1 h:1", ""}) {
    INFO(bad);
    CHECK(parse_redirect(bad, from).kind == redirect_kind::none);
  }
}

TEST_CASE("cluster: CLUSTER SLOTS from wire bytes", "[unit]") {
  // Three masters, each with one replica; the third with RESP3-era metadata after its id; an
  // empty host (unknown endpoint) means the node that answered.
  const std::string wire =
      "*3\r\n"
      "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$"
      "2\r\nr1\r\n"
      "*4\r\n:5461\r\n:10922\r\n*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n$2\r\ni2\r\n*3\r\n$9\r\n127.0.0.1\r\n:"
      "7004\r\n$2\r\nr2\r\n"
      "*3\r\n:10923\r\n:16383\r\n*4\r\n$0\r\n\r\n:7002\r\n$2\r\ni3\r\n*0\r\n";
  slot_map m;
  std::string why;
  REQUIRE_FALSE(parse_cluster_slots(reply_of(wire), from, m, why));
  REQUIRE(m.nodes().size() == 3);
  CHECK(m.covered() == 16384);
  CHECK(m.nodes()[m.owner(0)] == cluster_node{"127.0.0.1", 7000});
  CHECK(m.nodes()[m.owner(5460)] == cluster_node{"127.0.0.1", 7000});
  CHECK(m.nodes()[m.owner(5461)] == cluster_node{"127.0.0.1", 7001});
  CHECK(m.nodes()[m.owner(16383)] == cluster_node{"10.0.0.9", 7002});
  CHECK(m.slots_of(0) == 5461);

  // Gaps stay unowned.
  REQUIRE_FALSE(
      parse_cluster_slots(reply_of("*1\r\n*3\r\n:10\r\n:19\r\n*2\r\n$1\r\nh\r\n:1\r\n"), from, m, why));
  CHECK(m.covered() == 10);
  CHECK(m.owner(9) == slot_map::no_node);
  CHECK(m.owner(20) == slot_map::no_node);

  // Wrong shapes: each is unexpected_reply, with a reason, and leaves the map empty.
  for (const char* bad : {"+OK\r\n", "*1\r\n:1\r\n", "*1\r\n*2\r\n:0\r\n:1\r\n",
                          "*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n",          // first > last
                          "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",      // slot out of range
                          "*1\r\n*3\r\n:-1\r\n:3\r\n*2\r\n$1\r\nh\r\n:1\r\n",         // negative slot
                          "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\nh\r\n:0\r\n",          // port 0
                          "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\nh\r\n:65536\r\n",      // port too large
                          "*1\r\n*3\r\n:0\r\n:3\r\n*1\r\n$1\r\nh\r\n",                // no port
                          "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n:1\r\n:1\r\n",               // host not text
                          "*1\r\n*3\r\n$1\r\n0\r\n:3\r\n*2\r\n$1\r\nh\r\n:1\r\n"}) {  // slot not an integer
    INFO(bad);
    why.clear();
    CHECK(parse_cluster_slots(reply_of(bad), from, m, why) == errc::unexpected_reply);
    CHECK_FALSE(why.empty());
    CHECK(m.empty());
  }
}

TEST_CASE("cluster: slot_map::covered() counts the owned slots after any assigns", "[property]") {
  // covered() is kept by assign() rather than counted (a refresh checks it on every parsed map);
  // the reference is the count over owner(). Ranges fall near both ends of the slot space so they
  // overlap, reassign, unassign (no_node) and run past the last slot.
  kvtier::test::prop("slot_map::covered() == slots whose owner is a node", [] {
    const auto start = rc::gen::oneOf(rc::gen::inRange<int>(0, 200),
                                      rc::gen::inRange<int>(cluster_slot_count - 200, cluster_slot_count));
    const auto ops = *rc::gen::container<std::vector<std::tuple<int, int, std::uint16_t>>>(rc::gen::tuple(
        start, rc::gen::inRange<int>(0, 300), rc::gen::element<std::uint16_t>(0, 1, 2, slot_map::no_node)));
    slot_map m;
    for (const auto& [first, len, node] : ops) {
      const int last = std::min<int>(first + len, 0xffff);
      m.assign(static_cast<std::uint16_t>(first), static_cast<std::uint16_t>(last), node);
    }
    std::size_t n = 0;
    for (std::size_t s = 0; s < cluster_slot_count; ++s)
      n += m.owner(static_cast<std::uint16_t>(s)) != slot_map::no_node;
    RC_ASSERT(m.covered() == n);
  });
}

TEST_CASE("cluster: CLUSTER SHARDS from wire bytes, RESP2 and RESP3", "[unit]") {
  // RESP2: flat key/value arrays. Shard 0: two slot ranges, a replica listed before the master.
  const std::string resp2 =
      "*2\r\n"
      "*4\r\n$5\r\nslots\r\n*4\r\n:0\r\n:99\r\n:200\r\n:299\r\n$5\r\nnodes\r\n*2\r\n"
      "*6\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nport\r\n:7003\r\n$4\r\nrole\r\n$7\r\nreplica\r\n"
      "*8\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$2\r\nip\r\n$7\r\n1.2.3.4\r\n$4\r\nport\r\n:7000\r\n"
      "$4\r\nrole\r\n$6\r\nmaster\r\n"
      "*4\r\n$5\r\nslots\r\n*0\r\n$5\r\nnodes\r\n*1\r\n*4\r\n$4\r\nport\r\n:7005\r\n$4\r\nrole\r\n$"
      "6\r\nmaster\r\n";
  slot_map m;
  std::string why;
  REQUIRE_FALSE(parse_cluster_shards(reply_of(resp2), from, m, why));
  REQUIRE(m.nodes().size() == 1);                          // the empty shard adds no node
  CHECK(m.nodes()[0] == cluster_node{"127.0.0.1", 7000});  // endpoint preferred over ip
  CHECK(m.covered() == 200);
  CHECK(m.owner(150) == slot_map::no_node);
  CHECK(m.owner(250) == 0);

  // RESP3: maps; "?" endpoint means the answering node; tls-port when asked for TLS.
  const std::string resp3 =
      "*1\r\n%2\r\n+slots\r\n*2\r\n:0\r\n:16383\r\n+nodes\r\n*1\r\n"
      "%4\r\n+endpoint\r\n$1\r\n?\r\n+port\r\n:7000\r\n+tls-port\r\n:8000\r\n+role\r\n+master\r\n";
  REQUIRE_FALSE(parse_cluster_shards(reply_of(resp3), from, m, why));
  CHECK(m.nodes()[0] == cluster_node{"10.0.0.9", 7000});
  CHECK(m.covered() == 16384);
  REQUIRE_FALSE(parse_cluster_shards(reply_of(resp3), from, m, why, /*tls=*/true));
  CHECK(m.nodes()[0] == cluster_node{"10.0.0.9", 8000});

  for (const char* bad :
       {"+OK\r\n", "*1\r\n:1\r\n", "*1\r\n*1\r\n$5\r\nslots\r\n",
        "*1\r\n*2\r\n$5\r\nslots\r\n*0\r\n",                                   // no nodes
        "*1\r\n*4\r\n$5\r\nslots\r\n*1\r\n:0\r\n$5\r\nnodes\r\n*0\r\n",        // odd slots
        "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:1\r\n$5\r\nnodes\r\n*0\r\n",  // no master
        "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:9\r\n:1\r\n$5\r\nnodes\r\n*1\r\n"
        "*4\r\n$2\r\nip\r\n$1\r\nh\r\n$4\r\nrole\r\n$6\r\nmaster\r\n",  // no port
        "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:9\r\n:1\r\n$5\r\nnodes\r\n*1\r\n"
        "*6\r\n$2\r\nip\r\n$1\r\nh\r\n$4\r\nport\r\n:1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"}) {
    INFO(bad);  // the last: first > last
    why.clear();
    CHECK(parse_cluster_shards(reply_of(bad), from, m, why) == errc::unexpected_reply);
    CHECK_FALSE(why.empty());
    CHECK(m.empty());
  }
}

TEST_CASE("cluster: a reply naming more masters than slots is refused, not wrapped", "[unit]") {
  // slot_map numbers nodes in 16 bits: masters past 65,535 would wrap onto node 0 and route
  // their slots to the wrong master. One master per slot is the most a cluster has.
  auto integer = [](std::int64_t i) {
    value v;
    v.kind = type::integer;
    v.integer = i;
    return v;
  };
  auto text = [](std::string t) {
    value v;
    v.kind = type::bulk_string;
    v.str = std::move(t);
    return v;
  };
  auto array = [](std::vector<value> e) {
    value v;
    v.kind = type::array;
    v.elements = std::move(e);
    return v;
  };
  auto slots_reply = [&](std::size_t masters) {  // master i serves slot i % 16384
    value r = array({});
    for (std::size_t i = 0; i < masters; ++i) {
      const auto slot = static_cast<std::int64_t>(i % cluster_slot_count);
      r.elements.push_back(array(
          {integer(slot), integer(slot), array({text("h"), integer(static_cast<std::int64_t>(i) + 1)})}));
    }
    return r;
  };
  auto shards_reply = [&](std::size_t masters) {
    value r = array({});
    for (std::size_t i = 0; i < masters; ++i) {
      const auto slot = static_cast<std::int64_t>(i % cluster_slot_count);
      r.elements.push_back(
          array({text("slots"), array({integer(slot), integer(slot)}), text("nodes"),
                 array({array({text("ip"), text("h"), text("port"), integer(static_cast<std::int64_t>(i) + 1),
                               text("role"), text("master")})})}));
    }
    return r;
  };
  slot_map m;
  std::string why;
  REQUIRE_FALSE(parse_cluster_slots(slots_reply(cluster_slot_count), from, m, why));
  CHECK(m.nodes().size() == cluster_slot_count);
  CHECK(m.covered() == cluster_slot_count);
  CHECK(parse_cluster_slots(slots_reply(cluster_slot_count + 1), from, m, why) == errc::unexpected_reply);
  CHECK(why.find("more masters than slots") != std::string::npos);
  CHECK(m.empty());
  why.clear();
  REQUIRE_FALSE(parse_cluster_shards(shards_reply(cluster_slot_count), from, m, why));
  CHECK(m.nodes().size() == cluster_slot_count);
  CHECK(parse_cluster_shards(shards_reply(cluster_slot_count + 1), from, m, why) == errc::unexpected_reply);
  CHECK(why.find("more masters than slots") != std::string::npos);
  CHECK(m.empty());
  // add_node() itself never hands out an index that could wrap.
  slot_map full;
  for (std::size_t i = 0; i < slot_map::max_nodes; ++i)
    REQUIRE(full.add_node({"h", static_cast<std::uint16_t>(i + 1)}) == i);
  CHECK(full.add_node({"h", 1}) == 0);  // a known node keeps its index
  CHECK(full.add_node({"other", 1}) == slot_map::no_node);
}

TEST_CASE("cluster: resp+cluster:// URLs", "[unit]") {
  auto u = parse_cluster_url("resp+cluster://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002");
  REQUIRE(u);
  REQUIRE(u.seeds.size() == 3);
  CHECK(u.seeds[1].port == 7001);
  CHECK(u.seeds[2].host == "::1");
  CHECK(u.placement == cluster_placement::spread);

  u = parse_cluster_url("resp+cluster://alice:s%40cret@h1:7000,h2?placement=pinned");
  REQUIRE(u);
  CHECK(u.placement == cluster_placement::pinned);
  REQUIRE(u.seeds.size() == 2);
  for (const auto& s : u.seeds) {
    CHECK(s.user == "alice");
    CHECK(s.password == "s@cret");
  }
  CHECK(u.seeds[1].port == 6379);
  for (const auto& s : u.seeds) CHECK_FALSE(s.tls);
  CHECK(is_cluster_url("resp+cluster://h:1"));

  // Over TLS: every seed is a TLS endpoint; the rest parses alike.
  u = parse_cluster_url("resp+cluster+tls://alice:pw@h1:7000,h2:7001?placement=pinned");
  REQUIRE(u);
  REQUIRE(u.seeds.size() == 2);
  CHECK(u.placement == cluster_placement::pinned);
  for (const auto& s : u.seeds) {
    CHECK(s.tls);
    CHECK(s.password == "pw");
  }
  CHECK(is_cluster_url("resp+cluster+tls://h:1"));
  CHECK_FALSE(is_cluster_url("rediss://h:1"));

  for (const char* bad :
       {"resp://h:1", "h:1,h:2", "resp+cluster://", "resp+cluster://h:1,,h:2", "resp+cluster://h:1/3",
        "resp+cluster://h:99999", "resp+cluster://h:1?placement=other", "resp+cluster://:pw@",
        "resp+cluster+tls://", "resp+cluster+tls://h:1/2", "resp+tls+cluster://h:1"}) {
    INFO(bad);
    u = parse_cluster_url(bad);
    CHECK(u.ec == errc::bad_url);
    CHECK(u.seeds.empty());
    CHECK(u.message.find("bad cluster URL") != std::string::npos);
  }
  // A message never shows the password.
  for (const char* secret : {"resp+cluster://bob:topsecret@h:0", "resp+cluster+tls://bob:topsecret@h:0"}) {
    u = parse_cluster_url(secret);
    REQUIRE_FALSE(u);
    CHECK(u.message.find("topsecret") == std::string::npos);
  }
}
