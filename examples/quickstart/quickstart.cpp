// examples/quickstart/quickstart.cpp: the whole kvtier flow for one prompt, in one file.
//
// W ranks run as threads over the in-process communicator. Engine A prefills a
// prompt and each rank stores the chunks it owns; engine B (same W, same shared
// L2) then receives the same prompt. On every rank, one kvtier::connector runs the
// request's lifecycle (see serve()):
//
//   begin_lookup (the owners ask their stores) -> step() until the lookup is agreed
//   (the min over ranks: the cached prefix) -> load into the pages (owners fetch; each
//   step agrees on the prefix fetched so far and moves the newly agreed chunks owner ->
//   every rank, layer group by layer group, into the pages) -> step() until the load's
//   outcome is agreed -> verify every loaded byte in the pages -> "compute" the rest
//   -> save (each owner writes its computed chunks, off the step) -> wait_for_save -> this
//   rank's own reasons, if any (errors: a failed lookup, load or save, in words) -> finish.
//
// Every step() is one all-reduce on every rank, and the step loops stop on agreed
// conditions, so the ranks' collectives stay symmetric. Deadlines: the lookup and the
// load have their own (connector_options), well before the request's deadline that
// bounds every step. One key namespace (quickstart_ns) names the chunks and the
// servers' keys.
//
// The KV lives where an engine keeps it: a paged cache in the vLLM MLA layout (576 bf16 values
// per token and layer; 2 layers here instead of a real model's 61, to fit memory), pages of 64
// tokens, in host memory (kvtier::host_kv_cache). The connector gathers a chunk's value out of
// the pages before it is stored and scatters it into the pages after it is loaded, through its
// own staging; every loaded chunk is verified in the paged layout, entry by entry.
// Against servers (each rank's own, with or without --mpi), values use format 2 with one
// checksum per layer, and the connector moves one layer per group.
//
//   quickstart                                     # L2 = one in-process store per rank
//   quickstart resp://127.0.0.1:{rank+6400}        # L2 = one redis-server/valkey per rank
//   mpiexec -n 4 quickstart --mpi [resp://...]     # ranks as processes (MPI host communicator)
//
// With --mpi every rank is a process: engines A and B are two communicators over
// MPI_COMM_WORLD, each rank keeps its L2 (in-process, or its own server) between them,
// and rank 0 prints the same summary, with wrong bytes summed over all ranks.
//
// The last lines are the Prometheus text of engine B's rank-0 fetch queue, tiers and
// connector counters.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kvtier.hpp"
#ifdef KVTIER_QUICKSTART_ASIO
#include "kvtier/resp/asio_connection.hpp"
#endif
#ifdef KVTIER_QUICKSTART_MPI
#include "kvtier/comm/mpi.hpp"
#endif

using namespace std::chrono_literals;

namespace {

constexpr kvtier::rank_t W = 4;
constexpr std::size_t chunk_tokens = 256, prompt_tokens = 40 * 256 + 100;
constexpr std::uint32_t model_layers = 2, page_tokens = 64;

/// The engine's KV layout: vLLM MLA, per layer (num_blocks, 64, 576) bf16, enough pages for the prompt.
kvtier::kv_layout model_layout() {
  return kvtier::kv_layout::vllm_mla(model_layers, prompt_tokens / page_tokens + 1, page_tokens);
}
const std::size_t chunk_bytes = model_layout().bytes_per_token() * chunk_tokens;  // 589,824 bytes
constexpr const char* kv_format = "vllm_mla-bf16-2l";

/// The one key namespace of this deployment: the chunker's keys and the servers' key names come
/// from it, so the two can never disagree (one store per rank is built from the same value).
kvtier::key_namespace quickstart_ns(kvtier::rank_t world) {
  return {.model = "quickstart-model",
          .kv_format = kv_format,
          .chunk_tokens = chunk_tokens,
          .ownership = kvtier::modulo_ownership(world).geometry()};
}

/// What "the model" writes for chunk c of this prompt: a pure function of its tokens,
/// so a loaded chunk can be checked byte for byte against a recomputed one.
void compute_chunk(std::span<const kvtier::token_id> tokens, std::size_t c, std::span<std::byte> out) {
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (c + 1);
  for (std::size_t t = c * chunk_tokens; t < (c + 1) * chunk_tokens; ++t)
    x = (x ^ tokens[t]) * 0x100000001B3ull;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((x >> (8 * (i % 8))) + i);
}

/// Wrong bytes of chunk c in the paged cache against its expected value, read entry by entry
/// straight from the layout (not through kv_gather, so the check does not trust the copy).
std::size_t wrong_paged_bytes(const kvtier::host_kv_cache& cache, const kvtier::host_kv_cache::sequence& seq,
                              std::size_t c, std::span<const std::byte> expect) {
  const kvtier::kv_layout& lay = cache.layout();
  const std::size_t row = std::size_t{lay.heads} * lay.head_bytes;
  std::size_t bad = 0;
  for (std::uint32_t l = 0; l < lay.num_layers; ++l)
    for (std::uint32_t p = 0; p < lay.planes; ++p)
      for (std::size_t i = 0; i < chunk_tokens; ++i) {
        const std::size_t pos = c * chunk_tokens + i;
        const std::byte* entry = cache.view().plane(l, p) +
                                 seq.blocks[pos / lay.block_size] * lay.block_stride +
                                 (pos % lay.block_size) * lay.token_stride;
        const std::byte* want = expect.data() + ((std::size_t{l} * lay.planes + p) * chunk_tokens + i) * row;
        for (std::size_t b = 0; b < row; ++b) bad += entry[b] != want[b];
      }
  return bad;
}

struct outcome {
  std::uint64_t cached = 0, loaded = 0, steps = 0;
  std::size_t bad_bytes = 0;
  std::string error, metrics;
};

/// One engine's handling of the prompt on rank r, over that rank's L2, through one
/// kvtier::connector per rank: lookup, agreement, load into the pages, save. The engine keeps
/// only its own part: the pages, "the model", and the check of every loaded byte.
template <kvtier::comm::communicator Comm, kvtier::chunk_store L2>
outcome serve(Comm& comm, L2& l2, std::span<const kvtier::token_id> tokens) {
  const kvtier::rank_t r = comm.rank();
  const kvtier::chunker<> chunk(quickstart_ns(comm.size()));
  const std::size_t n_chunks = tokens.size() / chunk_tokens;  // the keyed (full) chunks
  outcome out;
  if constexpr (requires { l2.ns(); })  // a remote L2 names its keys by its own namespace
    if (l2.ns().text() != chunk.ns().text()) {
      out.error =
          "the L2's key namespace (" + l2.ns().text() + ") is not the chunker's (" + chunk.ns().text() + ")";
      return out;
    }
  // One deadline for the request's agreements, taken when it starts, on every rank. This rank's
  // own I/O ends well before it (the lookup 2 s after begin_lookup, the load 3 s after load()),
  // so a rank whose server is stuck still reaches the agreement in time: its failed I/O only
  // shrinks what is agreed, instead of making every rank lose the prefix.
  const kvtier::deadline request_dl = kvtier::deadline_after(10s);

  kvtier::memory_store l1(64u << 20);
  kvtier::metrics m;
  kvtier::tiered_store tiers(l1, l2, {.metrics = &m});
  // Every rank ends with the whole prompt's KV in its paged cache (as after PCP's all-gather).
  kvtier::host_kv_cache cache(model_layout());
  kvtier::host_kv_cache::sequence seq;
  if (!cache.reserve(seq, tokens.size())) {
    out.error = "paged cache: out of blocks";
    return out;
  }
  const std::vector<std::int64_t> slots =
      kvtier::slots_from_block_table({seq.blocks, 0, tokens.size()}, page_tokens);
  // Rank r looks up, loads and saves the chunks it owns (c mod W); one key per store call, so a
  // load's agreed prefix advances chunk by chunk while the rest still lands; one layer per group,
  // as the servers' format-2 values have one checksum per layer.
  kvtier::connector conn(chunk, kvtier::modulo_ownership(comm.size()), tiers, comm, cache.view(),
                         {.load_deadline = {.base = 3s, .per_thousand_tokens = 0ms, .cap = 3s},
                          .lookup_timeout = 2s,
                          .save_timeout = 5s,
                          .layers_per_group = 1,
                          .fetch_workers = 1,
                          .fetch_batch_chunks = 1,
                          .metrics = &m});
  // An engine calls step() once per engine step on every rank; here, until an agreed condition
  // holds (so every rank takes the same steps), a moment apart, as an engine's steps are.
  const auto step_until = [&](auto agreed) {
    for (int s = 0; s < 100000 && !agreed(); ++s) {  // bounded (and each step by request_dl)
      if (auto ec = conn.step(request_dl))
        out.error = "step: " + ec.message();  // what it was agreeing on ends short, on every rank
      ++out.steps;
      if (!agreed()) std::this_thread::sleep_for(1ms);
    }
  };
  const kvtier::request_id id = 1;

  // 1. Lookup: the owners ask their stores; the first step that has every rank's answer agrees
  //    on the min over ranks (the longest cached prefix). A failed lookup only shrinks it.
  conn.begin_lookup(id, tokens);
  step_until([&] { return conn.lookup(id).has_value(); });
  if (!conn.lookup(id)) {
    out.error = "lookup: not agreed";
    return out;
  }
  out.cached = conn.lookup(id)->cached_tokens;

  // 2. Load: the owners fetch their chunks below it; each step agrees on the prefix fetched so
  //    far and moves the newly agreed chunks owner -> every rank, into the pages, layer group by
  //    layer group. A failure anywhere only shortens the agreed prefix, on every rank.
  if (conn.lookup(id)->tokens_to_load() > 0) {
    if (auto ec = conn.load(id, slots)) out.error = "load: " + ec.message();  // this rank loads nothing
    step_until([&] { return conn.load_result(id).has_value(); });
    if (auto o = conn.load_result(id)) out.loaded = o->loaded_end_token;
  }
  // Every loaded chunk, checked in the paged layout against what compute would give.
  std::vector<std::byte> expect(chunk_bytes);
  for (std::size_t c = 0; c < out.loaded / chunk_tokens; ++c) {
    compute_chunk(tokens, c, expect);
    out.bad_bytes += wrong_paged_bytes(cache, seq, c, expect);
  }

  // 3. The rest is "computed" into the pages (the model writes its KV there).
  for (std::size_t c = out.loaded / chunk_tokens; c < n_chunks; ++c) {
    compute_chunk(tokens, c, expect);
    if (auto ec = cache.scatter(seq, c * chunk_tokens, chunk_tokens, expect))
      out.error = "paged copy: " + ec.message();
  }

  // 4. Save: each owner writes the computed chunks it owns (the loaded ones are there already),
  //    gathered from the pages off this thread; the pages stay until its saves ended.
  std::size_t to_save = 0;
  for (std::size_t c = out.loaded / chunk_tokens; c < n_chunks; ++c) to_save += c % comm.size() == r;
  if (auto ec = conn.save(id, slots, out.loaded, n_chunks * chunk_tokens))
    out.error = "save: " + ec.message();
  // This rank's last request: no step follows, so waiting here costs no peer. Between requests an
  // engine never waits: it frees the pages from its step loop once finished() lists the request
  // (README.md's loop), so a slow or silent server never makes a peer miss its step.
  if (auto ec = conn.wait_for_save(id, kvtier::deadline_after(10s)))  // the save's own 5 s, and slack
    out.error = "save: " + ec.message();
  // This rank's own reasons, if any: why its lookup, its part of the load or its save fell short
  // ("rank 1: save of chunk 5: connection refused (store: ...)"), the first of them reported.
  if (const std::vector<kvtier::request_error> why = conn.errors(id); !why.empty())
    out.error = why.front().message;
  else if (conn.counters().chunks_saved.value() != to_save)
    out.error = "save: " + std::to_string(conn.counters().chunks_saved.value()) + " of " +
                std::to_string(to_save) + " chunks stored";
  if (conn.finish(id).free_pages_now) cache.release(seq);  // else a save still reads them: kept
  if (r == 0) {
    out.metrics = kvtier::to_prometheus(m, "kvtier", "rank=\"0\"");
    kvtier::write_prometheus(out.metrics, conn.counters(), "kvtier_connector", "rank=\"0\"");
  }
  return out;
}
std::vector<kvtier::token_id> prompt() {
  std::vector<kvtier::token_id> tokens(prompt_tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<kvtier::token_id>((i * 2654435761u) % 151552);
  return tokens;
}

void print_summary(const char* engine, std::size_t prompt_len, const outcome& o, std::size_t bad_bytes) {
  std::printf(
      "engine %-16s prompt %zu tokens: cached prefix %llu, loaded %llu, recomputed %llu, wrong bytes %zu "
      "(%llu connector steps)\n",
      engine, prompt_len, static_cast<unsigned long long>(o.cached),
      static_cast<unsigned long long>(o.loaded), static_cast<unsigned long long>(prompt_len - o.loaded),
      bad_bytes, static_cast<unsigned long long>(o.steps));
}

#ifdef KVTIER_QUICKSTART_ASIO
using remote = kvtier::remote_store<kvtier::resp::asio_connection>;

/// Rank r's L2 on its own server: the deployment's namespace, value format 2 (one checksum per
/// layer of the chunk's layer-major value). The same for threads and for --mpi processes.
std::unique_ptr<remote> make_remote(const kvtier::resp::endpoint& server, kvtier::rank_t world) {
  return std::make_unique<remote>(
      quickstart_ns(world), kvtier::resp::connection_options{.server = server},
      kvtier::value_format::v2(kvtier::layer_group_bytes(model_layout(), chunk_tokens, 1)));
}
#endif

template <kvtier::chunk_store L2>
int run(std::vector<L2*> l2) {
  const std::vector<kvtier::token_id> tokens = prompt();
  int failures = 0;
  std::string metrics;
  for (const char* engine : {"A (cold)", "B (same prompt)"}) {
    std::vector<outcome> out(W);
    kvtier::comm::inproc_world world(W);
    kvtier::comm::run_ranks(world, [&](kvtier::comm::inproc_communicator& c) {
      out[c.rank()] = serve(c, *l2[c.rank()], tokens);
    });
    std::size_t bad_bytes = 0;  // summed over the ranks, as --mpi does
    for (kvtier::rank_t r = 0; r < W; ++r) {
      if (!out[r].error.empty())
        std::printf("engine %s rank %u: %s\n", engine, r, out[r].error.c_str()), ++failures;
      if (out[r].bad_bytes) ++failures;
      bad_bytes += out[r].bad_bytes;
    }
    print_summary(engine, tokens.size(), out[0], bad_bytes);
    metrics = out[0].metrics;
  }
  const kvtier::kv_layout lay = model_layout();
  std::printf(
      "KV in a host paged cache, layout %s (%u layers, %u tokens/page, %llu bytes/token); chunk value %zu "
      "bytes\n",
      lay.name.c_str(), lay.num_layers, lay.block_size,
      static_cast<unsigned long long>(lay.bytes_per_token()), chunk_bytes);
  std::printf("%s", metrics.c_str());
  return failures ? 1 : 0;
}

#ifdef KVTIER_QUICKSTART_MPI
/// The same two engines with one process per rank; every rank keeps its own L2.
template <kvtier::chunk_store L2>
int run_mpi(L2& l2) {
  const std::vector<kvtier::token_id> tokens = prompt();
  std::uint64_t failures = 0;
  std::string metrics;
  for (const char* engine : {"A (cold)", "B (same prompt)"}) {
    // One communicator for the agreement and the bytes: MPI is called from one thread at a time,
    // so MPI_THREAD_SERIALIZED (main_mpi) is enough. A control + data pair of MPI communicators
    // (layers overlapping the forward) needs MPI_THREAD_MULTIPLE: docs/engine_guide.md.
    kvtier::comm::mpi_communicator comm;  // one engine = one world
    if (auto ec = kvtier::comm::mpi_communicator::create(comm, MPI_COMM_WORLD, kvtier::deadline_after(30s))) {
      std::fprintf(stderr, "quickstart: %s\n", comm.last_error().c_str());
      return 1;
    }
    outcome out = serve(comm, l2, tokens);
    if (!out.error.empty()) std::printf("engine %s rank %u: %s\n", engine, comm.rank(), out.error.c_str());
    // Totals over the ranks, on the same world (its last collective).
    std::uint64_t totals[2] = {out.bad_bytes, out.error.empty() && !out.bad_bytes ? 0u : 1u};
    if (auto ec = kvtier::comm::all_reduce<kvtier::comm::mpi_communicator, std::uint64_t>(
            comm, totals, totals, kvtier::comm::reduce_op::sum, kvtier::deadline_after(30s))) {
      std::fprintf(stderr, "quickstart: totals: %s\n", comm.last_error().c_str());
      return 1;
    }
    failures += totals[1];
    if (comm.rank() == 0) print_summary(engine, tokens.size(), out, static_cast<std::size_t>(totals[0]));
    metrics = out.metrics;
  }
  std::printf("%s", metrics.c_str());
  return failures ? 1 : 0;
}

int main_mpi(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 0, rc = 2;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc == 2) {
    kvtier::memory_store l2(64u << 20);
    rc = run_mpi(l2);
  } else {
#ifdef KVTIER_QUICKSTART_ASIO
    auto url = kvtier::resp::parse_url(argv[2], rank);
    if (url.ec) {
      std::fprintf(stderr, "quickstart: %s\n", url.message.c_str());
    } else {
      auto l2 = make_remote(url.value, static_cast<kvtier::rank_t>(size));
      rc = run_mpi(*l2);
    }
#else
    std::fprintf(stderr, "quickstart: built without Boost.Asio; only the in-process L2 is available\n");
#endif
  }
  MPI_Finalize();
  return rc;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && !std::strcmp(argv[1], "--mpi")) {
#ifdef KVTIER_QUICKSTART_MPI
    if (argc <= 3) return main_mpi(argc, argv);
#else
    std::fprintf(stderr, "quickstart: built without MPI (install libopenmpi-dev)\n");
    return 2;
#endif
  }
  if (argc > 2 || (argc == 2 && (!std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")))) {
    std::fprintf(stderr,
                 "usage: quickstart [resp://host:{rank+PORT} | resp+unix:///path]\n"
                 "       mpiexec -n W quickstart --mpi [resp://host:{rank+PORT} | resp+unix:///path]\n");
    return 2;
  }
  if (argc == 1) {
    std::vector<std::unique_ptr<kvtier::memory_store>> servers;  // stand in for one server per rank
    std::vector<kvtier::memory_store*> l2;
    for (kvtier::rank_t r = 0; r < W; ++r)
      l2.push_back(servers.emplace_back(std::make_unique<kvtier::memory_store>(64u << 20)).get());
    return run(l2);
  }
#ifdef KVTIER_QUICKSTART_ASIO
  std::vector<std::unique_ptr<remote>> servers;
  std::vector<remote*> l2;
  for (kvtier::rank_t r = 0; r < W; ++r) {
    auto url = kvtier::resp::parse_url(argv[1], static_cast<int>(r));
    if (url.ec) {
      std::fprintf(stderr, "quickstart: %s\n", url.message.c_str());
      return 2;
    }
    servers.push_back(make_remote(url.value, W));
    l2.push_back(servers.back().get());
  }
  return run(l2);
#else
  std::fprintf(stderr, "quickstart: built without Boost.Asio; only the in-process L2 is available\n");
  return 2;
#endif
}
