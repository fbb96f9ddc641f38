// tools/soak/soak_engine.cpp: the engine the soak and the failure-mode table run: the README's
// request loop (kvtier::connector over one MPI communicator, each rank's own redis-server behind
// remote_store, a host paged KV cache in the vLLM MLA layout) replaying a stream with shared
// prefixes for a given time. "The model" is a reference computation: the KV row of position p is
// a function of the tokens [0, p], so two prompts that share a prefix share its rows, and every
// loaded row is checked against it byte for byte. A computed token costs 1/R seconds of sleep (a
// GPU's time, not this machine's CPU). One JSON line per request and rank on stdout; soak.py
// drives it (servers, faults, sampling, report).
//
//   mpiexec -n 2 soak_engine --ports 6400,6401 --duration-s 60 --mode tier --loop finished
//   (--loop readme: block on each request's saves; lookahead: finished, and the next request's
//    lookup begun before this one computes)
//   {"rank":0,"i":17,"t":1.532,"n":488,"hit":384,"loaded":384,"wrong":0,"digest":"9f..","ms":14.2,
//    "phases_ms":[lookup, load, compute and check, save and free],...}
#include <malloc.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/comm/mpi.hpp"
#include "kvtier/comm/recover.hpp"
#include "kvtier/kvtier.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/store/remote_store.hpp"

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

struct options {
  std::vector<int> ports;
  std::string host = "127.0.0.1";
  bool tier = true;                ///< --mode tier|recompute
  bool free_from_finished = true;  ///< --loop finished|readme (readme: block on the saves)
  bool lookahead = false;          ///< --loop lookahead: finished, and the next lookup overlaps this compute
  double duration_s = 60, tokens_per_s = 20000, hang_s = 20;
  std::size_t prefixes = 16, prefix_chunks = 6, suffix_chunks = 2, chunk_tokens = 64;
  std::uint64_t seed = 1;
  // save_ms: saves run one at a time, so against a server gone silent the saves queued behind the one
  // in flight hold their pages for up to save_ms: ~30 requests/s x 0.5 s fit the 1,536 pages (~45
  // requests); 2 s would not (a rank then waits ~0.6 s for pages at every silent fault).
  int lookup_ms = 100, load_ms = 1000, save_ms = 500, step_ms = 1000;
  std::size_t leak_bytes = 0;  ///< --leak-kb-per-request: a planted leak (the soak must catch it)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "soak_engine: %s\nusage: mpiexec -n W soak_engine --ports P0,P1,... [--duration-s S] "
               "[--mode tier|recompute] [--loop finished|readme|lookahead] [--tokens-per-s R] [--seed N] "
               "[--prefixes K] [--lookup-ms T] [--load-ms T] [--save-ms T] [--step-ms T] [--hang-s S] "
               "[--leak-kb-per-request K]\n",
               why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + ": missing value");
    const std::string v = argv[++i];
    const auto num = [&] {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(x >= 0)) usage(a + ": expected a number >= 0, got '" + v + "'");
      return x;
    };
    if (a == "--ports") {
      for (std::size_t from = 0; from <= v.size();) {
        const auto comma = v.find(',', from);
        o.ports.push_back(std::atoi(v.substr(from, comma - from).c_str()));
        if (comma == std::string::npos) break;
        from = comma + 1;
      }
    } else if (a == "--mode")
      o.tier = v == "tier" ? true : v == "recompute" ? false : (usage("--mode: tier or recompute"), true);
    else if (a == "--loop") {
      if (v != "finished" && v != "readme" && v != "lookahead")
        usage("--loop: finished, readme or lookahead");
      o.free_from_finished = v != "readme", o.lookahead = v == "lookahead";
    } else if (a == "--duration-s")
      o.duration_s = num();
    else if (a == "--tokens-per-s")
      o.tokens_per_s = std::max(1.0, num());
    else if (a == "--hang-s")
      o.hang_s = num();
    else if (a == "--seed")
      o.seed = static_cast<std::uint64_t>(num());
    else if (a == "--prefixes")
      o.prefixes = std::max<std::size_t>(1, static_cast<std::size_t>(num()));
    else if (a == "--lookup-ms")
      o.lookup_ms = static_cast<int>(num());
    else if (a == "--load-ms")
      o.load_ms = static_cast<int>(num());
    else if (a == "--save-ms")
      o.save_ms = static_cast<int>(num());
    else if (a == "--step-ms")
      o.step_ms = static_cast<int>(num());
    else if (a == "--leak-kb-per-request")
      o.leak_bytes = static_cast<std::size_t>(num() * 1024);
    else
      usage("unknown option " + a);
  }
  return o;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Request i of the stream: one of K shared prefixes (a skewed pick: low k more often, so some
// prefixes stay hot under LRU and others are evicted), then unique chunks and a tail.
std::vector<kvtier::token_id> prompt_of(const options& o, std::uint64_t i) {
  const std::uint64_t r = mix(o.seed * 1000003 + i);
  const std::uint64_t k = (r % o.prefixes) * ((r >> 20) % o.prefixes) / o.prefixes;  // skewed to 0
  const std::size_t tail = 8 + (r >> 40) % (o.chunk_tokens - 8);
  std::vector<kvtier::token_id> t;
  for (std::size_t p = 0; p < o.prefix_chunks * o.chunk_tokens; ++p)
    t.push_back(static_cast<kvtier::token_id>(mix(k * 7919 + p) % 151552));
  for (std::size_t p = 0; p < o.suffix_chunks * o.chunk_tokens + tail; ++p)
    t.push_back(static_cast<kvtier::token_id>(mix(r + p) % 151552));
  return t;
}

// The reference model: row p = bytes from a hash of the tokens [0, p].
struct reference {
  std::size_t row_bytes;
  std::vector<std::uint64_t> prefix_hash;
  void start(std::span<const kvtier::token_id> t) {
    prefix_hash.resize(t.size());
    std::uint64_t h = 0x5eed;
    for (std::size_t p = 0; p < t.size(); ++p) prefix_hash[p] = h = mix(h ^ t[p]);
  }
  void row(std::size_t p, std::span<std::byte> out) const {
    std::uint64_t s = prefix_hash[p];
    for (std::size_t i = 0; i < out.size(); i += 8) {
      s = mix(s);
      std::memcpy(out.data() + i, &s, std::min<std::size_t>(8, out.size() - i));
    }
  }
};

double now_s(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// What glibc's malloc holds, so the soak can tell a leak (bytes in use grow) from the allocator
// keeping freed memory (in use flat, the heap's free bytes grow): one JSON line.
void print_heap(unsigned rank, double t) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  const struct mallinfo2 m = mallinfo2();
  std::printf(
      "{\"rank\":%u,\"event\":\"heap\",\"t\":%.3f,\"in_use_kb\":%zu,\"free_kb\":%zu,\"heap_kb\":%zu,"
      "\"mmap_kb\":%zu,\"top_kb\":%zu}\n",
      rank, t, (m.uordblks + m.hblkhd) >> 10, m.fordblks >> 10, m.arena >> 10, m.hblkhd >> 10,
      m.keepcost >> 10);
  std::fflush(stdout);
#else
  (void)rank, (void)t;
#endif
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

int run(const options& o) {
  int r_int = 0, w_int = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r_int);
  MPI_Comm_size(MPI_COMM_WORLD, &w_int);
  const auto rank = static_cast<kvtier::rank_t>(r_int), W = static_cast<kvtier::rank_t>(w_int);
  if (o.tier && o.ports.size() != W) usage("--ports: one port per rank");
  constexpr std::uint32_t page = 16, layers = 2, cache_blocks = 1536;
  const std::size_t T = o.chunk_tokens;
  const kvtier::modulo_ownership own(W);
  const kvtier::chunker<> chunk({.model = "soak-model",
                                 .kv_format = "mla-bf16",
                                 .chunk_tokens = static_cast<std::uint32_t>(T),
                                 .ownership = own.geometry()});
  const auto make = [](kvtier::comm::mpi_communicator& c, kvtier::deadline dl) {
    return kvtier::comm::mpi_communicator::create(c, MPI_COMM_WORLD, dl,
                                                  {.thread_level = MPI_THREAD_MULTIPLE});
  };
  kvtier::comm::mpi_communicator comm;
  if (make(comm, kvtier::deadline_after(60s))) {
    std::fprintf(stderr, "soak_engine: %s\n", comm.last_error().c_str());
    return 2;
  }
  kvtier::remote_store<kvtier::resp::asio_connection> store(
      chunk.ns(), kvtier::resp::connection_options{
                      .server = kvtier::resp::parse_url("resp://" + o.host + ":" +
                                                        std::to_string(o.tier ? o.ports[rank] : 1))
                                    .value});
  kvtier::host_kv_cache cache(kvtier::kv_layout::vllm_mla(layers, cache_blocks, page));
  // The cost policy with this engine's own figures (KV bytes per token, prefill tokens/s): a
  // tier slower than recomputing is not loaded from (connector/detail/slow_tier.hpp).
  const kvtier::connector_options copt{
      .policy = kvtier::load_policy::cost,
      .node = {.kv_bytes_per_token = static_cast<double>(cache.value_bytes(1)),
               .prefill_tokens_per_s = o.tokens_per_s},
      .load_deadline = {.base = std::chrono::milliseconds(o.load_ms)},
      .lookup_timeout = std::chrono::milliseconds(o.lookup_ms),
      .save_timeout = std::chrono::milliseconds(o.save_ms)};
  kvtier::connector conn(chunk, own, store, comm, cache.view(), copt);
  const std::size_t row_bytes = cache.value_bytes(1);
  reference ref{row_bytes, {}};
  std::vector<std::byte> want(row_bytes, std::byte{1}), got(row_bytes);
  {  // Touch every page once, as an engine's preallocated KV cache is: resident memory is then
     // flat whatever the number of pages that saves hold (the soak checks it for leaks).
    kvtier::host_kv_cache::sequence all;
    cache.reserve(all, std::uint64_t{cache_blocks} * page);
    for (std::size_t p = 0; p < std::size_t{cache_blocks} * page; ++p) cache.scatter(all, p, 1, want);
    cache.release(all);
  }

  struct pending {
    kvtier::request_id id;
    kvtier::host_kv_cache::sequence seq;
  };
  std::deque<pending> in_flight;               // finished, pages still read by saves
  std::vector<std::vector<std::byte>> leaked;  // --leak-kb-per-request: kept (and touched) for good
  const auto free_finished = [&] {
    const auto f = conn.finished();
    conn.drain_events();  // a router would take them; left alone they pile up
    for (const auto id : f.saves)
      for (auto it = in_flight.begin(); it != in_flight.end(); ++it)
        if (it->id == id) {
          cache.release(it->seq);
          in_flight.erase(it);
          break;
        }
    return f;
  };

  std::printf("{\"rank\":%u,\"event\":\"start\",\"pid\":%d}\n", rank,
              static_cast<int>(getpid()));  // for the sampler
  std::fflush(stdout);
  const auto t0 = clk::now();
  std::uint64_t hangs = 0, recoveries = 0, requests = 0, wrong_total = 0;
  double recover_s = 0;
  bool poisoned = false;
  double heap_at = 0;  // when the last heap line was printed
  for (std::uint64_t i = 0;; ++i) {
    if (now_s(t0) >= heap_at + 2) print_heap(rank, heap_at = now_s(t0));
    if (poisoned || comm.poisoned()) {  // every rank gets here within one request (recover.hpp)
      const auto t = clk::now();
      const auto rec = kvtier::comm::recover(comm, make, i, 1s, kvtier::deadline_after(60s));
      const double took = std::chrono::duration<double>(clk::now() - t).count();
      recover_s += took, ++recoveries;
      std::printf("{\"rank\":%u,\"event\":\"recover\",\"t\":%.3f,\"took_s\":%.3f,\"ok\":%s,\"next\":%llu}\n",
                  rank, now_s(t0), took, rec.ec ? "false" : "true",
                  static_cast<unsigned long long>(rec.request));
      std::fflush(stdout);
      if (rec.ec) {
        std::fprintf(stderr, "soak_engine rank %u: %s\n", rank, rec.message.c_str());
        return 3;
      }
      i = rec.request, poisoned = false;
    }
    const auto tokens = prompt_of(o, i);
    const std::size_t n = tokens.size();
    const auto id = static_cast<kvtier::request_id>(i + 1);
    // Go on while every rank's clock says so (one agreed word: every rank stops at the same
    // request). With the tier the word rides in the connector's step, after this request's lookup
    // began (with lookahead, during the last request): one all-reduce per step, as an engine's.
    std::uint64_t go = now_s(t0) < o.duration_s ? 1 : 0;
    const auto step_dl = [&] { return kvtier::deadline_after(std::chrono::milliseconds(o.step_ms)); };
    if (o.tier) {
      (void)conn.begin_lookup(id, tokens);  // errc::invalid_argument: begun already (lookahead)
      std::uint64_t word = go + 1;          // the min over ranks: 2 go on, 1 stop, 0 a failed step
      if (conn.step(step_dl(), {&word, 1}) && comm.poisoned()) {
        poisoned = true;
        --i;
        continue;
      }
      if (word == 0) {
        std::fprintf(stderr, "soak_engine rank %u: step failed: %s\n", rank, conn.last_step_error().c_str());
        return 6;
      }
      go = word == 2;
    } else if (kvtier::comm::all_reduce_value(comm, go, kvtier::comm::reduce_op::min, step_dl())) {
      poisoned = true;
      --i;
      continue;
    }
    if (!go) break;
    const auto t_req = clk::now();
    ref.start(tokens);
    std::string why;
    bool hung = false;
    const auto step_until = [&](auto agreed) {
      while (!agreed()) {
        if (now_s(t_req) > o.hang_s) return hung = true, void();
        if (conn.step(kvtier::deadline_after(std::chrono::milliseconds(o.step_ms))) && comm.poisoned()) {
          if (why.empty()) why = conn.last_step_error();
          return poisoned = true, void();
        }
      }
    };
    kvtier::host_kv_cache::sequence seq;
    while (!cache.reserve(seq, n)) {  // out of pages: wait for saves to end (bounded)
      free_finished();
      if (now_s(t_req) > o.hang_s) {
        std::fprintf(stderr, "soak_engine rank %u: no free pages for %.0f s\n", rank, o.hang_s);
        return 4;
      }
      std::this_thread::sleep_for(1ms);
    }
    const auto slots = kvtier::slots_from_block_table({seq.blocks, 0, n}, page);
    std::uint64_t hit = 0, loaded = 0, wrong = 0;
    double lookup_ms = 0, load_ms = 0, compute_ms = 0, free_ms = 0;  // where the request's time went
    auto lap = [last = clk::now()](double& into) mutable {
      const auto t = clk::now();
      into += std::chrono::duration<double, std::milli>(t - last).count(), last = t;
    };
    lap(free_ms);  // waiting for pages counts as freeing
    if (o.tier) {
      step_until([&] { return conn.lookup(id).has_value(); });
      lap(lookup_ms);
      if (const auto plan = conn.lookup(id); plan && !poisoned && !hung) {
        hit = plan->cached_tokens;
        if (plan->tokens_to_load() > 0) {
          conn.load(id, slots);
          step_until([&] { return conn.load_result(id).has_value(); });
          if (const auto out = conn.load_result(id)) loaded = out->loaded_end_token;
        }
      }
      lap(load_ms);
      for (const auto& e : conn.errors(id))
        if (why.empty()) why = e.message;
      // Lookahead: the next request's owners ask their stores while this one computes (as vLLM's
      // scheduler looks up waiting requests while the running batch computes); its step then
      // finds every answer ready. Every rank begins it at the same point.
      if (o.lookahead && !poisoned && !hung) conn.begin_lookup(id + 1, prompt_of(o, i + 1));
    }
    for (std::size_t p = 0; p < loaded; ++p) {  // every loaded byte against the reference
      ref.row(p, want);
      cache.gather(seq, p, 1, got);
      for (std::size_t b = 0; b < row_bytes; ++b) wrong += want[b] != got[b];
    }
    for (std::size_t p = loaded; p < n; ++p) ref.row(p, want), cache.scatter(seq, p, 1, want);
    std::this_thread::sleep_for(
        std::chrono::duration<double>(static_cast<double>(n - loaded) / o.tokens_per_s));
    std::uint64_t digest = 0;  // the pages of the whole prompt: equal on every rank
    for (std::size_t p = 0; p < n; ++p) {
      cache.gather(seq, p, 1, got);
      std::uint64_t w = 0;
      for (std::size_t b = 0; b + 8 <= row_bytes; b += 64)
        std::memcpy(&w, got.data() + b, 8), digest = mix(digest ^ w);
    }
    lap(compute_ms);
    if (o.tier) {
      conn.save(id, slots, loaded, n);
      if (conn.finish(id).free_pages_now) {
        cache.release(seq);
      } else if (o.free_from_finished) {
        in_flight.push_back({id, std::move(seq)});
      } else {  // the README's loop before issue 27: wait for the saves, then free
        while (!hung) {
          bool done = false;
          for (auto x : free_finished().saves) done |= x == id;
          if (done) break;
          if (now_s(t_req) > o.hang_s) hung = true;
          std::this_thread::yield();
        }
        cache.release(seq);
      }
      free_finished();
    } else {
      cache.release(seq);
    }
    lap(free_ms);
    hangs += hung, ++requests, wrong_total += wrong;
    if (o.leak_bytes) leaked.emplace_back(o.leak_bytes, std::byte{1});
    std::printf(
        "{\"rank\":%u,\"i\":%llu,\"t\":%.4f,\"n\":%zu,\"hit\":%llu,\"loaded\":%llu,\"wrong\":%llu,"
        "\"digest\":\"%016llx\",\"ms\":%.2f,\"phases_ms\":[%.1f,%.1f,%.1f,%.1f],\"hung\":%s,\"poisoned\":%s,"
        "\"in_flight\":%zu,\"why\":\"%s\"}\n",
        rank, static_cast<unsigned long long>(i), now_s(t0), n, static_cast<unsigned long long>(hit),
        static_cast<unsigned long long>(loaded), static_cast<unsigned long long>(wrong),
        static_cast<unsigned long long>(digest), now_s(t_req) * 1e3, lookup_ms, load_ms, compute_ms, free_ms,
        hung ? "true" : "false", poisoned ? "true" : "false", in_flight.size(), json_escape(why).c_str());
    std::fflush(stdout);
  }
  // Drain: the last saves end by their own deadline.
  const auto drain_end = clk::now() + std::chrono::milliseconds(o.save_ms) * 4;
  while (!in_flight.empty() && clk::now() < drain_end) free_finished(), std::this_thread::sleep_for(1ms);
  const auto& c = conn.counters();
  const auto s = store.stats();
  std::printf(
      "{\"rank\":%u,\"event\":\"end\",\"t\":%.3f,\"requests\":%llu,\"wrong\":%llu,\"hangs\":%llu,"
      "\"recoveries\":%llu,\"recover_s\":%.3f,\"lookups\":%llu,\"loads\":%llu,\"loads_cut_short\":%llu,"
      "\"tokens_loaded\":%llu,\"agreement_failures\":%llu,\"chunks_saved\":%llu,\"save_failures\":%llu,"
      "\"store_hits\":%llu,\"store_misses\":%llu,\"store_corrupt\":%llu,\"store_timeouts\":%llu,"
      "\"store_errors\":%llu,\"breaker_trips\":%llu,\"down_refusals\":%llu,\"lookups_skipped\":%llu,"
      "\"saves_skipped\":%llu,\"pages_still_in_flight\":%zu,\"last_error\":\"%s\"}\n",
      rank, now_s(t0), (unsigned long long)requests, (unsigned long long)wrong_total,
      (unsigned long long)hangs, (unsigned long long)recoveries, recover_s,
      (unsigned long long)c.lookups.value(), (unsigned long long)c.loads.value(),
      (unsigned long long)c.loads_cut_short.value(), (unsigned long long)c.tokens_loaded.value(),
      (unsigned long long)c.agreement_failures.value(), (unsigned long long)c.chunks_saved.value(),
      (unsigned long long)c.save_failures.value(), (unsigned long long)s.hits, (unsigned long long)s.misses,
      (unsigned long long)s.corrupt, (unsigned long long)s.timeouts, (unsigned long long)s.errors,
      (unsigned long long)s.breaker_trips, (unsigned long long)s.down_refusals,
      (unsigned long long)c.lookups_skipped.value(), (unsigned long long)c.saves_skipped.value(),
      in_flight.size(), json_escape(store.last_error()).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 2;
  int rc = 0;
  try {
    rc = run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak_engine: %s\n", e.what());
    rc = 5;
  }
  // A rank that failed ends the job: its peers would wait on it.
  if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
  MPI_Finalize();
  return rc;
}
