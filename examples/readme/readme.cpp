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
#include <optional>
#include <span>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

constexpr kvtier::rank_t W = 4;                     // PCP ranks (threads here; processes with NCCL)
constexpr std::size_t T = 256, chunk_bytes = 4096;  // tokens and KV bytes per chunk

// "The model": the KV of chunk c (the same on every rank after prefill).
void compute(std::size_t c, std::span<std::byte> kv) {
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = std::byte(c * 31 + i);
}

int main() {
  std::vector<kvtier::token_id> tokens(10 * T + 100);  // a prompt: 10 full chunks and a tail
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = kvtier::token_id(i * 7919 % 151552);
  const kvtier::modulo_ownership own(W);  // chunk c belongs to rank c % W
  const kvtier::chunker<> chunk(
      {.model = "my-model", .kv_format = "fp8", .chunk_tokens = T, .ownership = own.geometry()});
  const std::vector<kvtier::chunk_key> keys = chunk.keys(tokens);  // one per full chunk

  kvtier::comm::inproc_world world(W);  // in an engine: kvtier::comm::nccl_communicator
  kvtier::comm::run_ranks(world, [&](kvtier::comm::inproc_communicator& comm) {
    const kvtier::rank_t r = comm.rank();
    kvtier::memory_store l1(64 << 20), l2(64 << 20);  // L2 in an engine: this rank's own server,
    // kvtier::remote_store<kvtier::resp::asio_connection> l2(chunk.ns(), {.server = url_of_rank_r});
    kvtier::tiered_store tiers(l1, l2);
    kvtier::rank_view view(tiers, own, r, chunk.ns());  // rank r stores and loads only the chunks it owns
    kvtier::fetch_queue queue(tiers);
    kvtier::fetch_handle saving;  // the last write-back: its sources stay the queue's until it completes
    std::vector<std::byte> kv(keys.size() * chunk_bytes);  // where the engine keeps this prompt's KV
    std::vector<std::span<std::byte>> chunk_kv;            // chunk c's part of it
    for (std::size_t c = 0; c < keys.size(); ++c)
      chunk_kv.push_back(std::span(kv).subspan(c * chunk_bytes, chunk_bytes));

    auto finish_write_back = [&] {  // returns by the put's own deadline
      if (std::optional<kvtier::fetch_result> w = queue.wait(saving, kvtier::no_deadline); w && w->ec)
        std::cerr << "rank " << r << ": put: " << w->ec.message() << "\n";  // a later request recomputes
    };

    for (kvtier::request_id id : {1, 2}) {      // the same prompt twice: computed, then loaded
      if (saving.valid()) finish_write_back();  // the KV buffer is reused below
      // ONE request deadline on every rank; this rank's own I/O ends 500 ms before it (see "Deadlines").
      const kvtier::phase_deadlines dl = kvtier::phase_deadlines::split(kvtier::deadline_after(2s), 500ms);

      // 1. The cached prefix: this rank's answer over its own chunks, then the minimum over ranks.
      std::uint64_t hit =
          view.lookup(keys, tokens.size(), dl.local_io).answer_tokens;  // errors only shrink it
      if (kvtier::comm::all_reduce_value(comm, hit, kvtier::comm::reduce_op::min, dl.collective)) {
        std::cerr << "rank " << r << ": all-reduce: " << comm.last_error() << "\n";
        hit = 0;  // recompute everything (the broadcast below then fails on every rank too)
      }

      // 2. Load this rank's chunks below the prefix, asynchronously; poll() is empty while pending.
      const std::size_t n = hit / T;
      const std::span<const kvtier::chunk_key> prefix_keys = std::span(keys).first(n);
      kvtier::fetch_handle h =
          queue.submit(id, view.select(prefix_keys), view.select(std::span(chunk_kv).first(n)),
                       kvtier::chunk_layout::owned(view.owned_starts(n), hit), dl.local_io);
      std::optional<kvtier::fetch_result> loaded;
      while (!(loaded = queue.poll(h))) std::this_thread::yield();  // an engine steps other requests here

      // 3. Agree on the prefix every owner loaded; each owner broadcasts its chunks to every rank.
      kvtier::chunk_span_buffers bufs;
      for (std::size_t c = 0; c < n; ++c)
        bufs.sources.push_back(chunk_kv[c]), bufs.destinations.push_back(chunk_kv[c]);
      const kvtier::broadcast_params p{.n_chunks = n,
                                       .chunk_tokens = T,
                                       .chunk_bytes = chunk_bytes,
                                       .mode = kvtier::broadcast_mode::grouped,
                                       .request_id = id};
      const kvtier::broadcast_result b =
          kvtier::chunk_broadcast(comm, own, loaded->answer_tokens, bufs, p, dl.collective);
      if (b.ec) std::cerr << "rank " << r << ": chunk_broadcast: " << b.message << "\n";  // agreed 0

      // 4. Compute the rest; store the new chunks this rank owns, off this thread (own deadline:
      //    no peer waits on it; the queue holds the sources until the put completes).
      std::vector<kvtier::chunk_key> new_keys;
      std::vector<std::span<const std::byte>> new_kv;
      for (std::size_t c = b.agreed_chunks; c < keys.size(); ++c) {
        compute(c, chunk_kv[c]);
        if (view.owns(c)) new_keys.push_back(keys[c]), new_kv.push_back(chunk_kv[c]);
      }
      saving = queue.put(id, new_keys, new_kv, kvtier::deadline_after(2s));
      if (r == 0)
        std::cout << "request " << id << ": " << tokens.size() << " tokens, " << b.agreed_tokens
                  << " loaded, " << tokens.size() - b.agreed_tokens << " computed\n";
    }
    finish_write_back();
  });
}
// README-END
