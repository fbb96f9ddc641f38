// bench_layer_groups: how the connector should store a chunk so that it can load it layer group
// by layer group (issue 20): one value per chunk read with GETRANGE per group, or one key per
// group, against today's one GET per chunk, on one real redis-server this benchmark starts.
//
//   bench_layer_groups [--reps N] [--passes P] [--quick]
//
// Layouts, every value checked (header, then each group's XXH3-64) exactly as a reader would:
//   whole      one value per chunk (format 2 header: one checksum per group), one GET per chunk,
//              chunk after chunk (the connector today): group 0 of every chunk is in only when
//              the last chunk landed;
//   getrange   the same stored value, read GETRANGE per group, group-major (group 0 of every
//              chunk first): the header rides with group 0 (two destination parts);
//   per-group  one key per group ("<chunk>:<g>", format 1: header + that group), GET per key,
//              group-major.
//   store GET / store GETRANGE  the library's own paths, through a remote_store (its pool and
//              batch spread, every chunk in one call): remote_store::get (whole values) against
//              remote_store::get_by_group (group-major GETRANGE, group 0 of every chunk reported
//              by its per-round callback). Their set columns repeat whole's (the same values).
// Every layout moves one chunk's bytes per pipelined batch on one kvtier asio_connection (the
// fetch queue's granularity). Per layout: GB/s, redis-server CPU-s/GB (INFO cpu before and
// after), client CPU-s/GB (getrusage), and ms until group 0 of every chunk is in (when a layer-by-
// layer engine can start). Writes too: one SET per chunk against G SETs. Rounds interleave the
// layouts (the order rotates), medians over --reps, ratios against whole GET and getrange against
// per-group. The last stdout line is one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "kvtier/store/value_header.hpp"
#include "support/machine.hpp"
#include "support/redis_server.hpp"
#include "support/stats.hpp"

namespace {

using namespace kvtier;
using kvtier_bench::cpu_self_s;
using kvtier_bench::load_average;
using kvtier_bench::server_cpu_s;
using clk = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(clk::now().time_since_epoch()).count(); }

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "bench_layer_groups: %s\n", why.c_str());
  std::exit(1);
}

constexpr std::uint64_t fingerprint = 0x6b76746965726c67ull;  // any fixed namespace

// One shape: N chunks of `bytes`, G groups each (bytes divisible by G: layer-major, whole layers).
struct shape {
  const char* name;
  std::size_t bytes, groups, chunks;
};

enum layout : int { whole, getrange, per_group, store_get, store_ranges, n_layouts };
const char* const layout_names[n_layouts] = {"whole GET", "GETRANGE", "per-group keys", "store GET",
                                             "store GETRANGE"};

struct cell {
  std::vector<double> gbps, server, client, first_group_ms;
};

class bench {
 public:
  bench(const kvtier::test::redis_server& srv, const shape& s)
      : srv_(srv),
        s_(s),
        group_(s.bytes / s.groups),
        f2_(value_format::v2(group_)),
        conn_(resp::connection_options{.server = resp::parse_url(srv.url()).value}),
        store_(key_namespace{.model = "bench-layer-groups", .kv_format = "raw", .chunk_tokens = 256},
               resp::connection_options{.server = resp::parse_url(srv.url()).value}, f2_) {
    if (s.bytes % s.groups || s.chunks % s.groups)
      fail(std::string(s.name) + ": groups must divide bytes and chunks");
    for (std::size_t c = 0; c < s.chunks; ++c) {
      keys_.push_back(chunk_key{0x1234 + c, 0x9876 * (c + 1)});
      names_.push_back("lg:" + std::to_string(c));
      std::vector<std::byte> v(s.bytes);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::byte((i * 2654435761u >> 13) + c * 7);
      source_.push_back(std::move(v));
    }
    dst_.assign(s.chunks, std::vector<std::byte>(s.bytes));
    hdr2_.assign(s.chunks, std::vector<std::byte>(f2_.header_size(s.bytes)));
    hdr1_.assign(s.chunks * s.groups, value_header_bytes{});
    write(whole);
    write(per_group);
    std::vector<std::span<const std::byte>> src(source_.begin(), source_.end());
    std::vector<chunk_status> st(s.chunks);
    if (store_.put(keys_, src, st, deadline_after(std::chrono::seconds(60))) ||
        std::count(st.begin(), st.end(), chunk_status::stored) != static_cast<std::ptrdiff_t>(s.chunks))
      fail("remote_store put: " + store_.last_error());
  }

  // SET every chunk in `l`'s layout (getrange shares whole's values). Returns bytes written.
  void write(layout l) {
    resp::batch b;
    for (std::size_t c = 0; c < s_.chunks; ++c) {
      b.clear();
      const std::span<const std::byte> payload(source_[c]);
      if (l == per_group) {
        for (std::size_t g = 0; g < s_.groups; ++g) {
          const auto part = f2_.group(payload, g);
          hdr1_[c * s_.groups + g] = encode_value_header(fingerprint, group_key(c, g), part);
          const std::span<const std::byte> parts[] = {hdr1_[c * s_.groups + g], part};
          const std::string k = names_[c] + ":" + std::to_string(g);
          b.add_with_payload({"SET", k}, parts);
        }
      } else {
        encode_value_header(f2_, fingerprint, keys_[c], payload, hdr2_[c]);
        const std::span<const std::byte> parts[] = {hdr2_[c], payload};
        b.add_with_payload({"SET", names_[c]}, parts);
      }
      execute(b, "SET");
    }
  }

  // Reads every chunk in layout `l` into dst_, checking each value; returns the seconds until
  // group 0 of every chunk was in.
  double read(layout l) {
    resp::batch b;
    const double t0 = now_s();
    double first_group = 0;
    if (l == store_get || l == store_ranges) {
      std::vector<std::span<std::byte>> dst(dst_.begin(), dst_.end());
      std::vector<chunk_status> st(s_.chunks);
      const deadline dl = deadline_after(std::chrono::seconds(60));
      const std::error_code ec =
          l == store_get ? store_.get(keys_, dst, st, dl)
                         : store_.get_by_group(keys_, dst, st, dl, [&](std::span<const std::size_t>) {
                             if (first_group == 0) first_group = now_s() - t0;  // round 0: group 0 of all
                           });
      if (ec || std::count(st.begin(), st.end(), chunk_status::hit) != static_cast<std::ptrdiff_t>(s_.chunks))
        fail(std::string(layout_names[l]) + ": " + (ec ? ec.message() : "a chunk missed") + " (" +
             store_.last_error() + ")");
      return l == store_get ? now_s() - t0 : first_group;
    }
    if (l == whole) {
      for (std::size_t c = 0; c < s_.chunks; ++c) {
        b.clear();
        const std::span<std::byte> parts[] = {hdr2_[c], dst_[c]};
        b.add_into({"GET", names_[c]}, parts);
        execute(b, "GET");
        if (check_value_header(f2_, hdr2_[c], fingerprint, keys_[c], s_.bytes) != header_check::ok ||
            first_bad_group(f2_, hdr2_[c], dst_[c]) != s_.groups)
          fail("whole: chunk " + std::to_string(c) + " failed its check");
      }
      return now_s() - t0;  // group 0 of the last chunk lands with the rest of it
    }
    // Group-major: batch k holds group g of chunks [c0, c0 + G), one chunk's bytes per batch.
    for (std::size_t g = 0; g < s_.groups; ++g) {
      for (std::size_t c0 = 0; c0 < s_.chunks; c0 += s_.groups) {
        b.clear();
        std::vector<std::string> args;
        for (std::size_t c = c0; c < c0 + s_.groups; ++c) {
          const std::span<std::byte> part = f2_.group(std::span<std::byte>(dst_[c]), g);
          if (l == getrange) {
            const std::size_t from = g == 0 ? 0 : hdr2_[c].size() + g * group_,
                              to = hdr2_[c].size() + g * group_ + part.size() - 1;
            const std::string a = std::to_string(from), z = std::to_string(to);
            if (g == 0) {
              const std::span<std::byte> parts[] = {hdr2_[c], part};
              b.add_into({"GETRANGE", names_[c], a, z}, parts);
            } else {
              b.add_into({"GETRANGE", names_[c], a, z}, part);
            }
          } else {
            const std::span<std::byte> parts[] = {hdr1_[c * s_.groups + g], part};
            b.add_into({"GET", names_[c] + ":" + std::to_string(g)}, parts);
          }
        }
        execute(b, l == getrange ? "GETRANGE" : "GET");
        for (std::size_t c = c0; c < c0 + s_.groups; ++c) check_group(l, c, g);
      }
      if (g == 0) first_group = now_s() - t0;
    }
    return first_group;
  }

  // Once, untimed: every layout's bytes equal the source.
  void verify(layout l) {
    for (auto& d : dst_) std::fill(d.begin(), d.end(), std::byte{0});
    read(l);
    for (std::size_t c = 0; c < s_.chunks; ++c)
      if (dst_[c] != source_[c])
        fail(std::string(layout_names[l]) + ": chunk " + std::to_string(c) + " differs");
  }

  const shape& dims() const { return s_; }

 private:
  chunk_key group_key(std::size_t c, std::size_t g) const { return {keys_[c].hi, keys_[c].lo ^ (g + 1)}; }

  void check_group(layout l, std::size_t c, std::size_t g) {
    const auto part = f2_.group(std::span<const std::byte>(dst_[c]), g);
    bool ok;
    if (l == getrange) {
      ok = (g != 0 ||
            check_value_header(f2_, hdr2_[c], fingerprint, keys_[c], s_.bytes) == header_check::ok) &&
           group_matches(hdr2_[c], g, part);
    } else {
      const auto& h = hdr1_[c * s_.groups + g];
      ok = check_value_header(h, fingerprint, group_key(c, g), part.size()) == header_check::ok &&
           payload_matches(h, part);
    }
    if (!ok)
      fail(std::string(layout_names[l]) + ": chunk " + std::to_string(c) + " group " + std::to_string(g) +
           " failed its check");
  }

  void execute(resp::batch& b, const char* what) {
    const std::error_code ec = conn_.execute(b, deadline_after(std::chrono::seconds(30)));
    if (ec) fail(std::string(what) + ": " + ec.message() + " (" + conn_.last_error() + ")");
    for (std::size_t i = 0; i < b.completed(); ++i)
      if (b.reply(i).is_error()) fail(std::string(what) + ": server error reply");
  }

  const kvtier::test::redis_server& srv_;
  shape s_;
  std::size_t group_;
  value_format f2_;
  resp::asio_connection conn_;
  remote_store<resp::asio_connection> store_;
  std::vector<chunk_key> keys_;
  std::vector<std::string> names_;
  std::vector<std::vector<std::byte>> source_, dst_, hdr2_;
  std::vector<value_header_bytes> hdr1_;
};

double gb_of(const shape& s, int passes) {
  return static_cast<double>(s.bytes) * static_cast<double>(s.chunks) * passes / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, passes = 3;
  std::vector<shape> shapes = {{"2MiB/4", 2u << 20, 4, 32},
                               {"2MiB/8", 2u << 20, 8, 32},
                               {"12.4MB/4", 12'402'688, 4, 8},
                               {"12.4MB/8", 12'402'688, 8, 8}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      reps = 3, passes = 1;
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--passes" && i + 1 < argc) {
      passes = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_layer_groups [--reps N] [--passes P] [--quick]\n");
      return 2;
    }
  }
  kvtier::test::redis_server srv({.extra_args = {"--save", "", "--appendonly", "no"}});
  std::printf(
      "bench_layer_groups: one redis-server, one connection, %d reps x %d passes (medians), load %.2f\n",
      reps, passes, load_average());
  std::printf("%-9s %-15s %8s %12s %12s %14s | %8s %10s\n", "shape", "layout", "GB/s", "srv CPU-s/GB",
              "cli CPU-s/GB", "group 0 in ms", "set GB/s", "set srv/GB");
  std::string json = "{\"bench\":\"layer_groups\",\"reps\":" + std::to_string(reps) +
                     ",\"passes\":" + std::to_string(passes) + ",\"shapes\":[";
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const shape& s = shapes[si];
    cell read[n_layouts], set[n_layouts];
    {
      bench b(srv, s);
      for (int l = 0; l < n_layouts; ++l) b.verify(layout(l));
      const double gb = gb_of(s, passes);
      for (int rep = 0; rep < reps; ++rep) {
        for (int k = 0; k < n_layouts; ++k) {
          const auto l = layout((k + rep) % n_layouts);
          double first = 0;
          const double s0 = server_cpu_s(srv), c0 = cpu_self_s(), t0 = now_s();
          for (int p = 0; p < passes; ++p) first += b.read(l);
          const double t1 = now_s(), c1 = cpu_self_s(), s1 = server_cpu_s(srv);
          read[l].gbps.push_back(gb / (t1 - t0));
          read[l].server.push_back((s1 - s0) / gb);
          read[l].client.push_back((c1 - c0) / gb);
          read[l].first_group_ms.push_back(first / passes * 1e3);
          if (l == getrange || l >= store_get) continue;  // they read what whole writes
          const double w0 = server_cpu_s(srv), wt0 = now_s();
          for (int p = 0; p < passes; ++p) b.write(l);
          const double wt1 = now_s(), w1 = server_cpu_s(srv);
          set[l].gbps.push_back(gb / (wt1 - wt0));
          set[l].server.push_back((w1 - w0) / gb);
        }
      }
    }
    srv.call({"FLUSHALL"});
    using kvtier_bench::median;
    json += std::string(si ? "," : "") + "{\"shape\":\"" + s.name +
            "\",\"chunk_bytes\":" + std::to_string(s.bytes) + ",\"groups\":" + std::to_string(s.groups) +
            ",\"chunks\":" + std::to_string(s.chunks);
    for (int l = 0; l < n_layouts; ++l) {
      const int w = l == getrange || l >= store_get ? whole : l;
      std::printf("%-9s %-15s %8.2f %12.3f %12.3f %14.1f | %8.2f %10.3f\n", s.name, layout_names[l],
                  median(read[l].gbps), median(read[l].server), median(read[l].client),
                  median(read[l].first_group_ms), median(set[w].gbps), median(set[w].server));
      static const char* const ids[] = {"whole", "getrange", "per_group", "store_get", "store_ranges"};
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    ",\"%s\":{\"gbps\":%.3f,\"server_cpu_s_per_gb\":%.4f,\"client_cpu_s_per_gb\":%.4f,"
                    "\"group0_ms\":%.2f,\"set_gbps\":%.3f,\"set_server_cpu_s_per_gb\":%.4f}",
                    ids[l], median(read[l].gbps), median(read[l].server), median(read[l].client),
                    median(read[l].first_group_ms), median(set[w].gbps), median(set[w].server));
      json += buf;
    }
    json += "}";
    const double gw = median(read[whole].gbps), gr = median(read[getrange].gbps),
                 gp = median(read[per_group].gbps);
    const double sw = median(read[whole].server), sr = median(read[getrange].server),
                 sp = median(read[per_group].server);
    std::printf(
        "%-9s ratios: GB/s getrange/whole %.2fx, per-group/whole %.2fx, getrange/per-group %.2fx; "
        "server CPU/GB getrange/whole %.2fx, per-group/whole %.2fx, getrange/per-group %.2fx\n",
        s.name, gr / gw, gp / gw, gr / gp, sr / sw, sp / sw, sr / sp);
    std::printf("%-9s store: GB/s GETRANGE/GET %.2fx, group 0 in GETRANGE/GET %.2fx\n", s.name,
                median(read[store_ranges].gbps) / median(read[store_get].gbps),
                median(read[store_ranges].first_group_ms) / median(read[store_get].first_group_ms));
  }
  std::printf("%s],\"load_average\":%.2f}\n", json.c_str(), load_average());
}
