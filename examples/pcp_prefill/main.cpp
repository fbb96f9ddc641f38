// pcp_prefill: a PCP prefill engine made of kvtier components, replaying a
// request trace under an explicit timing model. See --help.
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "kvtier/resp/connection.hpp"
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

namespace {

const char* usage = R"(usage:
  pcp_prefill [options]                      replay a trace through the engine
  mpiexec -n W pcp_prefill --mpi [options]   the same, one process per rank (MPI)
  pcp_prefill gen-trace --kind hit-heavy|cold|mixed|long [--requests N] [--seed S] [--rate R] --out FILE
  pcp_prefill table NAME=SUMMARY_FILE ...     side-by-side table of replays (+ the reference's figures)
  pcp_prefill plot OUT.png NAME=REQUESTS_FILE ...
  pcp_prefill fit-t0 [--measured-s 0.40] [--tokens 16384] [--gbps 10.76]   T0 in ms from one measured hit
                                              (a calibration: the fitted hit takes exactly the measured time)
  pcp_prefill instance-gbps --sustained-gbps G --t0-ms T [--tokens 16384]
                                              an instance's rate beside a separate T0, from what it sustained

replay options:
  --trace FILE                JSONL trace (one request per line)
  --generate KIND             use a generated stream instead of a file: hit-heavy, cold, mixed (questions
                              about half of each prompt) or long (64k-200k tokens, slow arrivals);
                              --requests, --seed, --rate apply
  --world W                   ranks (threads) in lockstep (8)
  --mpi                       ranks as processes: run under mpiexec -n W, one rank per process
                              (W from mpiexec; --world, if given, must match); rank 0 reports
  --mode recompute|sync|async|split   loading mode (async); split computes the front of a hit while
                              loading its back, at the cost model's split point
  --policy always|cost        load every hit, or let the cost model decide per request (always)
  --closed-loop N             N clients, each sending its next request when its last completes
  --l2 embedded|none|URL      L2: in-process modeled servers (default), none, a resp:// URL template with
                              {rank} or {rank+N} (one server per rank), or a plain URL (one shared server)
  --l2-password-env VAR       the L2 password from environment variable VAR (keeps it out of argv)
  --l2-password-file FILE     the L2 password from the first line of FILE
  --l2-tls-ca FILE            rediss:// / resp+tls:// / resp+cluster+tls:// L2: trust the CAs in FILE
                              (PEM; default: the system's CAs)
  --l2-tls-cert FILE          ... and present this client certificate (PEM), with
  --l2-tls-key FILE           its private key (PEM), to servers that ask for one
  --l1-capacity-gb X          L1 capacity per rank, modeled decimal GB (64)
  --prime                     replay the whole trace once untimed first (stores every full chunk), then clear L1
  --prime-first N             prime with the first N requests only, then replay the others: prefix
                              sharing decides their hits
  --prime-shared              prime with each request's shared segments only (all but its last)
  --keep-l1                   with a --prime*: keep L1 filled
  --out FILE                  per-request JSON lines
  --plot FILE.png             TTFT against arrival time and TTFT CDF (gnuplot)
  --name NAME                 label of this run in the table (the mode)
  --quiet                     no progress line on stderr
timing model (modeled seconds; defaults are the reference's figures):
  --prefill-tokens-per-s R    (52200)      --bytes-per-token S     (48400)
  --payload-scale X           stored bytes per modeled byte (1/8192)
  --chunk-tokens N            (256)
  --kv-layout mla|fa-nhd      each rank's paged KV cache: vLLM MLA (bf16 latent) or FlashAttention
                              NHD (fp8 K and V, one head) (mla); its width is fitted so a token
                              holds the stored payload (modeled bytes * --payload-scale)
  --kv-layers N (3)   --kv-block-tokens N (64)   --kv-cache-tokens N (0: the trace's tokens)
  --l2-model-instances K      (1)          --l2-model-gbps G       per instance (1.71)
  --l2-sustained-gbps G       instead of --l2-model-gbps: derive the instance rate from the rate an
                              instance sustained per 16,384-token hit, T0 included (see instance-gbps)
  --l2-model-t0-ms T          fixed cost per load and write-back request (330)
  --l2-model-rtt-ms T         a lookup's round trip (0.5)   --l2-model-key-us T  server time per key (2)
  --l1-model-gbps G           per rank (0.5)   --l1-model-t0-ms T  (50)
  --interconnect-gbps G       owner -> all broadcast: bytes a rank receives per second (100)
  --collective-us T           latency of one collective (20)
engine:
  --max-batch-tokens N (32768)  --max-batch-requests N (256)
  --load-timeout-s S          one deadline per request, from its lookup, over every rank's I/O (10, modeled)
  --broadcast per_chunk|grouped|gathered (grouped)   --fetch-workers N (8)
  --estimator-prior optimistic|model   the load estimator's starting (T0, B): optimistic (0 ms, 1000 GB/s;
                              the first hits teach it) or model (the modeled tier's T0 and B, as a probe
                              of the tier would report them); refined online by every load either way
  --cost-slack-ms X           --policy cost: also load when predicted at most X ms slower than recompute (0)
  --l2-fault-every N          cut every N-th L2 load short (fault injection; 0 = never)
)";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE || !(x >= lo && x <= hi))
    throw usage_error(flag + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got '" + v + "'");
  return x;
}
std::uint64_t parse_uint(const std::string& flag, const std::string& v, std::uint64_t lo, std::uint64_t hi) {
  std::uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc{} || p != v.data() + v.size() || x < lo || x > hi)
    throw usage_error(flag + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got '" + v + "'");
  return x;
}

/// The value that `v` names among `choices`; anything else is a usage error listing the names.
template <class T>
T parse_choice(const std::string& flag, const std::string& v,
               std::initializer_list<std::pair<std::string_view, T>> choices) {
  std::string names;
  std::size_t k = 0;
  for (const auto& [name, value] : choices) {
    if (v == name) return value;
    names += k == 0 ? "" : (k + 1 == choices.size() ? " or " : ", ");
    names += name;
    ++k;
  }
  throw usage_error(flag + ": expected " + names + ", got '" + v + "'");
}

struct options {
  std::string trace_file, generate, l2 = "embedded", out, plot, name, password_env, password_file;
  pcp::trace_spec spec;
  bool requests_set = false, seed_set = false, rate_set = false;
  pcp::timing_model tm;
  pcp::engine_options eng;
  double l1_capacity_gb = 64;
  double sustained_gbps = 0;  ///< > 0: derive tm.l2_gbps from it
  bool prime = false, prime_shared = false, keep_l1 = false, quiet = false, prior_from_model = false;
  bool mpi = false, world_set = false;
  std::size_t prime_first = 0;
  std::uint64_t fault_every = 0;
  kvtier::resp::tls_options tls;  ///< for TLS L2 endpoints (--l2-tls-*)
};

/// The generated stream of kind `kind` (hit-heavy, cold, mixed, long).
pcp::trace_spec generated_spec(const std::string& kind, const options& o) {
  pcp::trace_spec spec;
  if (kind == "long") spec = pcp::long_prompt_spec();
  if (kind == "hit-heavy" || kind == "long")
    spec.kind = pcp::trace_kind::hit_heavy;
  else if (kind == "cold")
    spec.kind = pcp::trace_kind::cold;
  else if (kind == "mixed")
    spec.kind = pcp::trace_kind::mixed;
  else
    throw usage_error("expected a stream kind hit-heavy, cold, mixed or long, got '" + kind + "'");
  if (o.requests_set) spec.requests = o.spec.requests;
  if (o.seed_set) spec.seed = o.spec.seed;
  if (o.rate_set) spec.rate_per_s = o.spec.rate_per_s;
  return spec;
}

/// The replay's options. `mpi_world`: the number of processes when running under MPI (0: not).
options parse_replay(int argc, char** argv, std::uint32_t mpi_world = 0) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(a + ": missing value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (a == "--trace")
      o.trace_file = val();
    else if (a == "--generate")
      o.generate = val();
    else if (a == "--requests")
      o.spec.requests = parse_uint(a, val(), 1, 1'000'000), o.requests_set = true;
    else if (a == "--seed")
      o.spec.seed = parse_uint(a, val(), 0, 1ull << 62), o.seed_set = true;
    else if (a == "--rate")
      o.spec.rate_per_s = parse_double(a, val(), 1e-6, 1e6), o.rate_set = true;
    else if (a == "--estimator-prior")
      o.prior_from_model = parse_choice<bool>(a, val(), {{"optimistic", false}, {"model", true}});
    else if (a == "--closed-loop")
      o.eng.closed_loop_clients = parse_uint(a, val(), 1, 1'000'000);
    else if (a == "--l2-password-env")
      o.password_env = val();
    else if (a == "--l2-password-file")
      o.password_file = val();
    else if (a == "--l2-tls-ca")
      o.tls.ca_file = val();
    else if (a == "--l2-tls-cert")
      o.tls.cert_file = val();
    else if (a == "--l2-tls-key")
      o.tls.key_file = val();
    else if (a == "--prime-first")
      o.prime_first = parse_uint(a, val(), 1, 1'000'000);
    else if (a == "--prime-shared")
      o.prime_shared = true;
    else if (a == "--l2-sustained-gbps")
      o.sustained_gbps = parse_double(a, val(), 1e-6, 1e6);
    else if (a == "--l2-model-rtt-ms")
      o.tm.l2_rtt_s = parse_double(a, val(), 0, 1e7) / 1e3;
    else if (a == "--l2-model-key-us")
      o.tm.l2_key_s = parse_double(a, val(), 0, 1e9) / 1e6;
    else if (a == "--interconnect-gbps")
      o.tm.interconnect_gbps = parse_double(a, val(), 1e-6, 1e9);
    else if (a == "--collective-us")
      o.tm.collective_s = parse_double(a, val(), 0, 1e9) / 1e6;
    else if (a == "--world")
      o.eng.world = static_cast<std::uint32_t>(parse_uint(a, val(), 1, 256)), o.world_set = true;
    else if (a == "--mpi")
      o.mpi = true;
    else if (a == "--mode") {
      using enum pcp::load_mode;
      o.eng.mode = parse_choice<pcp::load_mode>(
          a, val(), {{"recompute", recompute}, {"sync", sync}, {"async", async}, {"split", split}});
    } else if (a == "--policy")
      o.eng.policy = parse_choice<pcp::load_policy>(
          a, val(), {{"always", pcp::load_policy::always}, {"cost", pcp::load_policy::cost}});
    else if (a == "--l2")
      o.l2 = val();
    else if (a == "--l1-capacity-gb")
      o.l1_capacity_gb = parse_double(a, val(), 0, 1e6);
    else if (a == "--prime")
      o.prime = true;
    else if (a == "--keep-l1")
      o.keep_l1 = true;
    else if (a == "--out")
      o.out = val();
    else if (a == "--plot")
      o.plot = val();
    else if (a == "--name")
      o.name = val();
    else if (a == "--quiet")
      o.quiet = true;
    else if (a == "--prefill-tokens-per-s")
      o.tm.prefill_tokens_per_s = parse_double(a, val(), 1, 1e9);
    else if (a == "--bytes-per-token")
      o.tm.bytes_per_token = parse_double(a, val(), 1, 1e9);
    else if (a == "--payload-scale")
      o.tm.payload_scale = parse_double(a, val(), 1e-9, 1);
    else if (a == "--kv-layout")
      o.tm.kv = parse_choice<pcp::kv_layout_kind>(
          a, val(), {{"mla", pcp::kv_layout_kind::mla}, {"fa-nhd", pcp::kv_layout_kind::fa_nhd}});
    else if (a == "--kv-layers")
      o.tm.kv_layers = static_cast<std::uint32_t>(parse_uint(a, val(), 1, 1024));
    else if (a == "--kv-block-tokens")
      o.tm.kv_block_tokens = static_cast<std::uint32_t>(parse_uint(a, val(), 1, 1 << 16));
    else if (a == "--kv-cache-tokens")
      o.eng.kv_cache_tokens = parse_uint(a, val(), 0, 1ull << 40);
    else if (a == "--chunk-tokens")
      o.tm.chunk_tokens = static_cast<std::uint32_t>(parse_uint(a, val(), 1, 1 << 20));
    else if (a == "--l2-model-instances")
      o.tm.l2_instances = static_cast<std::uint32_t>(parse_uint(a, val(), 1, 4096));
    else if (a == "--l2-model-gbps")
      o.tm.l2_gbps = parse_double(a, val(), 1e-6, 1e6);
    else if (a == "--l2-model-t0-ms")
      o.tm.l2_t0_s = parse_double(a, val(), 0, 1e7) / 1e3;
    else if (a == "--l1-model-gbps")
      o.tm.l1_gbps = parse_double(a, val(), 1e-6, 1e6);
    else if (a == "--l1-model-t0-ms")
      o.tm.l1_t0_s = parse_double(a, val(), 0, 1e7) / 1e3;
    else if (a == "--max-batch-tokens")
      o.eng.max_batch_tokens = parse_uint(a, val(), 1, 1ull << 32);
    else if (a == "--max-batch-requests")
      o.eng.max_batch_requests = parse_uint(a, val(), 1, 1 << 20);
    else if (a == "--load-timeout-s")
      o.eng.load_timeout_s = parse_double(a, val(), 1e-6, 1e7);
    else if (a == "--cost-slack-ms")
      o.eng.cost_slack_s = parse_double(a, val(), 0, 1e7) / 1e3;
    else if (a == "--fetch-workers")
      o.eng.fetch_workers = parse_uint(a, val(), 1, 256);
    else if (a == "--l2-fault-every")
      o.fault_every = parse_uint(a, val(), 0, 1ull << 62);
    else if (a == "--broadcast") {
      using enum kvtier::broadcast_mode;
      o.eng.broadcast = parse_choice<kvtier::broadcast_mode>(
          a, val(), {{"per_chunk", per_chunk}, {"grouped", grouped}, {"gathered", gathered}});
    } else
      throw usage_error("unknown option '" + a + "' (see --help)");
  }
  if (o.mpi) {
    if (mpi_world == 0)
      throw usage_error("--mpi: this build has no MPI (kvtier::mpi missing: install libopenmpi-dev)");
    if (o.world_set && o.eng.world != mpi_world)
      throw usage_error("--world " + std::to_string(o.eng.world) + " but mpiexec started " +
                        std::to_string(mpi_world) + " processes (with --mpi, W is the number of processes)");
    o.eng.world = mpi_world;
  }
  if (o.trace_file.empty() == o.generate.empty())
    throw usage_error("give exactly one of --trace FILE or --generate hit-heavy|cold");
  if (!o.generate.empty()) o.spec = generated_spec(o.generate, o);
  const int primes = int(o.prime) + int(o.prime_shared) + int(o.prime_first > 0);
  if (primes > 1) throw usage_error("give at most one of --prime, --prime-first, --prime-shared");
  if (o.keep_l1 && primes == 0) throw usage_error("--keep-l1 needs --prime, --prime-first or --prime-shared");
  if (!o.password_env.empty() && !o.password_file.empty())
    throw usage_error("give at most one of --l2-password-env and --l2-password-file");
  if (o.tls.cert_file.empty() != o.tls.key_file.empty())
    throw usage_error("give both --l2-tls-cert and --l2-tls-key, or neither");
  const bool tls_flags = !o.tls.ca_file.empty() || !o.tls.cert_file.empty();
  const bool tls_l2 = o.l2.rfind("rediss://", 0) == 0 || o.l2.rfind("resp+tls://", 0) == 0 ||
                      o.l2.rfind("resp+cluster+tls://", 0) == 0;
  if (tls_flags && !tls_l2)  // they would be ignored: a plaintext L2 never reads them
    throw usage_error(
        "--l2-tls-ca, --l2-tls-cert and --l2-tls-key need a TLS --l2 (rediss://, resp+tls:// or "
        "resp+cluster+tls://); --l2 is '" +
        (o.l2.find("://") == std::string::npos ? o.l2 : kvtier::resp::redact_url(o.l2)) + "'");
  if (o.prior_from_model && o.l2 != "embedded")
    throw usage_error("--estimator-prior model needs --l2 embedded");
  if (o.sustained_gbps > 0) {  // the instance rate beside T0, from the rate it sustained per hit
    const double gb = kvtier::kv_gb(16384, o.tm.bytes_per_token);
    o.tm.l2_gbps = kvtier::instance_rate_gb_per_s(o.sustained_gbps, gb, o.tm.l2_t0_s);
    if (!std::isfinite(o.tm.l2_gbps))
      throw usage_error(
          "--l2-sustained-gbps: T0 is longer than a whole hit at that rate; no instance rate fits");
  }
  if (o.prior_from_model)
    o.eng.estimator_prior = {.fixed_cost_s = o.tm.l2_t0_s,
                             .bandwidth_gb_per_s = o.tm.l2_total_gbps(o.eng.world)};
  if (o.name.empty())
    o.name =
        std::string(pcp::to_string(o.eng.mode)) + (o.eng.policy == pcp::load_policy::cost ? "+cost" : "");
  return o;
}

/// The sync queue's load (rho) or the L2 path's (async): arrival rate times the
/// modeled time one hit holds the engine (sync: T0 + bytes / B, one at a time) or
/// the tier (async: bytes / B). 0 when no modeled L2 is read.
double l2_rho(const options& o, const std::vector<pcp::prepared_request>& reqs) {
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

/// `url` with the password from --l2-password-env / --l2-password-file put in.
std::string with_password(const options& o) {
  std::string pw;
  if (!o.password_env.empty()) {
    const char* v = std::getenv(o.password_env.c_str());
    if (!v) throw usage_error("--l2-password-env: environment variable " + o.password_env + " is not set");
    pw = v;
  } else if (!o.password_file.empty()) {
    std::ifstream f(o.password_file);
    if (!f || !std::getline(f, pw)) throw usage_error("--l2-password-file: cannot read " + o.password_file);
    while (!pw.empty() && (pw.back() == '\r' || pw.back() == ' ')) pw.pop_back();
  } else {
    return o.l2;
  }
  const auto scheme = o.l2.find("://");
  if (scheme == std::string::npos) throw usage_error("--l2: a password needs a resp:// URL");
  const std::size_t host = scheme + 3;
  const auto at = o.l2.find('@', host);
  if (at != std::string::npos && o.l2.find('/', host) > at)
    throw usage_error("--l2: the URL already has user-info; give the password in one place");
  if (pw.find_first_of("@/:") != std::string::npos)
    throw usage_error("the L2 password must not contain '@', '/' or ':'");
  return o.l2.substr(0, host) + ":" + pw + "@" + o.l2.substr(host);
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
  if (o.l2.rfind("resp", 0) != 0 && o.l2.rfind("rediss://", 0) != 0)
    throw usage_error("--l2 '" + kvtier::resp::redact_url(o.l2) +
                      "': expected embedded, none, or a resp:// / resp+unix:// / resp+cluster:// URL (or "
                      "rediss:// / resp+tls:// / resp+cluster+tls://)");
  auto pools = pcp::make_resp_l2s(with_password(o), W, chunk.ns(), o.eng.fetch_workers + 3,  // per server
                                  o.tls, [&](std::uint32_t r) { return w.hosts(r); });
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

// T0 from the cost model's one-point fit: a measured hit time at a known bandwidth.
int run_fit_t0(int argc, char** argv) {
  double measured = 0.40, tokens = 16384, gbps = 10.76, s = 48.4e3;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw usage_error(a + ": missing value");
    const std::string v = argv[++i];
    if (a == "--measured-s")
      measured = parse_double(a, v, 0, 1e6);
    else if (a == "--tokens")
      tokens = parse_double(a, v, 1, 1e9);
    else if (a == "--gbps")
      gbps = parse_double(a, v, 1e-6, 1e6);
    else if (a == "--bytes-per-token")
      s = parse_double(a, v, 1, 1e9);
    else
      throw usage_error("fit-t0: unknown option '" + a + "'");
  }
  const double t0 = kvtier::fit_fixed_cost_s(measured, kvtier::kv_gb(tokens, s), gbps);
  std::printf("%.1f\n", t0 * 1e3);  // milliseconds, for --l2-model-t0-ms (a calibration, not a prediction)
  return 0;
}

int run_gen_trace(int argc, char** argv) {
  options o;
  std::string out, kind;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(a + ": missing value");
      return argv[++i];
    };
    if (a == "--kind")
      kind = val();
    else if (a == "--requests")
      o.spec.requests = parse_uint(a, val(), 1, 1'000'000), o.requests_set = true;
    else if (a == "--seed")
      o.spec.seed = parse_uint(a, val(), 0, 1ull << 62), o.seed_set = true;
    else if (a == "--rate")
      o.spec.rate_per_s = parse_double(a, val(), 1e-6, 1e6), o.rate_set = true;
    else if (a == "--out")
      out = val();
    else
      throw usage_error("gen-trace: unknown option '" + a + "'");
  }
  const pcp::trace_spec spec = generated_spec(kind, o);
  if (out.empty()) throw usage_error("gen-trace: --out FILE is required");
  std::ofstream f(out);
  if (!f) throw usage_error("gen-trace: cannot write " + out);
  pcp::write_trace(f, pcp::generate_trace(spec));
  return f ? 0 : 1;
}

// An instance's rate beside a separate T0, from the rate it sustained per hit.
int run_instance_gbps(int argc, char** argv) {
  double sustained = 0, t0_ms = -1, tokens = 16384, s = 48.4e3;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw usage_error(a + ": missing value");
    const std::string v = argv[++i];
    if (a == "--sustained-gbps")
      sustained = parse_double(a, v, 1e-6, 1e6);
    else if (a == "--t0-ms")
      t0_ms = parse_double(a, v, 0, 1e7);
    else if (a == "--tokens")
      tokens = parse_double(a, v, 1, 1e9);
    else if (a == "--bytes-per-token")
      s = parse_double(a, v, 1, 1e9);
    else
      throw usage_error("instance-gbps: unknown option '" + a + "'");
  }
  if (!(sustained > 0) || t0_ms < 0)
    throw usage_error("instance-gbps: --sustained-gbps and --t0-ms are required");
  const double r = kvtier::instance_rate_gb_per_s(sustained, kvtier::kv_gb(tokens, s), t0_ms / 1e3);
  if (!std::isfinite(r)) throw usage_error("instance-gbps: T0 is longer than a whole hit at that rate");
  std::printf("%.4f\n", r);
  return 0;
}

bool last_line(const std::string& path, std::string& line) {
  std::ifstream in(path);
  std::string l;
  bool any = false;
  while (std::getline(in, l))
    if (!l.empty()) line = l, any = true;
  return any;
}

// The reference's published hit-heavy figures, where its text gives them.
struct ref_row {
  const char* p99;
  const char* note;
};
const std::map<std::string, ref_row> reference = {
    {"recompute", {"-", "cold run: a 16k prompt recomputes in 0.31 s"}},
    {"l1", {"-", "L1 hit slightly faster than recompute"}},
    {"l2_single_sync", {"83.32", "p50 52.30 s (3.52 s at the start)"}},
    {"l2_single_async", {"-", ""}},
    {"l2_partitioned_sync", {"-", "rho ~ 0.09"}},
    {"l2_partitioned_async", {"0.67", "124x below single sync"}},
    {"l2_partitioned_async_policy", {"-", ""}},
};

/// Reads the summary on the last line of a replay's output.
pcp::summary read_summary(const std::string& file) {
  std::string line, err;
  if (!last_line(file, line)) throw usage_error("table: " + file + ": empty or unreadable");
  pcp::summary s;
  if (!pcp::parse_summary(line, s, err)) throw usage_error("table: " + file + ": last line: " + err);
  return s;
}

int run_table(int argc, char** argv) {
  std::vector<std::pair<std::string, pcp::summary>> rows;
  std::vector<std::pair<std::string, std::vector<double>>> repeats;  // NAME -> p99 of each run
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("repeat:", 0) == 0) {  // repeat:NAME=FILE,FILE,...
      const auto eq = a.find('=');
      if (eq == std::string::npos || eq == 7)
        throw usage_error("table: expected repeat:NAME=FILE,FILE,..., got '" + a + "'");
      std::vector<double> p99;
      std::string files = a.substr(eq + 1);
      for (std::size_t at = 0; at <= files.size();) {
        const auto comma = std::min(files.find(',', at), files.size());
        p99.push_back(read_summary(files.substr(at, comma - at)).ttft_p99_s);
        at = comma + 1;
      }
      std::sort(p99.begin(), p99.end());
      repeats.emplace_back(a.substr(7, eq - 7), std::move(p99));
      continue;
    }
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) throw usage_error("table: expected NAME=FILE, got '" + a + "'");
    std::string line, err;
    const std::string file = a.substr(eq + 1);
    if (!last_line(file, line)) throw usage_error("table: " + file + ": empty or unreadable");
    pcp::summary s;
    if (!pcp::parse_summary(line, s, err)) throw usage_error("table: " + file + ": last line: " + err);
    rows.emplace_back(a.substr(0, eq), s);
  }
  pcp::print_table(std::cout, rows);
  std::cout
      << "(hit tok: cached / prompt tokens; after priming with the whole trace it is an input, set by the\n"
         " chunking: mean of floor((n-1)/256)*256/n. compute: modeled compute / makespan, not the GPU\n"
         " utilisation the reference sampled, so it is not shown beside its 7%.)\n";
  char buf[320];
  bool any_ref = false;
  for (const auto& [name, s] : rows) {
    auto it = reference.find(name);
    if (it == reference.end()) continue;
    if (!any_ref) std::cout << "\nreference (hit-heavy subset, 98.5% of prompt tokens from L2):\n";
    any_ref = true;
    std::snprintf(buf, sizeof buf, "  %-28s measured p50 %8.3f p99 %8.3f s   reference p99 %6s s   %s",
                  name.c_str(), s.ttft_p50_s, s.ttft_p99_s, it->second.p99, it->second.note);
    std::cout << buf << "\n";
  }
  auto find = [&](const char* n) -> const pcp::summary* {
    for (const auto& [name, s] : rows)
      if (name == n) return &s;
    return nullptr;
  };
  const auto* pa = find("l2_partitioned_async");
  const auto* pp = find("l2_partitioned_async_policy");
  const auto* rc = find("recompute");
  std::cout << "\nratios:\n";
  for (const auto& [name, s] : rows) {  // l2_single_sync and its sensitivity rows
    if (name.rfind("l2_single_sync", 0) != 0 || !pa || !(pa->ttft_p99_s > 0)) continue;
    const double ratio = s.ttft_p99_s / pa->ttft_p99_s;
    if (name == "l2_single_sync")
      std::snprintf(
          buf, sizeof buf,
          "  p99 %s / l2_partitioned_async = %.1fx (reference 83.32 / 0.67 = 124x; target >= 60x)%s",
          name.c_str(), ratio,
          s.rho >= 1 ? "; rho >= 1 as in the reference: it grows with the trace length" : "");
    else if (s.rho >= 1)
      std::snprintf(
          buf, sizeof buf,
          "  p99 %s / l2_partitioned_async = %.1fx  UNSTABLE (rho = %.2f >= 1: no steady state; the "
          "ratio grows with the trace length; no target)",
          name.c_str(), ratio, s.rho);
    else
      std::snprintf(buf, sizeof buf,
                    "  p99 %s / l2_partitioned_async = %.1fx (rho = %.2f; sensitivity, no target)",
                    name.c_str(), ratio, s.rho);
    std::cout << buf << "\n";
  }
  if (pa && rc && rc->ttft_p99_s > 0) {
    std::snprintf(buf, sizeof buf, "  p99 l2_partitioned_async / recompute = %.3f (target <= 1.3)",
                  pa->ttft_p99_s / rc->ttft_p99_s);
    std::cout << buf << "\n";
  }
  if (pp && rc && rc->ttft_p99_s > 0) {
    std::snprintf(
        buf, sizeof buf,
        "  p99 l2_partitioned_async_policy / recompute = %.3f (target <= 1.05); modeled compute %.1f%% "
        "of the makespan vs recompute %.1f%%",
        pp->ttft_p99_s / rc->ttft_p99_s, 100 * pp->busy_fraction, 100 * rc->busy_fraction);
    std::cout << buf << "\n";
  }
  // The long stream: split against the better of load and recompute, and the model beside it.
  bool long_header = false;
  for (const char* inst : {"1", "8"}) {
    const auto* sp = find((std::string("long_split_") + inst).c_str());
    const auto* ld = find((std::string("long_load_") + inst).c_str());
    const auto* lr = find("long_recompute");
    if (!sp || !ld || !lr) continue;
    if (!long_header) std::cout << "\nlong stream (64k-200k tokens, slow arrivals), p50:\n";
    long_header = true;
    const double better = std::min(ld->ttft_p50_s, lr->ttft_p50_s);
    std::snprintf(
        buf, sizeof buf,
        "  %s instance(s): split %.3f s (model %.3f s) vs load %.3f s (model %.3f s), recompute %.3f s: "
        "split / better = %.3f (target <= %s)",
        inst, sp->ttft_p50_s, sp->predicted_p50_s, ld->ttft_p50_s, ld->predicted_p50_s, lr->ttft_p50_s,
        better > 0 ? sp->ttft_p50_s / better : 0.0, std::string(inst) == "1" ? "0.8" : "0.9");
    std::cout << buf << "\n";
  }
  // Closed-loop saturated throughput.
  for (const char* prefix : {"", "mixed_"}) {
    const auto* tr = find((std::string(prefix) + "throughput_recompute").c_str());
    const auto* ta = find((std::string(prefix) + "throughput_partitioned_async").c_str());
    if (!tr || !ta || !(tr->prompt_tokens_per_s > 0)) continue;
    std::snprintf(
        buf, sizeof buf,
        "%s  saturated throughput (%s stream): partitioned async %.0f vs recompute %.0f prompt tokens/s = "
        "%.2fx%s (reference: the sharded store +14-34%%)",
        *prefix ? "" : "\n", *prefix ? "mixed, about half cached" : "hit-heavy", ta->prompt_tokens_per_s,
        tr->prompt_tokens_per_s, ta->prompt_tokens_per_s / tr->prompt_tokens_per_s,
        *prefix ? "" : " (target >= 1.14)");
    std::cout << buf << "\n";
  }
  if (!repeats.empty())
    std::cout << "\nrepeated runs (p99 min / median / max, target: within +-10% of the median):\n";
  for (const auto& [name, p] : repeats) {
    const double med = p[p.size() / 2];
    std::snprintf(buf, sizeof buf, "  %-28s %zu runs: %.3f / %.3f / %.3f s (spread %+.1f%% / %+.1f%%)",
                  name.c_str(), p.size(), p.front(), med, p.back(),
                  med > 0 ? 100 * (p.front() / med - 1) : 0.0, med > 0 ? 100 * (p.back() / med - 1) : 0.0);
    std::cout << buf << "\n";
  }
  std::string json = "{\"configs\": {";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    if (k) json += ", ";
    pcp::append_json_string(json, rows[k].first);
    json += ": " + pcp::summary_json(rows[k].second);
  }
  json += "}";
  if (!repeats.empty()) {
    json += ", \"repeat\": {";
    for (std::size_t k = 0; k < repeats.size(); ++k) {
      const auto& p = repeats[k].second;
      if (k) json += ", ";
      pcp::append_json_string(json, repeats[k].first);
      json += ": " + pcp::json_object_writer()
                         .field("runs", static_cast<std::uint64_t>(p.size()))
                         .field("p99_min_s", p.front())
                         .field("p99_median_s", p[p.size() / 2])
                         .field("p99_max_s", p.back())
                         .str();
    }
    json += "}";
  }
  std::cout << json << "}" << std::endl;
  return 0;
}

int run_plot(int argc, char** argv) {
  if (argc < 4) throw usage_error("plot: expected OUT.png NAME=REQUESTS_FILE ...");
  std::vector<std::pair<std::string, std::vector<pcp::request_result>>> runs;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) throw usage_error("plot: expected NAME=FILE, got '" + a + "'");
    std::vector<pcp::request_result> reqs;
    std::string err;
    if (!pcp::read_requests(a.substr(eq + 1), reqs, err)) throw usage_error("plot: " + err);
    runs.emplace_back(a.substr(0, eq), std::move(reqs));
  }
  std::string err;
  if (!pcp::plot_runs(argv[2], runs, err)) {
    std::cerr << "pcp_prefill: " << err << "\n";
    return 1;
  }
  std::cout << "plot: " << argv[2] << "\n";
  return 0;
}

#if defined(PCP_HAVE_MPI)
/// --mpi: this process is one rank of the mpiexec job. Option errors (the same on every rank)
/// are printed once and end every rank cleanly; any later failure ends the job (MPI_Abort).
int main_mpi(int argc, char** argv) {
  int provided = 0, rank = 0, size = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);  // kvtier never calls MPI_Init
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 0;
  try {
    options o;
    try {
      o = parse_replay(argc, argv, static_cast<std::uint32_t>(size));
    } catch (const usage_error& e) {
      if (rank == 0) std::cerr << "pcp_prefill: " << e.what() << "\n";
      MPI_Finalize();
      return 2;
    }
    process_ranks w;
    if (auto ec = kvtier::comm::mpi_communicator::create(w.comm, MPI_COMM_WORLD,
                                                         kvtier::deadline_after(std::chrono::seconds(60))))
      throw std::runtime_error(w.comm.last_error());
    rc = run_replay(w, o);
  } catch (const std::exception& e) {
    std::cerr << "pcp_prefill: rank " << rank << ": " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "gen-trace") return run_gen_trace(argc, argv);
    if (cmd == "table") return run_table(argc, argv);
    if (cmd == "fit-t0") return run_fit_t0(argc, argv);
    if (cmd == "instance-gbps") return run_instance_gbps(argc, argv);
    if (cmd == "plot") return run_plot(argc, argv);
#if defined(PCP_HAVE_MPI)
    bool mpi = false, help = false;  // --help prints and exits before MPI is initialised
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      mpi = mpi || a == "--mpi";
      help = help || a == "--help" || a == "-h";
    }
    if (mpi && !help) return main_mpi(argc, argv);
#endif
    const options o = parse_replay(argc, argv);  // --mpi without MPI: a usage error
    thread_ranks w;
    return run_replay(w, o);
  } catch (const usage_error& e) {
    std::cerr << "pcp_prefill: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "pcp_prefill: " << e.what() << "\n";
    return 1;
  }
}
