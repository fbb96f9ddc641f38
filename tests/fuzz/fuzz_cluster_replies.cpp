// libFuzzer target: the cluster replies a client trusts for routing (kvtier/resp/cluster.hpp).
// The first byte picks the input kind; the rest is either the text of an error reply
// (parse_redirect) or a RESP byte stream whose replies go to parse_cluster_slots and
// parse_cluster_shards (RESP2 and RESP3 shapes, TLS port or not). Oracles:
//  1. a MOVED/ASK has a slot < 16384, a port > 0 and a host; written back as
//     "MOVED <slot> <host>:<port>" it parses to the same redirect;
//  2. a parsed slot map only names nodes it holds (every owned slot's index < nodes().size()), each
//     with a port > 0, and covers at most 16384 slots;
//  3. a refused reply leaves the map empty and says why.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/resp/cluster.hpp"
#include "kvtier/resp/parser.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_cluster_replies: oracle failed: %s\n", what);
    std::abort();
  }
}

void check_map(const kvtier::resp::slot_map& m, const std::error_code& ec, const std::string& why) {
  using kvtier::resp::slot_map;
  if (ec) {
    check(m.empty() && m.covered() == 0, "a refused reply left a map behind");
    check(!why.empty(), "a refused reply without a reason");
    return;
  }
  for (const auto& n : m.nodes()) check(n.port > 0, "a node with port 0");
  for (std::size_t s = 0; s < kvtier::resp::cluster_slot_count; ++s) {
    const std::uint16_t o = m.owner(static_cast<std::uint16_t>(s));
    check(o == slot_map::no_node || o < m.nodes().size(), "a slot owned by a node not in the map");
  }
  check(m.covered() <= kvtier::resp::cluster_slot_count, "more slots than exist");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvtier::resp;
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const cluster_node from{"10.1.2.3", 7000};
  if ((mode & 1) == 0) {
    const redirect r = parse_redirect(rest, from);
    if (r.kind == redirect_kind::moved || r.kind == redirect_kind::ask) {
      check(r.slot < cluster_slot_count, "redirect slot out of range");
      check(r.node.port > 0, "redirect port 0");
      check(!r.node.host.empty(), "redirect without a host");
      const std::string again = std::string(r.kind == redirect_kind::moved ? "MOVED " : "ASK ") +
                                std::to_string(r.slot) + " " + r.node.describe();
      const redirect r2 = parse_redirect(again, from);
      check(r2.kind == r.kind && r2.slot == r.slot && r2.node == r.node, "redirect does not round-trip");
    }
    return 0;
  }
  parser p;
  std::size_t pos = 0;
  while (pos < rest.size()) {
    const std::span<std::byte> into = p.prepare();
    if (into.empty()) break;
    const std::size_t n = std::min(into.size(), rest.size() - pos);
    std::memcpy(into.data(), rest.data() + pos, n);
    p.commit(n);
    pos += n;
    std::error_code ec;
    while (auto v = p.next(ec)) {
      slot_map m;
      std::string why;
      std::error_code e = parse_cluster_slots(*v, from, m, why);
      check_map(m, e, why);
      why.clear();
      e = parse_cluster_shards(*v, from, m, why, (mode & 2) != 0);
      check_map(m, e, why);
    }
    if (ec) break;
  }
  return 0;
}
