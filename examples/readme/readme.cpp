// examples/readme/readme.cpp: the program README.md shows under "Using it".
//
// The lines between the two markers below are the README's code block, byte for
// byte; the test readme_snippet fails when they differ, and readme_program runs
// this program. Edit here first, then paste the region into README.md.
//
// README-BEGIN
#include <kvtier/kvtier.hpp>

#include <chrono>
#include <iostream>
#include <map>
#include <vector>

using namespace std::chrono_literals;

constexpr kvtier::rank_t W = 4;     // PCP ranks (threads here; processes with MPI)
constexpr std::size_t T = 256;      // tokens per chunk
constexpr std::uint32_t page = 64;  // tokens per page of the engine's paged KV cache

// "The model": the KV of positions [first, end) into the pages (the same on every rank).
void compute(kvtier::host_kv_cache& cache, const kvtier::host_kv_cache::sequence& seq, std::size_t first,
             std::size_t end) {
  std::vector<std::byte> kv(cache.value_bytes(1));
  for (std::size_t p = first; p < end; ++p) {
    for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = std::byte(p * 31 + i);
    cache.scatter(seq, p, 1, kv);
  }
}

int main() {
  std::vector<kvtier::token_id> tokens(10 * T + 100);  // a prompt: 10 full chunks and a tail
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = kvtier::token_id(i * 7919 % 151552);
  const kvtier::modulo_ownership own(W);  // chunk c belongs to rank c % W
  const kvtier::chunker<> chunk(
      {.model = "my-model", .kv_format = "mla-bf16", .chunk_tokens = T, .ownership = own.geometry()});

  kvtier::comm::inproc_world world(W);  // in an engine: kvtier::comm::mpi_communicator
  kvtier::comm::run_ranks(world, [&](kvtier::comm::inproc_communicator& comm) {
    kvtier::memory_store l1(64 << 20), l2(64 << 20);  // L2 in an engine: this rank's own server,
    // kvtier::remote_store<kvtier::resp::asio_connection> l2(chunk.ns(), {.server = url_of_rank_r});
    kvtier::tiered_store tiers(l1, l2);
    kvtier::host_kv_cache cache(kvtier::kv_layout::vllm_mla(/*layers=*/4, /*blocks=*/256, page));
    // Deadlines: a lookup or load that runs out only shortens the agreed prefix (recompute from
    // there). Generous here, where 4 ranks share a laptop's cores; an engine derives them from its
    // prefill speed (defaults: 50 ms a lookup, 200 ms + 20 ms per 1,000 tokens a load).
    const kvtier::connector_options opt{.load_deadline = {.base = 2s}, .lookup_timeout = 1s};
    kvtier::connector conn(chunk, own, tiers, comm, cache.view(), opt);  // rank r loads, saves its chunks
    // Pages that saves still read, freed once finished() lists their request (vLLM's
    // get_finished): never wait for a save, a peer's step would wait for this rank.
    std::map<kvtier::request_id, kvtier::host_kv_cache::sequence> saving;
    std::uint64_t saving_anywhere = 0;  // agreed: the most pages held for saves on any rank
    // An engine calls step() once per engine step on every rank; here: until the agreed state holds.
    const auto step_until = [&](auto agreed) {
      do {
        std::uint64_t word = ~std::uint64_t{saving.size()};  // the step agrees the min: of ~x, the max
        conn.step(kvtier::deadline_after(1s), {&word, 1});
        saving_anywhere = ~word;
        for (kvtier::request_id done : conn.finished().saves)
          if (auto s = saving.extract(done)) cache.release(s.mapped());
      } while (!agreed());
    };

    for (kvtier::request_id id : {1, 2}) {  // the same prompt twice: computed, then loaded
      conn.begin_lookup(id, tokens);        // never blocks; the owners ask their stores
      step_until([&] { return conn.lookup(id).has_value(); });  // the min over ranks, agreed
      kvtier::host_kv_cache::sequence seq;
      cache.reserve(seq, tokens.size());
      const auto slots = kvtier::slots_from_block_table({seq.blocks, 0, tokens.size()}, page);
      std::uint64_t loaded = 0;
      if (conn.lookup(id)->tokens_to_load() > 0) {
        conn.load(id, slots);  // owners fetch; each chunk moves to every rank and into its pages
        step_until([&] { return conn.load_result(id).has_value(); });
        loaded = conn.load_result(id)->loaded_end_token;  // a failure only shortens it, on every rank
      }
      compute(cache, seq, loaded, tokens.size());
      conn.save(id, slots, loaded, tokens.size());  // owners write their new chunks, off the step
      if (conn.finish(id).free_pages_now)
        cache.release(seq);
      else
        saving.emplace(id, std::move(seq));  // the saves still read the pages: a later step frees them
      if (id == 1)  // the same prompt comes back once every rank's saves ended (steps go on meanwhile)
        step_until([&] { return saving_anywhere == 0; });
      if (comm.rank() == 0)
        std::cout << "request " << id << ": " << tokens.size() << " tokens, " << loaded << " loaded, "
                  << tokens.size() - loaded << " computed\n";
    }
  });  // ~connector ends the saves still running; pages left in `saving` go with the cache
}
// README-END
