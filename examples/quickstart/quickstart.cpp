// examples/quickstart/quickstart.cpp: the whole kvtier flow for one prompt, in one file.
//
// W ranks run as threads over the in-process communicator. Engine A prefills a
// prompt and each rank stores the chunks it owns; engine B (same W, same shared
// L2) then receives the same prompt, and on every rank:
//
//   keys -> owned chunks -> exists -> rank answer -> all-reduce min (cached prefix)
//   -> asynchronous fetch of the owned chunks below it
//   -> while it runs: pipelined_broadcast stages driven by the fetch queue's progress
//      (agree on the loaded prefix so far, owner -> every rank), each agreed chunk into the pages
//   -> "compute" the rest -> verify every byte -> store the owned new chunks.
//
// One deadline covers the whole request on every rank; this rank's own I/O ends a margin
// before it (kvtier::phase_deadlines, see serve()). The write-back runs off the request path
// (fetch_queue::put). One key namespace (quickstart_ns) names the chunks and the servers' keys.
//
// The KV lives where an engine keeps it: a paged cache in the vLLM MLA layout (576 bf16 values
// per token and layer; 2 layers here instead of a real model's 61, to fit memory), pages of 64
// tokens, in host memory (kvtier::host_kv_cache). A chunk's value is gathered out of the pages
// before it is stored and scattered into the pages after it is loaded, through staging slots of a
// kvtier::pinned_arena; every loaded chunk is verified in the paged layout, entry by entry.
// Against servers (each rank's own, with or without --mpi), values use format 2 with one
// checksum per layer.
//
//   quickstart                                     # L2 = one in-process store per rank
//   quickstart resp://127.0.0.1:{rank+6400}        # L2 = one redis-server/valkey per rank
//   mpiexec -n 4 quickstart --mpi [resp://...]     # ranks as processes (MPI host communicator)
//
// With --mpi every rank is a process: engines A and B are two communicators over
// MPI_COMM_WORLD, each rank keeps its L2 (in-process, or its own server) between them,
// and rank 0 prints the same summary, with wrong bytes summed over all ranks.
//
// The last line is the Prometheus text of engine B's rank-0 fetch queue and tiers.
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
  std::uint64_t cached = 0, loaded = 0, stages = 0;
  std::size_t bad_bytes = 0;
  std::string error, metrics;
};

/// One engine's handling of the prompt on rank r, over that rank's L2.
template <kvtier::comm::communicator Comm, kvtier::chunk_store L2>
outcome serve(Comm& comm, L2& l2, std::span<const kvtier::token_id> tokens) {
  const kvtier::rank_t r = comm.rank();
  const kvtier::modulo_ownership own(comm.size());
  const kvtier::chunker<> chunk(quickstart_ns(comm.size()));
  const std::vector<kvtier::chunk_key> keys = chunk.keys(tokens);
  const std::size_t n_chunks = keys.size();
  outcome out;
  if constexpr (requires { l2.ns(); })  // a remote L2 names its keys by its own namespace
    if (l2.ns().text() != chunk.ns().text()) {
      out.error =
          "the L2's key namespace (" + l2.ns().text() + ") is not the chunker's (" + chunk.ns().text() + ")";
      return out;
    }
  // One deadline for the whole request (lookup, agreement, load, broadcast), taken once when the
  // request starts and used on every rank: the collectives wait for the slowest peer until it.
  // This rank's own I/O (lookup, load) ends 1 s before it, so a rank whose server is stuck still
  // reaches the collectives in time: its failed I/O only shrinks its answer, instead of making
  // every rank lose the prefix. (Across processes, derive it from the request's agreed arrival
  // time.) The write-back after compute gets its own.
  const kvtier::phase_deadlines dl = kvtier::phase_deadlines::split(kvtier::deadline_after(5s), 1s);

  kvtier::memory_store l1(64u << 20);
  kvtier::metrics m;
  kvtier::tiered_store tiers(l1, l2, {.metrics = &m});
  kvtier::rank_view view(tiers, own, r, chunk.ns());
  // One key per store call, so the queue's progress advances chunk by chunk.
  kvtier::fetch_queue queue(tiers, {.workers = 1, .max_batch_chunks = 1, .metrics = &m});

  // Every rank ends with the whole prompt's KV in its paged cache (as after PCP's all-gather).
  // Chunk values travel through staging slots of one pinned arena (one registration).
  kvtier::host_kv_cache cache(model_layout());
  kvtier::host_kv_cache::sequence seq;
  std::error_code aec;
  std::string why;
  auto arena = kvtier::pinned_arena::create({.slot_bytes = chunk_bytes, .slots = n_chunks}, aec, &why);
  if (!arena || !cache.reserve(seq, n_chunks * chunk_tokens)) {
    out.error = arena ? "paged cache: out of blocks" : "staging arena: " + why;
    return out;
  }
  std::vector<kvtier::pinned_arena::slot> slots;
  std::vector<std::span<std::byte>> dst;  // chunk c's value
  for (std::size_t c = 0; c < n_chunks; ++c)
    dst.push_back(slots.emplace_back(arena->try_acquire(aec)).bytes());

  // 1. Lookup: this rank's answer, then the scheduler's minimum over ranks.
  // A failed lookup only shrinks the answer (recompute more); .ec says why. (This lookup blocks
  // until dl.local_io; an engine that must not block uses queue.lookup() and polls.)
  std::uint64_t hit = view.lookup(keys, tokens.size(), dl.local_io).answer_tokens;
  if (auto ec = kvtier::comm::all_reduce_value(comm, hit, kvtier::comm::reduce_op::min, dl.collective)) {
    out.error = "lookup all-reduce: " + ec.message();
    return out;
  }
  out.cached = hit;

  // 2. Load the owned chunks below the cached prefix, asynchronously.
  const std::size_t hit_chunks = hit / chunk_tokens;
  std::vector<kvtier::chunk_key> my_keys;
  std::vector<std::span<std::byte>> my_dst;
  for (std::size_t c : view.owned_chunks(hit_chunks)) my_keys.push_back(keys[c]), my_dst.push_back(dst[c]);
  auto h = queue.submit(1, my_keys, my_dst, kvtier::chunk_layout::owned(view.owned_starts(hit_chunks), hit),
                        dl.local_io);

  // 3. While the owned chunks land: stage by stage, agree on the loaded prefix so far and move the
  //    newly agreed chunks from their owners to every rank (pipelined_broadcast, driven by the
  //    fetch queue's progress); each agreed chunk goes into the pages at once and is verified
  //    there against what compute would give. Every rank runs the same stages (pb.done() and
  //    the stage results are agreed values).
  kvtier::chunk_span_buffers bufs;
  for (std::size_t c = 0; c < hit_chunks; ++c)
    bufs.destinations.push_back(dst[c]), bufs.sources.push_back(dst[c]);
  kvtier::pipelined_broadcast pb(comm, own, bufs,
                                 {.n_chunks = hit_chunks,
                                  .chunk_tokens = chunk_tokens,
                                  .chunk_bytes = chunk_bytes,
                                  .mode = kvtier::broadcast_mode::grouped,
                                  .request_id = 1});
  std::vector<std::byte> expect(chunk_bytes);
  std::size_t paged = 0, want = 1;
  for (int stage = 0; stage < 100000 && !pb.done(); ++stage) {  // bounded
    // an engine steps its other requests here; this one waits a moment for its next chunk
    const kvtier::fetch_progress p =
        queue.wait_progress(h, want, std::min(dl.collective, kvtier::deadline_after(2ms)));
    want = p.answer_chunks + 1;
    const kvtier::broadcast_result& b = pb.step(p.answer_tokens, p.complete, dl.collective);
    ++out.stages;
    if (b.ec) {
      out.error = "pipelined_broadcast: " + b.message;
      break;
    }
    for (; paged < pb.agreed_chunks(); ++paged) {
      if (auto ec = cache.scatter(seq, paged * chunk_tokens, chunk_tokens, dst[paged]))
        out.error = "paged copy: " + ec.message();
      compute_chunk(tokens, paged, expect);
      out.bad_bytes += wrong_paged_bytes(cache, seq, paged, expect);
    }
  }
  out.loaded = pb.result().agreed_tokens;  // 0 on error: recompute everything
  // The destinations belong to the queue until the load completes (this rank may have loaded
  // past the agreed prefix): wait for it, or cancel and wait for the store call to return.
  if (!queue.wait(h, dl.collective)) {
    queue.cancel(h);
    queue.wait(h, kvtier::no_deadline);  // bounded: the store call ends by dl.local_io
  }

  // 4. The rest is "computed" into the pages (the model writes its KV there) and gathered into
  //    a value for the write-back.
  for (std::size_t c = out.loaded / chunk_tokens; c < n_chunks; ++c) {
    compute_chunk(tokens, c, expect);
    std::error_code cec = cache.scatter(seq, c * chunk_tokens, chunk_tokens, expect);
    if (!cec) cec = cache.gather(seq, c * chunk_tokens, chunk_tokens, dst[c]);
    if (cec) out.error = "paged copy: " + cec.message();
  }

  // 5. Write back the computed chunks this rank owns (every rank stores its share; the
  //    loaded ones are already there), off this thread: the queue holds the staging slots
  //    (the sources) until the put completes. An engine would free them in on_complete and
  //    go on; this one waits, since the slots go when serve() returns.
  std::vector<kvtier::chunk_key> new_keys;
  std::vector<std::span<const std::byte>> new_src;
  for (std::size_t c = out.loaded / chunk_tokens; c < n_chunks; ++c)
    if (own.owner(c) == r) new_keys.push_back(keys[c]), new_src.push_back(dst[c]);
  const kvtier::fetch_handle saving = queue.put(2, new_keys, new_src, kvtier::deadline_after(5s));
  const std::optional<kvtier::fetch_result> saved =
      queue.wait(saving, kvtier::no_deadline);  // by its deadline
  if (saved && saved->ec)
    out.error = "put: " + saved->ec.message();
  else if (saved && saved->answer_chunks != new_keys.size())
    out.error = "put: a chunk was not stored";
  if (r == 0) out.metrics = kvtier::to_prometheus(m, "kvtier", "rank=\"0\"");
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
      "(%llu broadcast stages)\n",
      engine, prompt_len, static_cast<unsigned long long>(o.cached),
      static_cast<unsigned long long>(o.loaded), static_cast<unsigned long long>(prompt_len - o.loaded),
      bad_bytes, static_cast<unsigned long long>(o.stages));
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
    for (kvtier::rank_t r = 0; r < W; ++r) {
      if (!out[r].error.empty())
        std::printf("engine %s rank %u: %s\n", engine, r, out[r].error.c_str()), ++failures;
      if (out[r].bad_bytes) ++failures;
    }
    print_summary(engine, tokens.size(), out[0], out[0].bad_bytes);
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
