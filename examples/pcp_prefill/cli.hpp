// examples/pcp_prefill/cli.hpp: pcp_prefill's command line: the usage text, the
// replay's options and their checks (every bad value is a usage error naming the
// flag, what it expected and what it got), and the L2 password put into the URL.
//
//   pcp::cli::options o = pcp::cli::parse_replay(argc, argv);   // throws usage_error
//   std::string url = pcp::cli::with_password(o);               // --l2 with its password
#pragma once

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "engine_types.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/url.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

namespace pcp::cli {

inline const char* const usage = R"(usage:
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
  --load-granularity chunk|layer|layer-streamed   when a loaded request's compute starts (chunk):
                              chunk: after its whole load; layer: layer l once layer group l of every
                              loaded chunk is in the pages (whole-chunk fetches, as remote_store does:
                              the moves overlap compute); layer-streamed: the same with group-major
                              ranged reads (the fetch overlaps too; modeled on --l2 embedded, run for
                              real on a resp:// L2 with one server per rank). Layer modes
                              need --mode async; with the flag the report adds TTFT beside the model
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
  --fetch-workers N (8)       fetch threads of each rank's connector
  --estimator-prior optimistic|model   the load estimator's starting (T0, B): optimistic (0 ms, 1000 GB/s;
                              the first hits teach it) or model (the modeled tier's T0 and B, as a probe
                              of the tier would report them); refined online by every load either way
  --cost-slack-ms X           --policy cost: also load when predicted at most X ms slower than recompute (0)
  --l2-fault-every N          cut every N-th L2 load short (fault injection; 0 = never)
)";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline double parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE || !(x >= lo && x <= hi))
    throw usage_error(flag + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got '" + v + "'");
  return x;
}
inline std::uint64_t parse_uint(const std::string& flag, const std::string& v, std::uint64_t lo,
                                std::uint64_t hi) {
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
  bool granularity_set = false;  ///< --load-granularity given: the report prints TTFT beside the model
  std::size_t prime_first = 0;
  std::uint64_t fault_every = 0;
  kvtier::resp::tls_options tls;  ///< for TLS L2 endpoints (--l2-tls-*)
};

/// A generated stream's --requests, --seed or --rate into `o`; false if `a` is none of them.
template <class Value>
bool stream_flag(options& o, const std::string& a, Value&& val) {
  if (a == "--requests")
    o.spec.requests = parse_uint(a, val(), 1, 1'000'000), o.requests_set = true;
  else if (a == "--seed")
    o.spec.seed = parse_uint(a, val(), 0, 1ull << 62), o.seed_set = true;
  else if (a == "--rate")
    o.spec.rate_per_s = parse_double(a, val(), 1e-6, 1e6), o.rate_set = true;
  else
    return false;
  return true;
}

/// The generated stream of kind `kind` (hit-heavy, cold, mixed, long).
inline pcp::trace_spec generated_spec(const std::string& kind, const options& o) {
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
inline options parse_replay(int argc, char** argv, std::uint32_t mpi_world = 0) {
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
    else if (stream_flag(o, a, val))
      continue;
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
    } else if (a == "--load-granularity") {
      using enum pcp::load_granularity;
      o.eng.granularity = parse_choice<pcp::load_granularity>(
          a, val(), {{"chunk", chunk}, {"layer", layer}, {"layer-streamed", layer_streamed}});
      o.granularity_set = true;
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
    else
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
  if (o.eng.granularity != pcp::load_granularity::chunk && o.eng.mode != pcp::load_mode::async)
    throw usage_error(std::string("--load-granularity ") + pcp::to_string(o.eng.granularity) +
                      " needs --mode async, got --mode " + pcp::to_string(o.eng.mode));
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

/// `url` with the password from --l2-password-env / --l2-password-file put in.
inline std::string with_password(const options& o) {
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

}  // namespace pcp::cli
