// kvtier/store/cluster_store.hpp: the L2 chunk store on a Redis/Valkey Cluster.
//
// cluster_store<Connection> satisfies kvtier::chunk_store like remote_store, over every master of
// a cluster (kvtier/resp/cluster.hpp has the sans-io routing). A call:
//  1. names each key (remote_key_text, with "{hash_tag}" in pinned placement) and finds its slot's
//     master in the slot map (loaded from CLUSTER SLOTS, or CLUSTER SHARDS on servers without it);
//  2. splits the batch by master: one pipeline per master, the pipelines run in parallel (one
//     thread per extra master for calls that move payloads), each on a connection of that node's
//     pool (kvtier/resp/pool.hpp);
//  3. follows the cluster's answers per key: MOVED patches the slot and asks for one refresh of
//     the map (concurrent callers share it); ASK retries that key alone on the named node, after
//     ASKING; TRYAGAIN, CLUSTERDOWN and a master that cannot be reached retry after a backoff
//     (doubling, capped); every retry is inside the caller's deadline and at most `max_rounds`
//     rounds, so a redirect loop ends as error;
//  4. writes each key's status in the caller's order.
// Values are framed and gated exactly as in remote_store: a redirect is an error reply (no byte of
// it reaches a destination), a GET retried elsewhere is checked again from its header, and a key
// is a hit only after its header and payload checksum passed.
//
//   auto url = kvtier::resp::parse_cluster_url("resp+cluster://127.0.0.1:7000,127.0.0.1:7001");
//   kvtier::cluster_store<kvtier::resp::asio_connection> l2(ns, {.seeds = url.seeds});
//   std::error_code ec = l2.get(keys, dst_spans, status,
//   kvtier::deadline_after(std::chrono::milliseconds(500)));
//
// Thread-safe: calls run in parallel (each node's pool lends one connection per call).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/cv_wait.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/cluster.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/pool.hpp"
#include "kvtier/store/batch_spread.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/detail/remote_codec.hpp"
#include "kvtier/store/remote_stats.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

/// How a cluster_store reaches its cluster.
struct cluster_options {
  std::vector<resp::endpoint> seeds{};               ///< any reachable one gives the slot map
  resp::connection_options connection{};             ///< timeouts, protocol, limits (its server is unused)
  resp::pool_options pool{};                         ///< per master
  std::string hash_tag{};                            ///< pinned placement: every key in this tag's slot
  int max_rounds = 6;                                ///< rounds per call (first try + redirects/retries)
  std::chrono::milliseconds retry_backoff_min{10};   ///< first wait before a TRYAGAIN/CLUSTERDOWN retry
  std::chrono::milliseconds retry_backoff_max{200};  ///< cap of the doubling wait
  std::size_t small_request_bytes = 64 << 10;        ///< calls moving more are `large` (see pool.hpp)
  value_format format = value_format::v1();          ///< value format written and expected (remote_store's)
  batch_spread spread{};  ///< a master's share of a batch over its pool (remote_store's)
};

/// cluster_options for rank `rank` from a parsed resp+cluster:// URL (its seeds, its placement):
/// `pinned` tags every key with "{kvtier-rank-<rank>}" so the rank's partition stays in one slot,
/// so on one master; `spread` leaves keys untagged, so they hash over every master. `base` gives
/// the connection settings (timeouts, protocol, limits); its server is not used.
inline cluster_options cluster_options_for(const resp::cluster_url& url, int rank,
                                           resp::connection_options base = {}) {
  cluster_options o;
  o.seeds = url.seeds;
  o.connection = std::move(base);
  if (url.placement == resp::cluster_placement::pinned) o.hash_tag = "kvtier-rank-" + std::to_string(rank);
  return o;
}

/// The L2 store on a Redis/Valkey Cluster.
template <resp::connection Connection>
class cluster_store {
 public:
  cluster_store(key_namespace ns, cluster_options opt)
      : codec_(std::move(ns), opt.hash_tag, opt.format), opt_(std::move(opt)) {}
  cluster_store(const cluster_store&) = delete;
  cluster_store& operator=(const cluster_store&) = delete;

  /// Presence of each key. hit = present, miss = absent.
  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl) {
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    return run(
        keys, status, dl, resp::request_size::small, {},
        [&](detail::remote_scratch& s, std::size_t, std::size_t, const std::string& name) {
          codec_.add_exists(s.batch, name);
        },
        [&](const detail::remote_scratch&, std::size_t, std::size_t, const resp::value& r, const node& n,
            const std::string& name) { return codec_.exists_status(r, n.where, name); });
  }

  /// Reads each key's payload into dst[i] and verifies it (as remote_store::get).
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) {
    return get(keys, dst, status, dl, std::span<std::size_t>());
  }

  /// get(), with the stored payload length of each key whose value has another length than
  /// dst[i] in stored_bytes[i] (as remote_store::get with stored_bytes).
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl, std::span<std::size_t> stored_bytes) {
    if (auto ec = codec_.check_batch(keys, dst, status)) return ec;
    if (!stored_bytes.empty() && stored_bytes.size() != keys.size())
      return make_error_code(errc::invalid_argument);
    return run(
        keys, status, dl, size_class(dst), value_bytes(dst),
        [&](detail::remote_scratch& s, std::size_t j, std::size_t i, const std::string& name) {
          codec_.add_get(s, j, keys[i], name, dst[i]);
        },
        [&](const detail::remote_scratch& s, std::size_t j, std::size_t i, const resp::value& r,
            const node& n, const std::string& name) {
          return codec_.get_status(r, s, j, keys[i], dst[i], n.where, name,
                                   stored_bytes.empty() ? nullptr : &stored_bytes[i]);
        });
  }

  /// Stores src[i] under keys[i]. hit = stored.
  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) {
    return put_prehashed(keys, src, {}, status, dl);
  }

  /// put() with each value's checksums already known (see remote_store::put_prehashed).
  std::error_code put_prehashed(std::span<const chunk_key> keys,
                                std::span<const std::span<const std::byte>> src,
                                std::span<const value_digest> digests, std::span<chunk_status> status,
                                deadline dl) {
    if (auto ec = codec_.check_batch(keys, src, status)) return ec;
    if (!digests.empty())
      if (auto ec = codec_.check_digests(src, digests)) return ec;
    return run(
        keys, status, dl, size_class(src), value_bytes(src),
        [&](detail::remote_scratch& s, std::size_t j, std::size_t i, const std::string& name) {
          codec_.add_put(s, j, keys[i], name, src[i], digests.empty() ? nullptr : &digests[i]);
        },
        [&](const detail::remote_scratch&, std::size_t, std::size_t i, const resp::value& r, const node& n,
            const std::string& name) { return codec_.put_status(r, src[i].size(), n.where, name); });
  }

  /// put_prehashed() of values given in pieces, each written from where it lies (see
  /// remote_store::put_pieces).
  std::error_code put_pieces(std::span<const chunk_key> keys, std::span<const value_pieces> values,
                             std::span<const value_digest> digests, std::span<chunk_status> status,
                             deadline dl) {
    std::vector<std::size_t> lengths;
    if (auto ec = codec_.check_pieces(keys, values, digests, status, lengths)) return ec;
    return run(
        keys, status, dl, size_class(lengths), value_bytes(lengths),
        [&](detail::remote_scratch& s, std::size_t j, std::size_t i, const std::string& name) {
          codec_.add_put_pieces(s, j, keys[i], name, values[i], lengths[i],
                                digests.empty() ? nullptr : &digests[i]);
        },
        [&](const detail::remote_scratch&, std::size_t, std::size_t i, const resp::value& r, const node& n,
            const std::string& name) { return codec_.put_status(r, lengths[i], n.where, name); });
  }

  /// Loads the slot map now (otherwise the first call does), from the known masters, then the seeds.
  std::error_code refresh(deadline dl) { return refresh_if(map_generation(), dl); }

  /// A copy of the current slot map (for tools: coverage, masters).
  resp::slot_map slot_map() const {
    std::shared_lock lock(map_mu_);
    return map_;
  }

  /// The slot map's master for `k` (after a refresh), or nullopt.
  std::optional<resp::cluster_node> node_of(const chunk_key& k) const {
    std::shared_lock lock(map_mu_);
    const std::uint16_t o = map_.owner(resp::hash_slot(codec_.key_text(k)));
    if (o == resp::slot_map::no_node) return std::nullopt;
    return map_.nodes()[o];
  }

  /// A snapshot of the counters (down_refusals and breaker_trips summed over the nodes).
  remote_store_stats stats() const noexcept {
    remote_store_stats s = codec_.stats();
    std::lock_guard<std::mutex> lock(nodes_mu_);
    for (const auto& n : nodes_) n->pool.add_breaker_counts(s.down_refusals, s.breaker_trips);
    return s;
  }
  /// The last failure in words (a node's connection error, a key's error reply, a redirect loop).
  std::string last_error() const { return codec_.last_error(); }
  const key_namespace& ns() const noexcept { return codec_.ns(); }
  const value_format& format() const noexcept { return codec_.format(); }
  /// The key name of `k` on the servers (with the hash tag in pinned placement).
  std::string key_text(const chunk_key& k) const { return codec_.key_text(k); }

 private:
  // One master (or ASK target): its pool and a scratch per pooled connection.
  struct node {
    node(resp::cluster_node a, const cluster_options& o)
        : addr(std::move(a)),
          where(addr.describe()),
          pool(options_for(addr, o), o.pool),
          scratch(pool.size()),
          crew(pool.size()) {}
    static resp::connection_options options_for(const resp::cluster_node& a, const cluster_options& o) {
      resp::connection_options c = o.connection;
      c.server.kind = resp::endpoint::transport::tcp;
      c.server.host = a.host;
      c.server.port = a.port;
      c.server.db = 0;
      if (!o.seeds.empty()) {  // credentials and TLS as the seeds' (a TLS client is told TLS ports)
        c.server.user = o.seeds.front().user;
        c.server.password = o.seeds.front().password;
        c.server.tls = o.seeds.front().tls;
      }
      return c;
    }
    resp::cluster_node addr;
    std::string where;
    resp::connection_pool<Connection> pool;
    std::vector<detail::remote_scratch> scratch;
    detail::lane_crew crew;  // runs a batch's pieces on the pool's connections in parallel
  };

  // One key of a call.
  struct entry {
    std::string name;
    std::uint16_t slot = 0;
    node* ask = nullptr;  // ASK target for the next round
    bool done = false;
  };

  // What one node's pipeline of a round brought back.
  struct round_result {
    node* target = nullptr;
    std::vector<std::size_t> entries;   // caller indices, in pipeline order
    std::error_code ec;                 // the pipeline's own failure (timeout, lost connection, ...)
    std::vector<resp::redirect> moved;  // MOVED replies to apply to the map
    bool retry_later = false;           // TRYAGAIN / CLUSTERDOWN / node unreachable
  };

  template <class Values>
  resp::request_size size_class(const Values& values) const noexcept {
    std::size_t bytes = 0;
    for (const auto& x : values) bytes += detail::payload_length(x);
    return bytes > opt_.small_request_bytes ? resp::request_size::large : resp::request_size::small;
  }

  // Bytes each value puts in flight (header + payload): what a master's piece is cut by.
  template <class Values>
  std::vector<std::size_t> value_bytes(const Values& values) const {
    std::vector<std::size_t> b(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      b[i] = detail::payload_length(values[i]) + opt_.format.header_size(detail::payload_length(values[i]));
    return b;
  }

  std::uint64_t map_generation() const {
    std::shared_lock lock(map_mu_);
    return generation_;
  }

  // The node object for `a`, created on first sight (never destroyed before the store).
  node* node_for(const resp::cluster_node& a) {
    std::lock_guard<std::mutex> lock(nodes_mu_);
    for (auto& n : nodes_)
      if (n->addr == a) return n.get();
    nodes_.push_back(std::make_unique<node>(a, opt_));
    return nodes_.back().get();
  }

  // Installs `m` as the map (nodes resolved to node objects first, outside the map lock).
  void install(resp::slot_map m) {
    std::vector<node*> by_index;
    for (const auto& a : m.nodes()) by_index.push_back(node_for(a));
    std::unique_lock lock(map_mu_);
    map_ = std::move(m);
    map_nodes_ = std::move(by_index);
    ++generation_;
  }

  // Reloads the map unless someone did since generation `seen` (concurrent callers that saw the
  // same stale map share one refresh).
  std::error_code refresh_if(std::uint64_t seen, deadline dl) {
    {
      std::unique_lock<std::mutex> lock(refresh_mu_);
      if (!detail::wait_until(refresh_cv_, lock, dl, [this] { return !refreshing_; }))
        return make_error_code(errc::timeout);
      refreshing_ = true;
    }
    struct done_t {
      cluster_store* s;
      ~done_t() {
        {
          std::lock_guard<std::mutex> lock(s->refresh_mu_);
          s->refreshing_ = false;
        }
        s->refresh_cv_.notify_all();
      }
    } done{this};
    if (map_generation() != seen) return {};
    std::vector<resp::cluster_node> candidates;
    {
      std::shared_lock ml(map_mu_);
      candidates = map_.nodes();
    }
    for (const auto& s : opt_.seeds) {
      const resp::cluster_node c{s.host, s.port};
      if (std::find(candidates.begin(), candidates.end(), c) == candidates.end()) candidates.push_back(c);
    }
    if (candidates.empty()) return make_error_code(errc::invalid_argument);
    // Start at a different node each time, so one dead master does not delay every refresh.
    const std::size_t start = refresh_turn_++ % candidates.size();
    std::error_code last = make_error_code(errc::not_connected);
    for (std::size_t k = 0; k < candidates.size(); ++k) {
      if (expired(dl)) return make_error_code(errc::timeout);
      node* n = node_for(candidates[(start + k) % candidates.size()]);
      resp::slot_map m;
      last = load_map(*n, dl, m);
      if (!last) {
        codec_.count_refresh();
        install(std::move(m));
        return {};
      }
    }
    return last;
  }

  // CLUSTER SLOTS from one node (CLUSTER SHARDS when the server does not know SLOTS).
  std::error_code load_map(node& n, deadline dl, resp::slot_map& out) {
    typename resp::connection_pool<Connection>::lease lease;
    std::string why;
    if (const std::error_code aec = n.pool.acquire(resp::request_size::small, dl, lease, &why)) {
      codec_.note(n.where + ": " + why);
      return aec;
    }
    resp::batch& b = n.scratch[lease.index()].batch;
    for (const bool shards : {false, true}) {
      b.clear();
      b.add({"CLUSTER", shards ? "SHARDS" : "SLOTS"});
      if (std::error_code ec = lease.conn().execute(b, dl)) {
        codec_.note(lease.conn().last_error());
        return ec;
      }
      const resp::value& r = b.reply(0);
      std::string why;
      if (r.is_error()) {
        codec_.note(n.where + ": CLUSTER " + (shards ? "SHARDS" : "SLOTS") + ": " + r.str);
        if (!shards) continue;  // e.g. a server without CLUSTER SLOTS: try SHARDS
        return make_error_code(errc::server_error);
      }
      const bool tls = !opt_.seeds.empty() && opt_.seeds.front().tls;
      const std::error_code ec = shards ? resp::parse_cluster_shards(r, n.addr, out, why, tls)
                                        : resp::parse_cluster_slots(r, n.addr, out, why);
      if (ec) {
        codec_.note(n.where + ": " + why);
        return ec;
      }
      if (out.covered() == 0) {
        codec_.note(n.where + ": the slot map assigns no slot (is the cluster created?)");
        return make_error_code(errc::unexpected_reply);
      }
      return {};
    }
    return make_error_code(errc::server_error);
  }

  // Runs the per-key commands with redirects; see the header comment.
  template <class Add, class Judge>
  std::error_code run(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl,
                      resp::request_size kind, const std::vector<std::size_t>& bytes, Add&& add,
                      Judge&& judge) {
    if (keys.empty()) return {};
    std::vector<entry> es(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      es[i].name = codec_.key_text(keys[i]);
      es[i].slot = resp::hash_slot(es[i].name);
    }
    std::fill(status.begin(), status.end(), chunk_status::error);
    if (map_generation() == 0) {
      if (std::error_code ec = refresh_if(0, dl)) {
        if (ec == errc::timeout) std::fill(status.begin(), status.end(), chunk_status::timeout);
        codec_.count_call(ec, codec_.last_error());
        return ec;
      }
    }
    std::error_code failure;  // why keys are left without a verdict, if any are
    auto backoff = opt_.retry_backoff_min;
    for (int round = 0; round < opt_.max_rounds; ++round) {
      if (round > 0) codec_.count_retry();
      const std::uint64_t seen = map_generation();
      std::vector<round_result> groups = group(es);
      if (groups.empty()) break;
      // A key whose slot has no master now: wait for the cluster (like CLUSTERDOWN).
      bool unowned = false;
      groups.erase(
          std::remove_if(groups.begin(), groups.end(),
                         [&](const round_result& g) { return g.target == nullptr && (unowned = true); }),
          groups.end());
      run_groups(groups, kind, dl, bytes, es, status, add, judge);
      bool need_refresh = unowned, wait = unowned;
      for (const round_result& g : groups) {
        if (!g.moved.empty()) need_refresh = true;
        if (g.retry_later) wait = true;
        if (g.ec) {
          failure = g.ec;
          if (g.ec != errc::timeout) need_refresh = true;  // the master may have failed over
        }
        patch(g.moved);
      }
      if (unowned) failure = make_error_code(errc::server_error);
      if (std::none_of(es.begin(), es.end(), [](const entry& e) { return !e.done; })) return {};
      if (expired(dl)) break;
      if (need_refresh) (void)refresh_if(seen, dl);
      if (wait) {
        const auto until = std::min<deadline>(dl, clock::now() + backoff);
        std::this_thread::sleep_until(until);
        backoff = std::min(backoff * 2, opt_.retry_backoff_max);
      }
    }
    // Keys still without a verdict: the deadline, or rounds spent on redirects and retries.
    const bool late = expired(dl);
    std::size_t left = 0;
    for (std::size_t i = 0; i < es.size(); ++i) {
      if (es[i].done) continue;
      ++left;
      status[i] = late ? chunk_status::timeout : chunk_status::error;
    }
    const std::error_code ec = late      ? make_error_code(errc::timeout)
                               : failure ? failure
                                         : make_error_code(errc::server_error);
    codec_.count_call(ec, late ? "cluster: deadline passed with " + std::to_string(left) +
                                     " key(s) unserved (" + codec_.last_error() + ")"
                               : "cluster: " + std::to_string(left) + " key(s) unserved after " +
                                     std::to_string(opt_.max_rounds) +
                                     " rounds of redirects/retries (last: " + codec_.last_error() + ")");
    return ec;
  }

  // The keys without a verdict, grouped by the node to send them to (target nullptr: no master).
  std::vector<round_result> group(const std::vector<entry>& es) const {
    std::vector<round_result> groups;
    std::shared_lock lock(map_mu_);
    for (std::size_t i = 0; i < es.size(); ++i) {
      if (es[i].done) continue;
      node* target = es[i].ask;
      if (target == nullptr) {
        const std::uint16_t o = map_.owner(es[i].slot);
        if (o != resp::slot_map::no_node) target = map_nodes_[o];
      }
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const round_result& r) { return r.target == target; });
      if (g == groups.end()) {
        groups.push_back(round_result{target, {}, {}, {}, false});
        g = groups.end() - 1;
      }
      g->entries.push_back(i);
    }
    return groups;
  }

  // Every group's pipeline, in parallel when the call moves payloads and spans several nodes.
  template <class Add, class Judge>
  void run_groups(std::vector<round_result>& groups, resp::request_size kind, deadline dl,
                  const std::vector<std::size_t>& bytes, std::vector<entry>& es,
                  std::span<chunk_status> status, Add& add, Judge& judge) {
    std::vector<std::thread> helpers;
    if (kind == resp::request_size::large && groups.size() > 1) {
      for (std::size_t g = 1; g < groups.size(); ++g) {
        try {
          helpers.emplace_back([&, g] { run_group(groups[g], kind, dl, bytes, es, status, add, judge); });
        } catch (const std::system_error&) {
          run_group(groups[g], kind, dl, bytes, es, status, add, judge);  // no thread: run it here
        }
      }
      run_group(groups[0], kind, dl, bytes, es, status, add, judge);
    } else {
      for (auto& g : groups) run_group(g, kind, dl, bytes, es, status, add, judge);
    }
    for (auto& t : helpers) t.join();
  }

  // One node's share of the round, cut into pieces (batch_spread.hpp) over up to as many of
  // its pooled connections: per piece one pipeline, ASKING before each asked key, the key's
  // command, then the verdicts. Touches only its own entries (es[i], status[i] for i in
  // g.entries) and g (under a lock: the lanes run in parallel).
  template <class Add, class Judge>
  void run_group(round_result& g, resp::request_size kind, deadline dl, const std::vector<std::size_t>& bytes,
                 std::vector<entry>& es, std::span<chunk_status> status, Add& add, Judge& judge) {
    node& n = *g.target;
    detail::batch_pieces pieces;
    if (bytes.empty() || opt_.spread.max_reply_bytes == 0) {
      pieces.starts = {0, g.entries.size()};
    } else {
      std::vector<std::size_t> own(g.entries.size());
      for (std::size_t j = 0; j < own.size(); ++j) own[j] = bytes[g.entries[j]];
      pieces = detail::cut_batch(own, opt_.spread.max_reply_bytes);
    }
    const std::size_t usable =
        kind == resp::request_size::large ? n.pool.size() - n.pool.reserved_small() : n.pool.size();
    const std::size_t cap =
        opt_.spread.max_connections == 0 ? usable : std::min(usable, opt_.spread.max_connections);
    std::vector<typename resp::connection_pool<Connection>::lease> leases;
    std::string why;  // a deadline already passed, a node down, or no connection free in time
    std::error_code aec =
        n.pool.acquire_up_to(kind, std::min(pieces.count(), std::max<std::size_t>(cap, 1)), dl, leases, &why);
    if (!aec && expired(dl))
      aec = make_error_code(errc::timeout), why = "the deadline passed while waiting for a pooled connection";
    if (aec) {
      g.ec = aec;
      codec_.note(n.where + ": " + why);
      return;
    }
    std::atomic<std::size_t> next{0};
    std::mutex g_mu;  // g.moved, g.retry_later, g.ec
    auto lane = [&](std::size_t k) noexcept {
      detail::remote_scratch& s = n.scratch[leases[k].index()];
      Connection& conn = leases[k].conn();
      for (std::size_t p; (p = next.fetch_add(1)) < pieces.count();) {
        std::error_code ec;
        try {
          ec = run_piece(g, n, s, conn, pieces.starts[p], pieces.starts[p + 1], dl, es, status, add, judge,
                         g_mu);
        } catch (const std::bad_alloc&) {
          ec = std::make_error_code(std::errc::not_enough_memory);
          codec_.note(n.where + ": out of memory preparing a batch");
        }
        if (!ec) continue;
        if (ec != std::errc::not_enough_memory) codec_.note(conn.last_error());
        std::lock_guard<std::mutex> lock(g_mu);
        if (!g.ec || ec == errc::timeout) g.ec = ec;
        if (ec != errc::timeout)
          g.retry_later = true;  // unreachable or lost: retried after a refresh and a wait
        return;                  // this connection stops: the other lanes take the pieces left
      }
    };
    std::vector<std::size_t> ids(leases.size());
    for (std::size_t k = 0; k < leases.size(); ++k) ids[k] = leases[k].index();
    n.crew.run(ids, lane);
    // Pieces no lane took stay without a verdict: the next round (or the deadline) decides.
  }

  // Entries [first, last) of g on one connection; the entries' verdicts, redirects noted in g.
  template <class Add, class Judge>
  std::error_code run_piece(round_result& g, node& n, detail::remote_scratch& s, Connection& conn,
                            std::size_t first, std::size_t last, deadline dl, std::vector<entry>& es,
                            std::span<chunk_status> status, Add& add, Judge& judge, std::mutex& g_mu) {
    s.size_for(last - first);
    std::vector<std::size_t> reply_of(last - first);  // reply index of piece entry j's command
    for (std::size_t j = 0; j < last - first; ++j) {
      entry& e = es[g.entries[first + j]];
      if (e.ask != nullptr) s.batch.add({"ASKING"});
      reply_of[j] = s.batch.size();
      add(s, j, g.entries[first + j], e.name);
    }
    const std::error_code ec = conn.execute(s.batch, dl);
    for (std::size_t j = 0; j < last - first; ++j) {
      const std::size_t i = g.entries[first + j];
      entry& e = es[i];
      if (reply_of[j] >= s.batch.completed()) continue;  // left for the failure (next round)
      const resp::value& r = s.batch.reply(reply_of[j]);
      if (r.is_error()) {
        const resp::redirect rd = resp::parse_redirect(r.str, n.addr);
        if (rd.kind != resp::redirect_kind::none) {
          codec_.note(n.where + ": " + e.name + ": " + r.str);
          e.ask = nullptr;
          std::lock_guard<std::mutex> lock(g_mu);
          if (rd.kind == resp::redirect_kind::moved) {
            codec_.count_redirect();
            g.moved.push_back(rd);
          } else if (rd.kind == resp::redirect_kind::ask) {
            codec_.count_redirect();
            e.ask = node_for(rd.node);
          } else {
            g.retry_later = true;
          }
          continue;
        }
      }
      e.ask = nullptr;
      e.done = true;
      status[i] = judge(s, j, i, r, n, e.name);
    }
    return ec;
  }

  // MOVED: the slot's master is the named node from now on.
  void patch(const std::vector<resp::redirect>& moved) {
    for (const resp::redirect& rd : moved) {
      node* target = node_for(rd.node);
      std::unique_lock lock(map_mu_);
      const std::uint16_t index = map_.add_node(rd.node);
      if (index >= map_nodes_.size()) map_nodes_.push_back(target);
      map_.assign(rd.slot, rd.slot, index);
    }
  }

  detail::remote_codec codec_;
  cluster_options opt_;
  mutable std::shared_mutex map_mu_;
  resp::slot_map map_;
  std::vector<node*> map_nodes_;  // map_.nodes()[k] -> its node
  std::uint64_t generation_ = 0;  // installs so far (0: no map yet)
  // One refresh at a time, waited for by deadline. A flag under a mutex and a condition
  // variable, not std::timed_mutex: its try_lock_until is pthread_mutex_clocklock, which
  // ThreadSanitizer does not intercept (it then reports every unlock as an unlocked mutex).
  std::mutex refresh_mu_;
  std::condition_variable refresh_cv_;
  bool refreshing_ = false;       // under refresh_mu_
  std::size_t refresh_turn_ = 0;  // while refreshing_ is ours
  mutable std::mutex nodes_mu_;
  std::vector<std::unique_ptr<node>> nodes_;
};

}  // namespace kvtier
