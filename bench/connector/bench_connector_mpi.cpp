// bench_connector_mpi: the load path end to end across MPI processes (issue 20, "at the floor"),
// each rank against its own redis-server (started here), one prompt of 64 chunks x 2 MiB.
//
//   mpiexec -n 2 [--oversubscribe] [--allow-run-as-root] bench_connector_mpi [reps]   (default 7)
//
// Per round, interleaved (the order rotates), timed barrier to barrier on rank 0:
//   fetch       this rank's owned chunks through a fetch_queue into staging: the floor;
//   by hand     what a new user writes: lookup + all-reduce, fetch, chunk_broadcast (grouped, MPI
//               staged), kv_scatter into pages, one after another (each phase timed);
//   conn staged the connector, data communicator MPI staged (mpi_options default: every byte
//               through the communicator's memory on the way in and out);
//   conn direct the connector, data communicator with stage = false: the broadcast lands in the
//               connector's staging block (connector_options::data_writes_after_failure: a block
//               a failed move may still write is never reused).
// Both connectors: a control communicator for the step, a data communicator for the mover
// thread (MPI_THREAD_MULTIPLE). For each connector: the time this rank's own fetch ended (max over
// ranks) and what came after it; for every variant the CPU seconds of all ranks and their servers
// (getrusage + INFO cpu), a figure the machine's other load does not move much. Every variant's pages are
// checked byte for byte in the warm-up round. Then per round an engine's forward (forward_rows.hpp, as
// bench_connector's: load(), wait_for_layer(l) and a modeled 0 or 10 ms compute per layer, steps until
// the outcome; rank 0's times) through conn direct and through a streamed one (stream_groups,
// fetch_batch_chunks = 0, its own direct data communicator). Prints medians, connector / fetch alone,
// streamed / whole, the machine's load average, one JSON line.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "connector/forward_rows.hpp"
#include "connector/load_rig.hpp"
#include "kvtier/comm/mpi.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "support/machine.hpp"
#include "support/redis_server.hpp"
#include "support/stats.hpp"

using namespace kvtier;
using kvtier_bench::load_rig;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t0, clk::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}
double sum_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return m;
}

// CPU seconds of this process (every thread) plus its redis-server's (INFO cpu): what a load
// costs whatever else the machine runs.
double cpu_s(const kvtier::test::redis_server& srv) {
  return kvtier_bench::cpu_self_s() + kvtier_bench::server_cpu_s(srv);
}

comm::mpi_communicator make_comm(bool stage) {
  comm::mpi_communicator c;
  if (comm::mpi_communicator::create(c, MPI_COMM_WORLD, deadline_after(std::chrono::seconds(60)),
                                     {.thread_level = MPI_THREAD_MULTIPLE, .stage = stage})) {
    std::fprintf(stderr, "bench_connector_mpi: %s\n", c.last_error().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return c;
}

enum variant : int { fetch, hand, staged, direct, n_variants };
const char* const names[n_variants] = {"fetch alone", "by hand", "conn staged", "conn direct"};

struct samples {
  std::vector<double> total[n_variants], cpu[n_variants];    // cpu: CPU-s, every rank and server
  std::vector<double> hand_fetch, hand_bcast, hand_scatter;  // by hand's phases (rank 0)
  std::vector<double> fetched[n_variants];                   // connectors: own fetch ended (max)
  kvtier_bench::forward_samples forward;                     // rank 0's forwards
};

// Everything MPI lives in here, so it is gone before MPI_Finalize.
int run(int reps) {
  int r_int = 0, w_int = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r_int);
  MPI_Comm_size(MPI_COMM_WORLD, &w_int);
  const auto r = static_cast<rank_t>(r_int), W = static_cast<rank_t>(w_int);
  const load_rig rig(W);
  const std::size_t T = load_rig::T, C = load_rig::C, bytes = load_rig::chunk_bytes();

  kvtier::test::redis_server srv({.extra_args = {"--save", "", "--appendonly", "no"}});  // this rank's own
  remote_store<resp::asio_connection> store(
      rig.ns, resp::connection_options{.server = resp::parse_url(srv.url()).value},
      value_format::v2(layer_group_bytes(load_rig::layout(), T, load_rig::layers_per_group)));
  rig.put_owned(store, r);

  comm::mpi_communicator ctrl = make_comm(true), hand_data = make_comm(true), data_staged = make_comm(true),
                         data_direct = make_comm(false), data_streamed = make_comm(false);
  host_kv_cache cache(load_rig::layout());
  host_kv_cache::sequence seq;
  cache.reserve(seq, rig.prompt.size());
  const auto slots = slots_from_block_table({seq.blocks, 0, rig.prompt.size()}, load_rig::page);
  std::vector<std::byte> staging(C * bytes);
  std::vector<std::span<std::byte>> chunk_kv;
  for (std::size_t k = 0; k < C; ++k) chunk_kv.push_back(std::span(staging).subspan(k * bytes, bytes));
  fetch_queue<remote_store<resp::asio_connection>> queue(store, {.workers = 2, .max_batch_chunks = 1});
  rank_view view(store, rig.own, r, rig.ns);
  connector conn_staged(rig.chunk, rig.own, store, ctrl, data_staged, cache.view(),
                        load_rig::connector_options());
  connector_options direct_opt = load_rig::connector_options();
  direct_opt.data_writes_after_failure = true;  // MPI stage = false may write after a failed call
  connector conn_direct(rig.chunk, rig.own, store, ctrl, data_direct, cache.view(), direct_opt);
  connector_options streamed_opt = direct_opt;
  streamed_opt.stream_groups = true;
  streamed_opt.fetch_batch_chunks = 0;
  connector conn_streamed(rig.chunk, rig.own, store, ctrl, data_streamed, cache.view(), streamed_opt);
  const auto dl = [] { return deadline_after(std::chrono::seconds(30)); };

  samples s;
  std::size_t wrong = 0, short_loads = 0;
  request_id next_id = 1000;
  for (int round = 0; round <= reps; ++round) {  // round 0 warms up (and checks bytes), dropped
    for (int k = 0; k < n_variants; ++k) {
      const auto v = variant((k + round) % n_variants);
      const request_id id = next_id++;
      if (round == 0) load_rig::clear(cache.view(), slots);
      const double cpu0 = cpu_s(srv);
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = clk::now();
      clk::time_point fetched{}, t_fetch{}, t_bcast{};
      std::uint64_t got = 0;
      if (v == fetch || v == hand) {
        std::uint64_t hit = C * T;
        if (v == hand) {
          hit = view.lookup(rig.keys, rig.prompt.size(), dl()).answer_tokens;
          comm::all_reduce_value(ctrl, hit, comm::reduce_op::min, dl());
        }
        std::vector<std::span<std::byte>> dst;
        for (std::size_t c : view.owned_chunks(C)) dst.push_back(chunk_kv[c]);
        auto h = queue.submit(id, view.owned_keys(rig.keys), dst,
                              chunk_layout::owned(view.owned_starts(C), C * T), dl());
        const std::uint64_t loaded = queue.wait(h, dl())->answer_tokens;
        got = loaded;
        t_fetch = clk::now();
        if (v == hand) {
          chunk_span_buffers bufs;
          for (std::size_t c = 0; c < hit / T; ++c)
            bufs.sources.push_back(chunk_kv[c]), bufs.destinations.push_back(chunk_kv[c]);
          const broadcast_params p{.n_chunks = hit / T,
                                   .chunk_tokens = T,
                                   .chunk_bytes = bytes,
                                   .mode = broadcast_mode::grouped,
                                   .request_id = id};
          const broadcast_result b = chunk_broadcast(ctrl, hand_data, rig.own, loaded, bufs, p, dl());
          t_bcast = clk::now();
          for (std::size_t c = 0; c < b.agreed_chunks; ++c)
            kv_scatter(cache.view(), std::span<const std::int64_t>(slots).subspan(c * T, T), chunk_kv[c]);
          got = b.agreed_tokens;
        }
      } else {
        auto& conn = v == staged ? conn_staged : conn_direct;
        got = kvtier_bench::connector_load(conn, id, rig.prompt, slots, &fetched);
      }
      const auto t_end = clk::now();
      MPI_Barrier(MPI_COMM_WORLD);
      const double total = seconds_since(t0, clk::now());
      const double cpu = sum_over_ranks(cpu_s(srv) - cpu0);
      const double fetched_s = v >= staged ? max_over_ranks(seconds_since(t0, fetched)) : 0;
      if (got != C * T) ++short_loads;
      if (round == 0 && v != fetch) wrong += rig.wrong_chunks(cache.view(), slots);
      if (round == 0) continue;
      s.total[v].push_back(total);
      s.cpu[v].push_back(cpu);
      if (v >= staged) s.fetched[v].push_back(fetched_s);
      if (v == hand) {
        s.hand_fetch.push_back(seconds_since(t0, t_fetch));
        s.hand_bcast.push_back(seconds_since(t_fetch, t_bcast));
        s.hand_scatter.push_back(seconds_since(t_bcast, t_end));
      }
    }
    const auto n = kvtier_bench::forward_round(
        conn_direct, conn_streamed, 100000 + 8 * round, rig, cache.view(), slots, true, round == 0,
        [] { MPI_Barrier(MPI_COMM_WORLD); }, r == 0 && round > 0 ? &s.forward : nullptr);
    wrong += n.wrong, short_loads += n.short_loads;
  }
  std::size_t all_wrong = 0, all_short = 0;
  MPI_Allreduce(&wrong, &all_wrong, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&short_loads, &all_short, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (r == 0) {
    using kvtier_bench::median;
    const auto ms = [](const std::vector<double>& v) { return median(v) * 1e3; };
    const double f = ms(s.total[fetch]), load = kvtier_bench::load_average();
    std::printf(
        "bench_connector_mpi: %zu chunks x %.2f MiB, W = %u processes, own redis-server each, "
        "%d reps (medians), load average %.2f\n",
        C, bytes / 1048576.0, W, reps, load);
    const double fc = ms(s.cpu[fetch]);
    std::printf("  fetch alone  %7.1f ms, CPU %6.1f ms\n", f, fc);
    std::printf(
        "  by hand      %7.1f ms, CPU %6.1f ms  (fetch %.1f, chunk_broadcast %.1f, scatter %.1f)  "
        "/ fetch %.2fx, CPU %.2fx\n",
        ms(s.total[hand]), ms(s.cpu[hand]), ms(s.hand_fetch), ms(s.hand_bcast), ms(s.hand_scatter),
        ms(s.total[hand]) / f, ms(s.cpu[hand]) / fc);
    for (variant v : {staged, direct})
      std::printf(
          "  %s  %7.1f ms, CPU %6.1f ms  (own fetches ended at %.1f, then %.1f)  / fetch %.2fx, CPU %.2fx\n",
          names[v], ms(s.total[v]), ms(s.cpu[v]), ms(s.fetched[v]), ms(s.total[v]) - ms(s.fetched[v]),
          ms(s.total[v]) / f, ms(s.cpu[v]) / fc);
    kvtier_bench::print_forward("  direct", s.forward);
    std::printf("  wrong chunks in pages (warm-up check): %zu; loads cut short: %zu\n", all_wrong, all_short);
    using ft = kvtier_bench::forward_times;
    const auto fm = [&](int mode, std::size_t ci, double ft::*m) {
      return kvtier_bench::forward_median(s.forward.v[mode][ci], m) * 1e3;
    };
    std::printf(
        "{\"bench\":\"connector_mpi\",\"chunks\":%zu,\"chunk_bytes\":%zu,\"ranks\":%u,\"reps\":%d,"
        "\"load_average\":%.2f,\"fetch_ms\":%.2f,\"hand_ms\":%.2f,\"hand_fetch_ms\":%.2f,"
        "\"hand_broadcast_ms\":%.2f,\"hand_scatter_ms\":%.2f,\"staged_ms\":%.2f,\"direct_ms\":%.2f,"
        "\"staged_over_fetch\":%.3f,\"direct_over_fetch\":%.3f,\"cpu_ms\":{\"fetch\":%.1f,\"hand\":%.1f,"
        "\"staged\":%.1f,\"direct\":%.1f},\"forward_end_ms\":{\"whole\":[%.2f,%.2f],\"streamed\":[%.2f,%.2f]}"
        ","
        "\"first_layer_ms\":{\"whole\":[%.2f,%.2f],\"streamed\":[%.2f,%.2f]},\"wrong_chunks\":%zu,"
        "\"short_loads\":%zu}\n",
        C, bytes, W, reps, load, f, ms(s.total[hand]), ms(s.hand_fetch), ms(s.hand_bcast), ms(s.hand_scatter),
        ms(s.total[staged]), ms(s.total[direct]), ms(s.total[staged]) / f, ms(s.total[direct]) / f, fc,
        ms(s.cpu[hand]), ms(s.cpu[staged]), ms(s.cpu[direct]), fm(0, 0, &ft::forward_end),
        fm(0, 1, &ft::forward_end), fm(1, 0, &ft::forward_end), fm(1, 1, &ft::forward_end),
        fm(0, 0, &ft::first_layer), fm(0, 1, &ft::first_layer), fm(1, 0, &ft::first_layer),
        fm(1, 1, &ft::first_layer), all_wrong, all_short);
  }
  return all_wrong || all_short ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 2;
  const int rc = run(argc > 1 ? std::max(1, std::atoi(argv[1])) : 7);
  MPI_Finalize();
  return rc;
}
