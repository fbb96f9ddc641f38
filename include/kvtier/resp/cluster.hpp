// kvtier/resp/cluster.hpp: the sans-io half of Redis/Valkey Cluster routing.
//
// A cluster splits the key space into 16384 hash slots (CRC16-XMODEM of the key, or of its
// {hash tag}, mod 16384); each slot has one master. A client keeps a slot map from CLUSTER SLOTS
// (or CLUSTER SHARDS, the newer form), sends each command to its slot's master, and follows the
// cluster's error replies:
//   MOVED <slot> <host:port>   the slot lives elsewhere now: patch the map, refresh it, retry
//   ASK <slot> <host:port>     this one key is being migrated: ASKING then the command there, once
//   TRYAGAIN / CLUSTERDOWN     a migration or failover is under way: retry after a short wait
// Everything here is pure (no I/O), so every reply form is unit-tested byte by byte; the store that
// does the I/O is kvtier/store/cluster_store.hpp.
//
//   std::uint16_t s = kvtier::resp::hash_slot("kvtier:{rank3}:abc");       // hashes "rank3"
//   kvtier::resp::slot_map map;
//   std::string why;
//   if (auto ec = kvtier::resp::parse_cluster_slots(reply, from, map, why)) log(why);
//   auto r = kvtier::resp::parse_redirect(error_text, from);
//   if (r.kind == kvtier::resp::redirect_kind::moved) map.assign(r.slot, r.slot, map.add_node(r.node));
#pragma once

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/errc.hpp"
#include "kvtier/resp/types.hpp"
#include "kvtier/resp/url.hpp"

namespace kvtier::resp {

/// Hash slots in a Redis/Valkey cluster.
inline constexpr std::size_t cluster_slot_count = 16384;

namespace detail {
constexpr std::array<std::uint16_t, 256> crc16_table() noexcept {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    std::uint16_t c = static_cast<std::uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) c = static_cast<std::uint16_t>((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
    t[i] = c;
  }
  return t;
}
inline constexpr std::array<std::uint16_t, 256> crc16_xmodem = crc16_table();
}  // namespace detail

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), the cluster's key hash.
constexpr std::uint16_t crc16(std::string_view data) noexcept {
  std::uint16_t crc = 0;
  for (char ch : data)
    crc = static_cast<std::uint16_t>(
        (crc << 8) ^ detail::crc16_xmodem[((crc >> 8) ^ static_cast<unsigned char>(ch)) & 0xff]);
  return crc;
}

/// The hash slot of `key`: CRC16 of the key mod 16384, or of its hash tag, the text between the
/// first '{' and the first '}' after it when that text is not empty ("{user1}.a" and "{user1}.b"
/// share a slot; "{}x" and "x{" hash whole).
constexpr std::uint16_t hash_slot(std::string_view key) noexcept {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(crc16(key) & (cluster_slot_count - 1));
}

/// One cluster node's address (a master's, for routing).
struct cluster_node {
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const cluster_node&, const cluster_node&) = default;
  /// "host:port" ("[v6]:port" for an IPv6 literal).
  std::string describe() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

/// What an error reply asks a cluster client to do.
enum class redirect_kind : std::uint8_t {
  none,         ///< a plain error: the command failed
  moved,        ///< the slot's master is `node` now
  ask,          ///< this key only: send ASKING, then the command, to `node`
  tryagain,     ///< a multi-key or migrating-slot command: retry shortly
  clusterdown,  ///< the cluster cannot serve the slot now: retry shortly
};

/// A parsed cluster error reply.
struct redirect {
  redirect_kind kind = redirect_kind::none;
  std::uint16_t slot = 0;  ///< MOVED/ASK
  cluster_node node;       ///< MOVED/ASK
};

namespace detail {
// A decimal in [0, max]; false otherwise (no sign, no spaces).
inline bool cluster_number(std::string_view s, unsigned long max, unsigned long& out) noexcept {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size() && out <= max;
}
}  // namespace detail

/// Classifies the text of an error reply ("MOVED 3999 127.0.0.1:6381", "ASK ...", "TRYAGAIN ...",
/// "CLUSTERDOWN ..."). An endpoint whose host is empty or "?" (the node does not know its own
/// address) means the host of `from`, the node that sent the reply. A MOVED/ASK that does not
/// parse (bad slot, port or shape) is kind none: a plain error, never a redirect to a made-up node.
inline redirect parse_redirect(std::string_view text, const cluster_node& from) {
  redirect r;
  const auto word_end = text.find(' ');
  const std::string_view word = text.substr(0, word_end);
  if (word == "TRYAGAIN") return r.kind = redirect_kind::tryagain, r;
  if (word == "CLUSTERDOWN") return r.kind = redirect_kind::clusterdown, r;
  if ((word != "MOVED" && word != "ASK") || word_end == std::string_view::npos) return r;
  std::string_view rest = text.substr(word_end + 1);
  const auto slot_end = rest.find(' ');
  if (slot_end == std::string_view::npos) return r;
  unsigned long slot = 0, port = 0;
  if (!detail::cluster_number(rest.substr(0, slot_end), cluster_slot_count - 1, slot)) return r;
  const std::string_view endpoint = rest.substr(slot_end + 1);
  const auto colon = endpoint.rfind(':');  // the last colon: an IPv6 host has colons of its own
  if (colon == std::string_view::npos || endpoint.find(' ') != std::string_view::npos) return r;
  if (!detail::cluster_number(endpoint.substr(colon + 1), 65535, port) || port == 0) return r;
  std::string_view host = endpoint.substr(0, colon);
  // "[v6]:port": brackets only around a host with colons (as describe() writes it).
  if (host.size() > 2 && host.front() == '[' && host.back() == ']' &&
      host.find(':') != std::string_view::npos)
    host = host.substr(1, host.size() - 2);
  r.kind = word == "MOVED" ? redirect_kind::moved : redirect_kind::ask;
  r.slot = static_cast<std::uint16_t>(slot);
  r.node.host = host.empty() || host == "?" ? from.host : std::string(host);
  r.node.port = static_cast<std::uint16_t>(port);
  return r;
}

/// Which master serves each of the 16384 slots. Nodes are numbered in the order added.
class slot_map {
 public:
  static constexpr std::uint16_t no_node = 0xffff;

  slot_map() { owner_.fill(no_node); }

  /// Most nodes a map holds: one per slot (an index stays below no_node, never wraps).
  static constexpr std::size_t max_nodes = cluster_slot_count;

  /// The index of `n` among the nodes, added if new; no_node when max_nodes are there already
  /// (a reply naming more masters than slots is not a cluster's: the parsers refuse it).
  std::uint16_t add_node(const cluster_node& n) {
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i] == n) return static_cast<std::uint16_t>(i);
    if (nodes_.size() >= max_nodes) return no_node;
    nodes_.push_back(n);
    return static_cast<std::uint16_t>(nodes_.size() - 1);
  }
  /// Slots [first, last] are served by node `node` (an index from add_node()).
  void assign(std::uint16_t first, std::uint16_t last, std::uint16_t node) noexcept {
    for (std::size_t s = first; s <= last && s < cluster_slot_count; ++s) {
      const bool was = owner_[s] != no_node, now = node != no_node;
      if (now && !was) ++covered_;
      if (was && !now) --covered_;
      owner_[s] = node;
    }
  }
  /// The node index serving `slot`, or no_node.
  std::uint16_t owner(std::uint16_t slot) const noexcept { return owner_[slot & (cluster_slot_count - 1)]; }
  const std::vector<cluster_node>& nodes() const noexcept { return nodes_; }
  /// Slots that have a node (kept by assign(): a refresh checks it on every map it parses).
  std::size_t covered() const noexcept { return covered_; }
  /// Slots served by node `node`.
  std::size_t slots_of(std::uint16_t node) const noexcept {
    std::size_t n = 0;
    for (std::uint16_t o : owner_) n += o == node;
    return n;
  }
  bool empty() const noexcept { return nodes_.empty(); }

 private:
  std::array<std::uint16_t, cluster_slot_count> owner_{};
  std::size_t covered_ = 0;
  std::vector<cluster_node> nodes_;
};

namespace detail {
inline constexpr const char* cluster_too_many_masters = "more than 16384 masters (more masters than slots)";
inline std::error_code cluster_bad(std::string& why, std::string what) {
  why = std::move(what);
  return make_error_code(errc::unexpected_reply);
}
inline bool cluster_is_text(const value& v) noexcept {
  return v.kind == type::bulk_string || v.kind == type::simple_string || v.kind == type::verbatim_string;
}
// A slot bound: an integer in [0, 16383].
inline bool cluster_slot_bound(const value& v, std::uint16_t& out) noexcept {
  if (v.kind != type::integer || v.integer < 0 || v.integer >= static_cast<std::int64_t>(cluster_slot_count))
    return false;
  out = static_cast<std::uint16_t>(v.integer);
  return true;
}
// A node's host: "" or "?" (unknown endpoint) means the node that answered.
inline std::string cluster_host(std::string_view h, const cluster_node& from) {
  return h.empty() || h == "?" ? from.host : std::string(h);
}
// Key/value pairs of a RESP3 map or a RESP2 flat array; nullptr if `v` is neither (or odd-sized).
inline const std::vector<value>* cluster_pairs(const value& v) noexcept {
  if ((v.kind != type::map && v.kind != type::array) || v.elements.size() % 2 != 0) return nullptr;
  return &v.elements;
}
inline const value* cluster_field(const std::vector<value>& pairs, std::string_view name) noexcept {
  for (std::size_t i = 0; i + 1 < pairs.size(); i += 2)
    if (cluster_is_text(pairs[i]) && pairs[i].str == name) return &pairs[i + 1];
  return nullptr;
}
}  // namespace detail

/// Fills `out` from a CLUSTER SLOTS reply sent by node `from`:
///   [[first, last, [host, port, id, ...], replica..., ], ...]
/// Only the master (the first node of each range) is used. A reply of another shape, a slot out
/// of range, first > last, a port out of range or more masters than slots (slot_map::max_nodes)
/// is errc::unexpected_reply and `why` says which.
inline std::error_code parse_cluster_slots(const value& reply, const cluster_node& from, slot_map& result,
                                           std::string& why) {
  result = slot_map{};
  slot_map out;  // handed over only when the whole reply parsed
  if (reply.kind != type::array) return detail::cluster_bad(why, "CLUSTER SLOTS: reply is not an array");
  for (std::size_t i = 0; i < reply.elements.size(); ++i) {
    const value& range = reply.elements[i];
    const std::string at = "CLUSTER SLOTS: range " + std::to_string(i) + ": ";
    std::uint16_t first = 0, last = 0;
    if (range.kind != type::array || range.elements.size() < 3)
      return detail::cluster_bad(why, at + "not [first, last, master, ...]");
    if (!detail::cluster_slot_bound(range.elements[0], first) ||
        !detail::cluster_slot_bound(range.elements[1], last) || first > last)
      return detail::cluster_bad(why, at + "slot bounds not 0 <= first <= last <= 16383");
    const value& master = range.elements[2];
    if (master.kind != type::array || master.elements.size() < 2 ||
        !detail::cluster_is_text(master.elements[0]) || master.elements[1].kind != type::integer ||
        master.elements[1].integer <= 0 || master.elements[1].integer > 65535)
      return detail::cluster_bad(why, at + "master is not [host, port, ...]");
    const cluster_node n{detail::cluster_host(master.elements[0].str, from),
                         static_cast<std::uint16_t>(master.elements[1].integer)};
    const std::uint16_t index = out.add_node(n);
    if (index == slot_map::no_node) return detail::cluster_bad(why, at + detail::cluster_too_many_masters);
    out.assign(first, last, index);
  }
  result = std::move(out);
  return {};
}

/// Fills `out` from a CLUSTER SHARDS reply (Redis 7+, Valkey) sent by node `from`: per shard a
/// map (RESP3) or flat array (RESP2) with "slots" ([first, last, first, last, ...]) and "nodes"
/// (maps with "endpoint" or "ip", "port" or "tls-port" (with `tls`), "role"); the node whose role
/// is "master" serves the shard's slots. Errors as parse_cluster_slots().
inline std::error_code parse_cluster_shards(const value& reply, const cluster_node& from, slot_map& result,
                                            std::string& why, bool tls = false) {
  result = slot_map{};
  slot_map out;  // handed over only when the whole reply parsed
  if (reply.kind != type::array) return detail::cluster_bad(why, "CLUSTER SHARDS: reply is not an array");
  for (std::size_t i = 0; i < reply.elements.size(); ++i) {
    const std::string at = "CLUSTER SHARDS: shard " + std::to_string(i) + ": ";
    const auto* shard = detail::cluster_pairs(reply.elements[i]);
    if (shard == nullptr) return detail::cluster_bad(why, at + "not a map");
    const value* slots = detail::cluster_field(*shard, "slots");
    const value* nodes = detail::cluster_field(*shard, "nodes");
    if (slots == nullptr || nodes == nullptr || slots->kind != type::array || nodes->kind != type::array ||
        slots->elements.size() % 2 != 0)
      return detail::cluster_bad(why, at + "no \"slots\" pairs or \"nodes\" array");
    if (slots->elements.empty()) continue;  // a shard with no slots (e.g. an empty master)
    const cluster_node* master = nullptr;
    cluster_node found;
    for (const value& nv : nodes->elements) {
      const auto* node = detail::cluster_pairs(nv);
      if (node == nullptr) return detail::cluster_bad(why, at + "a node is not a map");
      const value* role = detail::cluster_field(*node, "role");
      if (role == nullptr || !detail::cluster_is_text(*role) || role->str != "master") continue;
      const value* host = detail::cluster_field(*node, "endpoint");
      if (host == nullptr) host = detail::cluster_field(*node, "ip");
      const value* port = detail::cluster_field(*node, tls ? "tls-port" : "port");
      if (host == nullptr || !detail::cluster_is_text(*host) || port == nullptr ||
          port->kind != type::integer || port->integer <= 0 || port->integer > 65535)
        return detail::cluster_bad(why, at + "master without an endpoint and port");
      found = cluster_node{detail::cluster_host(host->str, from), static_cast<std::uint16_t>(port->integer)};
      master = &found;
      break;
    }
    if (master == nullptr) return detail::cluster_bad(why, at + "slots but no master");
    const std::uint16_t index = out.add_node(*master);
    if (index == slot_map::no_node) return detail::cluster_bad(why, at + detail::cluster_too_many_masters);
    for (std::size_t k = 0; k < slots->elements.size(); k += 2) {
      std::uint16_t first = 0, last = 0;
      if (!detail::cluster_slot_bound(slots->elements[k], first) ||
          !detail::cluster_slot_bound(slots->elements[k + 1], last) || first > last)
        return detail::cluster_bad(why, at + "slot bounds not 0 <= first <= last <= 16383");
      out.assign(first, last, index);
    }
  }
  result = std::move(out);
  return {};
}

/// Where a cluster's placement puts a rank's chunks (see cluster_url).
enum class cluster_placement : std::uint8_t {
  spread,  ///< every key hashes on its own: a rank's chunks spread over every master
  pinned,  ///< a hash tag per rank: a rank's chunks share one slot, so one master
};

/// A parsed resp+cluster:// URL.
struct cluster_url {
  std::vector<endpoint> seeds;  ///< where to ask for the slot map (credentials in each)
  cluster_placement placement = cluster_placement::spread;
  std::error_code ec;
  std::string message;  ///< what is wrong, when ec is set
  explicit operator bool() const noexcept { return !ec; }
};

/// True when `url` names a cluster (resp+cluster:// or resp+cluster+tls://).
inline bool is_cluster_url(std::string_view url) noexcept {
  return url.rfind("resp+cluster://", 0) == 0 || url.rfind("resp+cluster+tls://", 0) == 0;
}

/// Parses "resp+cluster://[user[:password]@]host:port[,host:port...][?placement=spread|pinned]":
/// seed nodes (any reachable one gives the whole slot map), credentials shared by every node.
/// "resp+cluster+tls://" is the same over TLS: every seed is a TLS endpoint, and a node asked
/// over TLS names its masters' TLS ports (redis-server --tls-cluster yes).
/// A cluster has only database 0, so a "/db" is an error. Never throws.
inline cluster_url parse_cluster_url(std::string_view url) {
  cluster_url out;
  const bool tls = url.rfind("resp+cluster+tls://", 0) == 0;
  const std::string_view scheme = tls ? "resp+cluster+tls://" : "resp+cluster://";
  // Messages never echo credentials: whatever precedes the last '@' is shown as "***".
  std::string shown(url);
  if (const auto at = shown.rfind('@'); at != std::string::npos && shown.substr(0, scheme.size()) == scheme)
    shown = std::string(scheme) + "***" + shown.substr(at);
  auto bad = [&](std::string what) {
    out.seeds.clear();
    out.ec = make_error_code(errc::bad_url);
    out.message = "bad cluster URL '" + shown + "': " + std::move(what);
    return out;
  };
  if (url.substr(0, scheme.size()) != scheme) {
    const auto colon = url.find("://");
    return bad(colon == std::string_view::npos
                   ? "missing scheme (expected resp+cluster:// or resp+cluster+tls://)"
                   : "scheme '" + std::string(url.substr(0, colon)) +
                         "' is not resp+cluster or resp+cluster+tls");
  }
  std::string_view rest = url.substr(scheme.size());
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    const std::string_view query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    if (query == "placement=spread")
      out.placement = cluster_placement::spread;
    else if (query == "placement=pinned")
      out.placement = cluster_placement::pinned;
    else
      return bad("unsupported query '" + std::string(query) +
                 "' (only placement=spread or placement=pinned)");
  }
  endpoint login;  // user and password shared by every node
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    url_result r = parse_url("resp://" + std::string(rest.substr(0, at + 1)) + "127.0.0.1");
    if (!r) return bad("malformed user or password (percent-encode '@', ':', '/' and ',')");
    login = std::move(r.value);
    rest = rest.substr(at + 1);
  }
  if (rest.find('/') != std::string_view::npos) return bad("a cluster has only database 0: no '/db' allowed");
  if (rest.empty()) return bad("no seed node (expected host:port[,host:port...])");
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    if (item.empty()) return bad("empty seed node between commas");
    url_result r = parse_url("resp://" + std::string(item));
    if (!r) return bad("seed '" + std::string(item) + "': " + r.message);
    r.value.user = login.user;
    r.value.password = login.password;
    r.value.tls = tls;
    out.seeds.push_back(std::move(r.value));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

}  // namespace kvtier::resp
