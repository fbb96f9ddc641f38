// examples/quickstart/quickstart.cpp: the whole kvtier flow for one prompt, in one file.
//
// W ranks run as threads over the in-process communicator. Engine A prefills a
// prompt and each rank stores the chunks it owns; engine B (same W, same shared
// L2) then receives the same prompt, and on every rank:
//
//   keys -> owned chunks -> exists -> rank answer -> all-reduce min (cached prefix)
//   -> asynchronous fetch of the owned chunks below it (poll, never block)
//   -> chunk_broadcast (agree on the loaded prefix, owner -> every rank)
//   -> "compute" the rest -> verify every byte -> store the owned new chunks.
//
//   quickstart                                     # L2 = one in-process store per rank
//   quickstart resp://127.0.0.1:{rank+6400}        # L2 = one redis-server/valkey per rank
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

using namespace std::chrono_literals;

namespace {

constexpr kvtier::rank_t W = 4;
constexpr std::size_t chunk_tokens = 256, chunk_bytes = 4096, prompt_tokens = 40 * 256 + 100;

/// What "the model" writes for chunk c of this prompt: a pure function of its tokens,
/// so a loaded chunk can be checked byte for byte against a recomputed one.
void compute_chunk(std::span<const kvtier::token_id> tokens, std::size_t c, std::span<std::byte> out) {
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (c + 1);
  for (std::size_t t = c * chunk_tokens; t < (c + 1) * chunk_tokens; ++t)
    x = (x ^ tokens[t]) * 0x100000001B3ull;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((x >> (8 * (i % 8))) + i);
}

struct outcome {
  std::uint64_t cached = 0, loaded = 0;
  std::size_t bad_bytes = 0;
  std::string error, metrics;
};

/// One engine's handling of the prompt on rank r, over that rank's L2.
template <kvtier::chunk_store L2>
outcome serve(kvtier::comm::inproc_communicator& comm, L2& l2, std::span<const kvtier::token_id> tokens) {
  const kvtier::rank_t r = comm.rank();
  const kvtier::modulo_ownership own(W);
  const kvtier::chunker<> chunk(kvtier::key_namespace{.model = "quickstart-model",
                                                      .kv_format = "demo",
                                                      .chunk_tokens = chunk_tokens,
                                                      .ownership = own.geometry()});
  const std::vector<kvtier::chunk_key> keys = chunk.keys(tokens);
  const std::size_t n_chunks = keys.size();
  auto dl = [] { return kvtier::deadline_after(2s); };

  kvtier::memory_store l1(64u << 20);
  kvtier::metrics m;
  kvtier::tiered_store tiers(l1, l2, {.metrics = &m});
  kvtier::rank_view view(tiers, own, r);
  kvtier::fetch_queue queue(tiers, {.workers = 1, .metrics = &m});

  // Every rank ends with the whole prompt's KV (as after PCP's all-gather).
  std::vector<std::byte> kv(n_chunks * chunk_bytes);
  std::vector<std::span<std::byte>> dst;
  for (std::size_t c = 0; c < n_chunks; ++c) dst.emplace_back(kv.data() + c * chunk_bytes, chunk_bytes);

  // 1. Lookup: this rank's answer, then the scheduler's minimum over ranks.
  outcome out;
  // A failed lookup only shrinks the answer (recompute more); .ec says why.
  std::uint64_t hit = view.lookup(keys, chunk_tokens, tokens.size(), dl()).answer_tokens;
  if (auto ec = kvtier::comm::all_reduce_value(comm, hit, kvtier::comm::reduce_op::min, dl())) {
    out.error = "lookup all-reduce: " + ec.message();
    return out;
  }
  out.cached = hit;

  // 2. Load the owned chunks below the cached prefix, asynchronously.
  const std::size_t hit_chunks = hit / chunk_tokens;
  std::vector<kvtier::chunk_key> my_keys;
  std::vector<std::span<std::byte>> my_dst;
  for (std::size_t c : view.owned_chunks(hit_chunks)) my_keys.push_back(keys[c]), my_dst.push_back(dst[c]);
  auto h = queue.submit(1, my_keys, my_dst,
                        kvtier::chunk_layout::owned(view.owned_starts(hit_chunks, chunk_tokens), hit), dl());
  std::optional<kvtier::fetch_result> res;
  while (!(res = queue.poll(h)))  // empty while pending: never read as "0 tokens loaded"
    std::this_thread::yield();    // an engine steps its other requests here
  // A failed load reports this rank's first owned start (nothing of its own loaded).
  const std::uint64_t loaded_r = res->answer_tokens;

  // 3. Agree on the loaded prefix and move each chunk from its owner to every rank.
  kvtier::chunk_span_buffers bufs;
  for (std::size_t c = 0; c < hit_chunks; ++c)
    bufs.destinations.push_back(dst[c]), bufs.sources.push_back(dst[c]);
  const auto b = kvtier::chunk_broadcast(comm, own, loaded_r, bufs,
                                         {.n_chunks = hit_chunks,
                                          .chunk_tokens = chunk_tokens,
                                          .chunk_bytes = chunk_bytes,
                                          .mode = kvtier::broadcast_mode::grouped,
                                          .request_id = 1},
                                         dl());
  if (b.ec) out.error = "chunk_broadcast: " + b.message;
  out.loaded = b.agreed_tokens;  // 0 on error: recompute everything

  // 4. Compute the rest, check the loaded part against what compute would give.
  std::vector<std::byte> expect(chunk_bytes);
  for (std::size_t c = 0; c < n_chunks; ++c) {
    if (c < out.loaded / chunk_tokens) {
      compute_chunk(tokens, c, expect);
      for (std::size_t i = 0; i < chunk_bytes; ++i) out.bad_bytes += dst[c][i] != expect[i];
    } else {
      compute_chunk(tokens, c, dst[c]);
    }
  }

  // 5. Write back the computed chunks this rank owns (every rank stores its share; the
  //    loaded ones are already there).
  std::vector<kvtier::chunk_key> new_keys;
  std::vector<std::span<const std::byte>> new_src;
  for (std::size_t c = out.loaded / chunk_tokens; c < n_chunks; ++c)
    if (own.owner(c) == r) new_keys.push_back(keys[c]), new_src.push_back(dst[c]);
  std::vector<kvtier::chunk_status> st(new_keys.size());
  if (auto ec = tiers.put(new_keys, new_src, st, dl())) out.error = "put: " + ec.message();
  if (r == 0) out.metrics = kvtier::to_prometheus(m, "kvtier", "rank=\"0\"");
  return out;
}

template <kvtier::chunk_store L2>
int run(std::vector<L2*> l2) {
  std::vector<kvtier::token_id> tokens(prompt_tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<kvtier::token_id>((i * 2654435761u) % 151552);
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
    std::printf(
        "engine %-16s prompt %zu tokens: cached prefix %llu, loaded %llu, recomputed %llu, wrong bytes %zu\n",
        engine, tokens.size(), static_cast<unsigned long long>(out[0].cached),
        static_cast<unsigned long long>(out[0].loaded),
        static_cast<unsigned long long>(tokens.size() - out[0].loaded), out[0].bad_bytes);
    metrics = out[0].metrics;
  }
  std::printf("%s", metrics.c_str());
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && (!std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")))) {
    std::fprintf(stderr, "usage: quickstart [resp://host:{rank+PORT} | resp+unix:///path]\n");
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
  using remote = kvtier::remote_store<kvtier::resp::asio_connection>;
  std::vector<std::unique_ptr<remote>> servers;
  std::vector<remote*> l2;
  for (kvtier::rank_t r = 0; r < W; ++r) {
    auto url = kvtier::resp::parse_url(argv[1], static_cast<int>(r));
    if (url.ec) {
      std::fprintf(stderr, "quickstart: %s\n", url.message.c_str());
      return 2;
    }
    servers.push_back(
        std::make_unique<remote>(kvtier::key_namespace{.model = "quickstart-model",
                                                       .kv_format = "demo",
                                                       .chunk_tokens = chunk_tokens,
                                                       .ownership = kvtier::modulo_ownership(W).geometry()},
                                 kvtier::resp::connection_options{.server = url.value}));
    l2.push_back(servers.back().get());
  }
  return run(l2);
#else
  std::fprintf(stderr, "quickstart: built without Boost.Asio; only the in-process L2 is available\n");
  return 2;
#endif
}
