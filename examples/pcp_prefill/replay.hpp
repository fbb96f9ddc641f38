// examples/pcp_prefill/replay.hpp: one replay from the command line: the trace read
// or generated, the priming pass, the stores built for the chosen L2 (embedded modeled
// servers, none, or real servers by URL), the engine run on the ranks' threads or as
// this process's rank of an MPI job, and the run's report (per-request JSON lines,
// the modeled costs, the table row and the summary JSON on the last line).
//
//   pcp::cli::thread_ranks w;
//   return pcp::cli::run_replay(w, pcp::cli::parse_replay(argc, argv));
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.hpp"
#include "engine.hpp"
#include "kvtier/resp/url.hpp"
#include "model_stores.hpp"
#include "report.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

#if defined(PCP_HAVE_RESP)
#include "resp_l2.hpp"
#endif
#if defined(PCP_HAVE_MPI)
#include "kvtier/comm/mpi.hpp"
#endif

namespace pcp::cli {

/// The sync queue's load (rho) or the L2 path's (async): arrival rate times the
/// modeled time one hit holds the engine (sync: T0 + bytes / B, one at a time) or
/// the tier (async: bytes / B). 0 when no modeled L2 is read.
inline double l2_rho(const options& o, const std::vector<pcp::prepared_request>& reqs) {
  if (o.l2 != "embedded" || o.eng.mode == pcp::load_mode::recompute || reqs.size() < 2 ||
      o.eng.closed_loop_clients > 0)
    return 0;
  double tokens = 0;
  for (const auto& r : reqs) tokens += static_cast<double>(r.n_chunks() * o.tm.chunk_tokens);
  const double span = reqs.back().src->t - reqs.front().src->t;
  if (!(span > 0)) return 0;
  const double lambda = static_cast<double>(reqs.size() - 1) / span;
  const double gb = kvtier::kv_gb(tokens / static_cast<double>(reqs.size()), o.tm.bytes_per_token);
  const double hold = gb / o.tm.l2_total_gbps(o.eng.world);
  return lambda * (o.eng.mode == pcp::load_mode::sync ? o.tm.l2_t0_s + hold : hold);
}

/// Where the ranks run: W threads of this process. Every rank's stores live here.
struct thread_ranks {
  bool hosts(std::uint32_t) const { return true; }
  bool lead() const { return true; }
  template <class L2>
  pcp::run_result run(const std::vector<pcp::prepared_request>& reqs, const pcp::timing_model& tm,
                      const pcp::engine_options& eo, const std::vector<pcp::modeled_l1*>& l1s,
                      const std::vector<L2*>& l2s) {
    return pcp::engine<L2>(reqs, tm, eo, l1s, l2s).run();
  }
  /// Counters over every rank: here they already are.
  void sum(std::span<std::uint64_t>) {}
};

#if defined(PCP_HAVE_MPI)
/// Where the ranks run (--mpi): this process is rank comm.rank() of W; only its own stores
/// live here. The same engine code as the thread form, over an MPI communicator; rank 0
/// prints. A rank whose run failed ends the job (MPI_Abort): its peers would wait on it.
struct process_ranks {
  kvtier::comm::mpi_communicator comm;
  bool hosts(std::uint32_t r) const { return r == comm.rank(); }
  bool lead() const { return comm.rank() == 0; }
  template <class L2>
  pcp::run_result run(const std::vector<pcp::prepared_request>& reqs, const pcp::timing_model& tm,
                      const pcp::engine_options& eo, const std::vector<pcp::modeled_l1*>& l1s,
                      const std::vector<L2*>& l2s) {
    auto r = pcp::engine<L2, kvtier::comm::mpi_communicator>(reqs, tm, eo, l1s, l2s).run(comm);
    if (!r.fatal.empty()) {
      std::cerr << "pcp_prefill: run aborted: " << r.fatal << "\n";
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return r;
  }
  void sum(std::span<std::uint64_t> v) {
    if (auto ec =
            kvtier::comm::all_reduce(comm, std::span<const std::uint64_t>(v), v, kvtier::comm::reduce_op::sum,
                                     kvtier::deadline_after(std::chrono::seconds(60))))
      throw std::runtime_error("sum over ranks: " + comm.last_error());
  }
};
#endif

/// The untimed priming replay (recompute, storing every full chunk); false if it failed.
template <class World, class L2>
bool prime(World& w, const options& o, const std::vector<pcp::prepared_request>& prime_set,
           const std::vector<pcp::modeled_l1*>& l1s, const std::vector<L2*>& l2s) {
  if (!prime_set.empty()) {
    if (w.lead()) std::cerr << "priming: replaying " << prime_set.size() << " requests once, untimed\n";
    pcp::engine_options po = o.eng;
    po.mode = pcp::load_mode::recompute;
    po.timed = false;
    po.progress = false;
    po.closed_loop_clients = 0;
    const auto pr = w.run(prime_set, o.tm, po, l1s, l2s);
    if (!pr.fatal.empty()) {
      std::cerr << "pcp_prefill: priming failed: " << pr.fatal << "\n";
      return false;
    }
    if (!o.keep_l1)
      for (auto* l1 : l1s)
        if (l1) l1->data().clear();
  }
  return true;
}

template <class World, class L2>
int replay(
    World& w, const options& o, const std::vector<pcp::prepared_request>& prime_set,
    const std::vector<pcp::prepared_request>& prepared, const std::vector<pcp::modeled_l1*>& l1s,
    const std::vector<L2*>& l2s, const std::function<void()>& after_prime = [] {}) {
  if (!prime(w, o, prime_set, l1s, l2s)) return 1;
  after_prime();
  pcp::engine_options eo = o.eng;
  eo.progress = !o.quiet;
  const auto wall = std::chrono::steady_clock::now();
  const pcp::run_result r = w.run(prepared, o.tm, eo, l1s, l2s);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  if (!w.lead()) return 0;  // rank 0 of the process form reports for every rank
  if (!r.fatal.empty()) std::cerr << "pcp_prefill: run aborted: " << r.fatal << "\n";
  // A misconfigured tier degrades to recompute; say why, once per rank.
  for (std::size_t k = 0; k < r.l2_errors.size(); ++k)
    if (!r.l2_errors[k].empty())
      std::cerr << "pcp_prefill: rank " << k
                << ": L2 calls failed, recomputing instead (first: " << r.l2_errors[k] << ")\n";
  if (!o.out.empty()) {
    std::ofstream out(o.out);
    if (!out) {
      std::cerr << "pcp_prefill: cannot write " << o.out << "\n";
      return 1;
    }
    for (const auto& q : r.requests) out << pcp::request_json(q) << '\n';
  }
  pcp::summary s = pcp::summarize(r);
  s.rho = l2_rho(o, prepared);
  const auto& c = r.costs;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "\n%zu requests, %llu engine steps, makespan %.3f s (modeled; replayed in %.2f s real), %llu loads "
      "cut short (recomputed from the agreed prefix), %llu failed L2 calls\n"
      "modeled costs: compute %.3f s; %llu lookups %.3f s; %llu loads %.3f s; %llu broadcasts %.3f s; "
      "%llu write-backs %.3f s; longest step wait on I/O %.3f s (modeled), %.4f s in store calls (real "
      "CPU)\n",
      s.requests, static_cast<unsigned long long>(r.steps), r.makespan_s, wall_s,
      static_cast<unsigned long long>(r.failed_loads), static_cast<unsigned long long>(r.failed_l2_calls),
      c.compute_s, static_cast<unsigned long long>(c.lookups), c.lookup_s,
      static_cast<unsigned long long>(c.loads), c.load_s, static_cast<unsigned long long>(c.broadcasts),
      c.broadcast_s, static_cast<unsigned long long>(c.writebacks), c.writeback_s, r.max_io_stall_s,
      r.max_step_io_wall_s);
  std::cout << buf;
  if (s.rho > 0) {
    std::snprintf(
        buf, sizeof buf, "offered load on the L2 path: rho = %.3f%s\n", s.rho,
        s.rho >= 1 ? " (>= 1: overloaded, no steady state; the tail grows with the trace length)" : "");
    std::cout << buf;
  }
  if (o.granularity_set && o.l2 == "embedded") {  // the model's figures are the modeled tier's
    const auto m = pcp::ttft_with_prediction(r, o.tm, o.eng.world, o.eng.granularity);
    std::snprintf(
        buf, sizeof buf,
        "TTFT beside the model, load granularity %s (predicted: each request alone, closed form "
        "on T0, B, R, L = %u layers): p50 %.3f s (predicted %.3f s), p99 %.3f s (predicted %.3f s)\n",
        pcp::to_string(o.eng.granularity), o.tm.kv_layers, m.ttft_p50_s, m.predicted_p50_s, m.ttft_p99_s,
        m.predicted_p99_s);
    std::cout << buf << "ttft_model " << pcp::ttft_beside_model_json(m, o.eng.granularity) << "\n";
  }
  pcp::print_table(std::cout, {{o.name, s}});
  if (!o.plot.empty()) {
    std::string err;
    if (!pcp::plot_runs(o.plot, {{o.name, r.requests}}, err))
      std::cerr << "pcp_prefill: " << err << "\n";
    else
      std::cout << "plot: " << o.plot << "\n";
  }
  std::cout << pcp::summary_json(s) << std::endl;
  return r.fatal.empty() ? 0 : 1;
}

template <class World>
int run_replay(World& w, const options& o) {
  std::vector<pcp::request> reqs;
  std::string err;
  if (!o.trace_file.empty()) {
    if (!pcp::read_trace_file(o.trace_file, reqs, err)) {  // every rank reads the same file
      if (w.lead()) std::cerr << "pcp_prefill: " << err << "\n";
      return 2;
    }
  } else {
    reqs = pcp::generate_trace(o.spec);
  }
  if (o.prime_first >= reqs.size())
    throw usage_error("--prime-first " + std::to_string(o.prime_first) + ": the trace has only " +
                      std::to_string(reqs.size()) + " requests");
  const std::uint32_t W = o.eng.world;
  kvtier::key_namespace ns{.model = "pcp-prefill-example",
                           .kv_format = "synthetic-" + std::to_string(o.tm.chunk_bytes()),
                           .chunk_tokens = o.tm.chunk_tokens,
                           .ownership = kvtier::modulo_ownership(W).geometry()};
  kvtier::chunker<> chunk(ns);
  // What primes the tier, and what is replayed.
  std::vector<pcp::request> prime_reqs, replay_reqs;
  if (o.prime) prime_reqs = reqs;
  if (o.prime_first > 0) {
    prime_reqs.assign(reqs.begin(), reqs.begin() + static_cast<std::ptrdiff_t>(o.prime_first));
    replay_reqs.assign(reqs.begin() + static_cast<std::ptrdiff_t>(o.prime_first), reqs.end());
  } else {
    replay_reqs = reqs;
  }
  if (o.prime_shared) {
    for (const auto& r : reqs) {
      if (r.segments.size() < 2) continue;  // nothing shared
      pcp::request p;
      p.id = r.id;
      p.segments.assign(r.segments.begin(), r.segments.end() - 1);
      pcp::expand_segments(p.segments, p.tokens);
      p.tokens.push_back(0);  // one more token, so the last shared chunk is a full, cacheable one
      prime_reqs.push_back(std::move(p));
    }
  }
  const auto prime_set = pcp::prepare(prime_reqs, chunk);
  const auto prepared = pcp::prepare(replay_reqs, chunk);

  std::uint64_t tokens = 0;
  for (const auto& r : replay_reqs) tokens += r.tokens.size();
  const bool real_l2 = o.l2 != "embedded" && o.l2 != "none";
  if (w.lead()) {
    std::cout << "pcp_prefill: " << replay_reqs.size() << " requests, " << tokens
              << " prompt tokens, W = " << W << ", mode " << pcp::to_string(o.eng.mode) << ", policy "
              << pcp::to_string(o.eng.policy) << ", L2 " << kvtier::resp::redact_url(o.l2);
    if (o.mpi) std::cout << ", ranks as processes (MPI)";
    if (o.prime) std::cout << ", primed with the whole trace";
    if (o.prime_first) std::cout << ", primed with the first " << o.prime_first << " requests (not replayed)";
    if (o.prime_shared) std::cout << ", primed with each request's shared segments";
    if (o.eng.closed_loop_clients)
      std::cout << ", closed loop of " << o.eng.closed_loop_clients << " clients";
    std::cout << "\n";
    o.tm.print(std::cout, W,
               real_l2          ? pcp::l2_kind::real
               : o.l2 == "none" ? pcp::l2_kind::none
                                : pcp::l2_kind::modeled);
    if (o.sustained_gbps > 0 && !real_l2) {
      char buf[256];
      std::snprintf(
          buf, sizeof buf,
          "  L2 rate    %.4g GB/s per instance, derived: a %.2f GB hit held the engine %.3f s at %.3g GB/s "
          "sustained, T0 included; %.3f s of it is T0\n",
          o.tm.l2_gbps, kvtier::kv_gb(16384, o.tm.bytes_per_token),
          kvtier::kv_gb(16384, o.tm.bytes_per_token) / o.sustained_gbps, o.sustained_gbps, o.tm.l2_t0_s);
      std::cout << buf;
    }
    std::cout.flush();
  }

  const std::size_t l1_bytes = static_cast<std::size_t>(o.l1_capacity_gb * 1e9 * o.tm.payload_scale);
  std::vector<std::unique_ptr<pcp::modeled_l1>> l1_store;
  std::vector<pcp::modeled_l1*> l1s;  // per rank; null for a rank of another process
  for (std::uint32_t r = 0; r < W; ++r) {
    l1_store.push_back(w.hosts(r) ? std::make_unique<pcp::modeled_l1>(l1_bytes) : nullptr);
    l1s.push_back(l1_store.back().get());
  }

  if (o.l2 == "embedded") {
    std::vector<std::unique_ptr<pcp::l2_server>> servers;
    for (std::uint32_t k = 0; k < o.tm.l2_instances; ++k)
      servers.push_back(std::make_unique<pcp::l2_server>(std::size_t{1} << 40));
    std::vector<std::unique_ptr<pcp::modeled_l2>> clients;
    std::vector<pcp::modeled_l2*> l2s;
    for (std::uint32_t r = 0; r < W; ++r) {
      clients.push_back(w.hosts(r) ? std::make_unique<pcp::modeled_l2>(*servers[r % servers.size()])
                                   : nullptr);
      l2s.push_back(clients.back().get());
    }
    return replay(w, o, prime_set, prepared, l1s, l2s, [&] {  // faults only in the measured replay
      for (auto& s : servers) s->set_fault_every(o.fault_every);
    });
  }
  if (o.l2 == "none") {
    std::vector<pcp::null_store> nulls(W);
    std::vector<pcp::null_store*> l2s;
    for (auto& n : nulls) l2s.push_back(&n);
    return replay(w, o, prime_set, prepared, l1s, l2s);
  }
#if defined(PCP_HAVE_RESP)
  // Layer-streamed: values in format 2, one checksum group per layer (the connector's groups), so
  // a load reads them group-major and layer 0 is computed while later layers still fetch.
  const auto l2_format = [](const options& o) {
    if (o.eng.granularity != pcp::load_granularity::layer_streamed) return kvtier::value_format::v1();
    return kvtier::value_format::v2(kvtier::layer_group_bytes(o.tm.kv_layout_for(1), o.tm.chunk_tokens, 1));
  };
  if (o.l2.rfind("resp", 0) != 0 && o.l2.rfind("rediss://", 0) != 0)
    throw usage_error("--l2 '" + kvtier::resp::redact_url(o.l2) +
                      "': expected embedded, none, or a resp:// / resp+unix:// / resp+cluster:// URL (or "
                      "rediss:// / resp+tls:// / resp+cluster+tls://)");
  auto pools = pcp::make_resp_l2s(
      with_password(o), W, chunk.ns(), o.eng.fetch_workers + 3,  // per server
      o.tls, [&](std::uint32_t r) { return w.hosts(r); }, l2_format(o));
  std::vector<pcp::resp_l2*> l2s;
  for (auto& p : pools) l2s.push_back(p.get());
  const int rc = replay(w, o, prime_set, prepared, l1s, l2s);
  std::uint64_t st[5] = {};  // hits, misses, corrupt, timeouts, errors: over every rank
  for (auto* p : l2s) {
    if (!p) continue;
    const auto x = p->stats();
    st[0] += x.hits, st[1] += x.misses, st[2] += x.corrupt, st[3] += x.timeouts, st[4] += x.errors;
  }
  w.sum(st);
  if (w.lead())
    std::cerr << "L2 servers: " << st[0] << " chunk hits, " << st[1] << " misses, " << st[2] << " corrupt, "
              << st[3] << " timed-out calls, " << st[4] << " failed calls\n";
  return rc;
#else
  throw usage_error("--l2 '" + kvtier::resp::redact_url(o.l2) +
                    "': expected embedded or none (this build has no RESP client: kvtier::asio missing)");
#endif
}

}  // namespace pcp::cli
