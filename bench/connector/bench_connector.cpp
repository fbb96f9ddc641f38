// bench_connector: the connector's load path against the same request composed by hand, and
// against the fetch alone, over the same stores and data, interleaved, medians of each.
//
// One prompt of 64 chunks x 2 MiB (load_rig.hpp: vLLM MLA pages, 8 layers x 512 latent bf16 x 256
// tokens) on W = 2 rank threads (in-process communicators: control, and data for the connector's mover),
// each rank with its own store holding the chunks it owns:
//   fetch     this rank's owned chunks through a fetch_queue into staging (the floor);
//   by hand   lookup + all-reduce, fetch, wait, chunk_broadcast (grouped), kv_scatter into pages;
//   connector begin_lookup .. step .. load .. step until load_result (moves overlapped with the
//             fetch: each step agrees the fetched prefix and the mover broadcasts and scatters it).
//   streamed  the same with connector_options::stream_groups (redis only: remote_store reads
//             group-major with GETRANGE, each step agrees and moves the layer groups fetched so
//             far; fetch_batch_chunks = 0), a connector of its own on its own data world.
//   forward   an engine's forward over the loading request (kvtier_bench::connector_forward):
//             load(), then per layer wait_for_layer(l) (which agrees group(l) itself) and a
//             modeled compute of 0 or 10 ms per layer (a sleep: the GPU's time, not the host's
//             cores; 10 ms is about one group's share of the ~50 ms load, 4 groups of 2 layers),
//             then steps until the outcome (forward_rows.hpp, shared with bench_connector_mpi).
//             Whole-chunk and streamed; times from load() to layer 0 ready, the last layer
//             ready, the forward's end and the agreed outcome, and streamed / whole.
//   save      the connector's save of the whole prompt (write-through form: each owner puts its
//             chunks from where they lie in the pages, put_pieces: the redis store hashes each
//             value and sends it from the pages with writev, the memory store copies it once)
//             against a plain store put of the same chunks already gathered into one buffer:
//             save / put, target <= 1.1x (issue 28).
// Stores: memory_store, and (when redis-server is installed) one redis-server per rank (value
// format 2, a checksum per layer group). The warm-up round checks the pages byte for byte.
// Ranks as processes: bench_connector_mpi.
//
//   build/release/bench/bench_connector [reps]      (default 7)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "connector/forward_rows.hpp"
#include "connector/load_rig.hpp"
#include "kvtier/kvtier.hpp"
#if KVTIER_BENCH_HAS_REDIS
#include "kvtier/resp/asio_connection.hpp"
#include "support/redis_server.hpp"
#endif
#include "support/machine.hpp"
#include "support/stats.hpp"

using namespace kvtier;
using clk = std::chrono::steady_clock;

namespace {

using kvtier_bench::load_rig;
constexpr rank_t W = 2;

struct figures {
  std::vector<double> fetch, hand, conn, streamed;
  std::vector<double> save, plain_put;  // the connector's save of the prompt; a put of the gathered bytes
  kvtier_bench::forward_samples forward;
};

void barrier(comm::inproc_communicator& c) {
  std::uint64_t v = 0;
  comm::all_reduce_value(c, v, comm::reduce_op::min, deadline_after(std::chrono::seconds(30)));
}

template <class Store>
void run(const char* label, std::vector<std::unique_ptr<Store>>& stores, int reps, figures& fig) {
  const load_rig rig(W);
  const std::size_t T = load_rig::T, C = load_rig::C, bytes = load_rig::chunk_bytes();
  const auto& prompt = rig.prompt;
  const auto& keys = rig.keys;
  const auto& own = rig.own;
  std::atomic<std::size_t> wrong{0};
  comm::inproc_world ctrl_world(W), data_world(W), stream_world(W);
  constexpr bool streams = group_streaming_store<Store>;
  comm::run_ranks(ctrl_world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    comm::inproc_communicator d = data_world.communicator_for(r), ds = stream_world.communicator_for(r);
    Store& store = *stores[r];
    rig.put_owned(store, r);
    host_kv_cache cache(load_rig::layout());
    host_kv_cache::sequence seq;
    cache.reserve(seq, prompt.size());
    const auto slots = slots_from_block_table({seq.blocks, 0, prompt.size()}, load_rig::page);
    std::vector<std::byte> staging(C * bytes);
    std::vector<std::span<std::byte>> chunk_kv;
    for (std::size_t k = 0; k < C; ++k) chunk_kv.push_back(std::span(staging).subspan(k * bytes, bytes));
    fetch_queue<Store> queue(store, {.workers = 2, .max_batch_chunks = 1});
    rank_view view(store, own, r, rig.ns);
    connector conn(rig.chunk, own, store, c, d, cache.view(), load_rig::connector_options());
    connector_options stream_opt = load_rig::connector_options();
    stream_opt.stream_groups = true;
    stream_opt.fetch_batch_chunks = 0;
    connector conn_s(rig.chunk, own, store, c, ds, cache.view(), stream_opt);
    const auto dl = [] { return deadline_after(std::chrono::seconds(30)); };

    auto fetch_owned = [&](request_id id) {
      const auto mine = view.owned_chunks(C);
      std::vector<std::span<std::byte>> dst;
      for (std::size_t k : mine) dst.push_back(chunk_kv[k]);
      auto h = queue.submit(id, view.owned_keys(keys), dst, chunk_layout::owned(view.owned_starts(C), C * T),
                            dl());
      return queue.wait(h, dl())->answer_tokens;
    };
    auto by_hand = [&](request_id id) {
      std::uint64_t hit = view.lookup(keys, prompt.size(), dl()).answer_tokens;
      comm::all_reduce_value(c, hit, comm::reduce_op::min, dl());
      const std::uint64_t loaded = fetch_owned(id);
      chunk_span_buffers bufs;
      for (std::size_t k = 0; k < hit / T; ++k)
        bufs.sources.push_back(chunk_kv[k]), bufs.destinations.push_back(chunk_kv[k]);
      const broadcast_params p{.n_chunks = hit / T,
                               .chunk_tokens = T,
                               .chunk_bytes = bytes,
                               .mode = broadcast_mode::grouped,
                               .request_id = id};
      const broadcast_result b = chunk_broadcast(c, d, own, loaded, bufs, p, dl());
      for (std::size_t k = 0; k < b.agreed_chunks; ++k)
        kv_scatter(cache.view(), std::span<const std::int64_t>(slots).subspan(k * T, T), chunk_kv[k]);
      return b.agreed_tokens;
    };
    auto by_connector = [&](request_id id) { return kvtier_bench::connector_load(conn, id, prompt, slots); };
    auto save_prompt = [&](request_id id) -> std::uint64_t {
      if (conn.save(id, prompt, slots, 0, prompt.size()) || conn.wait_for_save(id, dl())) return 0;
      const bool failed = !conn.errors(id).empty();
      conn.finish(id);
      return failed ? 0 : C * T;
    };
    auto plain_put = [&](request_id) -> std::uint64_t {
      const auto mine = view.owned_chunks(C);
      const auto mine_keys = view.owned_keys(keys);
      std::vector<std::span<const std::byte>> src;
      for (std::size_t k : mine) src.push_back(chunk_kv[k]);
      std::vector<chunk_status> st(src.size());
      if (store.put(mine_keys, src, st, dl())) return 0;
      for (auto x : st)
        if (x != chunk_status::stored) return 0;
      return C * T;
    };
    auto streamed = [&](request_id id) { return kvtier_bench::connector_load(conn_s, id, prompt, slots); };
    auto time = [&](auto&& f, request_id id, std::vector<double>& out) {
      barrier(c);
      const auto t0 = clk::now();
      const std::uint64_t got = f(id);
      barrier(c);
      if (r == 0) out.push_back(std::chrono::duration<double>(clk::now() - t0).count());
      if (got != C * T)
        std::fprintf(stderr, "rank %u: request %llu loaded %llu tokens\n", r, (unsigned long long)id,
                     (unsigned long long)got);
    };
    for (int i = 0; i < reps + 1; ++i) {  // the first round warms up (checking bytes) and is dropped
      std::vector<double> f, h, k, s;
      time(fetch_owned, 1000 + 4 * i, f);
      if (i == 0) load_rig::clear(cache.view(), slots);
      time(by_hand, 1001 + 4 * i, h);
      if (i == 0) wrong += rig.wrong_chunks(cache.view(), slots), load_rig::clear(cache.view(), slots);
      time(by_connector, 1002 + 4 * i, k);
      if (i == 0) wrong += rig.wrong_chunks(cache.view(), slots), load_rig::clear(cache.view(), slots);
      if constexpr (streams) {
        time(streamed, 1003 + 4 * i, s);
        if (i == 0) wrong += rig.wrong_chunks(cache.view(), slots);
        if (r == 0 && i > 0) fig.streamed.push_back(s[0]);
      }
      if (r == 0 && i > 0) fig.fetch.push_back(f[0]), fig.hand.push_back(h[0]), fig.conn.push_back(k[0]);
      // Saves: the connector's (gather from the pages, hashed in the gather, put) against a plain
      // put of the same chunks already gathered (chunk_kv holds them after the loads above).
      std::vector<double> sv, pp;
      time(save_prompt, 300000 + i, sv);
      time(plain_put, 0, pp);
      if (r == 0 && i > 0) fig.save.push_back(sv[0]), fig.plain_put.push_back(pp[0]);
      const auto n = kvtier_bench::forward_round(
          conn, conn_s, 100000 + 8 * i, rig, cache.view(), slots, streams, i == 0, [&] { barrier(c); },
          r == 0 && i > 0 ? &fig.forward : nullptr);
      wrong += n.wrong;
      if (n.short_loads) std::fprintf(stderr, "rank %u: %zu forwards loaded short\n", r, n.short_loads);
    }
  });
  const double f = kvtier_bench::median(fig.fetch), h = kvtier_bench::median(fig.hand),
               k = kvtier_bench::median(fig.conn);
  std::printf(
      "%-12s fetch alone %7.1f ms | by hand %7.1f ms | connector %7.1f ms | connector / by hand %.2fx | "
      "connector / fetch %.2fx (wrong chunks %zu)\n",
      label, f * 1e3, h * 1e3, k * 1e3, k / h, k / f, wrong.load());
  if (!fig.streamed.empty()) {
    const double s = kvtier_bench::median(fig.streamed);
    std::printf("%-12s streamed connector %7.1f ms | streamed / connector %.2fx | streamed / fetch %.2fx\n",
                label, s * 1e3, s / k, s / f);
  }
  const double sv = kvtier_bench::median(fig.save), pp = kvtier_bench::median(fig.plain_put);
  std::printf(
      "%-12s save from the pages %7.1f ms | plain put of the gathered bytes %7.1f ms | "
      "save / put %.2fx (target <= 1.10x)\n",
      label, sv * 1e3, pp * 1e3, sv / pp);
  kvtier_bench::print_forward(label, fig.forward);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  std::printf("bench_connector: %zu chunks x %.2f MiB, W = %u threads, %d reps (medians), load %.2f\n",
              load_rig::C, load_rig::chunk_bytes() / 1048576.0, W, reps, kvtier_bench::load_average());
  figures mem;
  {
    std::vector<std::unique_ptr<memory_store>> stores;
    for (rank_t r = 0; r < W; ++r) stores.push_back(std::make_unique<memory_store>(std::size_t{512} << 20));
    run("memory", stores, reps, mem);
  }
  figures red;
#if KVTIER_BENCH_HAS_REDIS
  if (std::filesystem::exists("/usr/bin/redis-server")) {
    std::vector<std::unique_ptr<kvtier::test::redis_server>> servers;
    std::vector<std::unique_ptr<remote_store<resp::asio_connection>>> stores;
    for (rank_t r = 0; r < W; ++r) {
      servers.push_back(std::make_unique<kvtier::test::redis_server>());
      stores.push_back(std::make_unique<remote_store<resp::asio_connection>>(
          load_rig(W).ns, resp::connection_options{.server = resp::parse_url(servers[r]->url()).value},
          value_format::v2(layer_group_bytes(load_rig::layout(), load_rig::T, load_rig::layers_per_group))));
    }
    run("redis", stores, reps, red);
  }
#endif
  const auto m = [](const std::vector<double>& v) { return kvtier_bench::median(v) * 1e3; };
  using ft = kvtier_bench::forward_times;
  const auto fm = [&](int mode, std::size_t ci, double ft::*f) {
    return kvtier_bench::forward_median(red.forward.v[mode][ci], f) * 1e3;
  };
  std::printf(
      "{\"bench\":\"connector\",\"chunks\":%zu,\"chunk_bytes\":%zu,\"ranks\":%u,\"reps\":%d,"
      "\"memory\":{\"fetch_ms\":%.2f,\"hand_ms\":%.2f,\"connector_ms\":%.2f,\"save_ms\":%.2f,\"plain_put_"
      "ms\":%.2f},"
      "\"redis\":{\"fetch_ms\":%.2f,\"hand_ms\":%.2f,\"connector_ms\":%.2f,\"streamed_ms\":%.2f,"
      "\"save_ms\":%.2f,\"plain_put_ms\":%.2f,"
      "\"forward_end_ms\":{\"whole\":[%.2f,%.2f],\"streamed\":[%.2f,%.2f]},"
      "\"first_layer_ms\":{\"whole\":[%.2f,%.2f],\"streamed\":[%.2f,%.2f]}},"
      "\"load_average\":%.2f}\n",
      load_rig::C, load_rig::chunk_bytes(), W, reps, m(mem.fetch), m(mem.hand), m(mem.conn), m(mem.save),
      m(mem.plain_put), m(red.fetch), m(red.hand), m(red.conn), m(red.streamed), m(red.save),
      m(red.plain_put), fm(0, 0, &ft::forward_end), fm(0, 1, &ft::forward_end), fm(1, 0, &ft::forward_end),
      fm(1, 1, &ft::forward_end), fm(0, 0, &ft::first_layer), fm(0, 1, &ft::first_layer),
      fm(1, 0, &ft::first_layer), fm(1, 1, &ft::first_layer), kvtier_bench::load_average());
}
