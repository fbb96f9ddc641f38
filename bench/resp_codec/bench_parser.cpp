// bench_resp_parser: parse throughput of a pipelined stream of large bulk replies (default: batches
// of 8 GET replies of 12.4 MB), fed the way a socket loop feeds it (prepare, copy at most one
// read's worth from the "socket", commit, next). Three ways, alternating, medians of --reps:
//   dest     payloads read straight into registered destinations (the kvtier GET path);
//   string   no destination: each payload assembled into the reply's std::string;
//   memcpy   baseline: the same bytes copied in the same read sizes into the same buffers,
//            no parsing (what any client must at least do).
// Ratios are dest/memcpy and string/memcpy (1.0 = the parser costs nothing beyond the copy). The
// last line is one JSON object.
//
//   bench_resp_parser [--bytes B] [--batch K] [--read R] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvtier/resp/parser.hpp"

#include "../support/machine.hpp"
#include "../support/stats.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

std::size_t arg(int argc, char** argv, const char* name, std::size_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0)
      return static_cast<std::size_t>(std::strtoull(argv[i + 1], nullptr, 10));
  return fallback;
}

using kvtier_bench::median;

void fail(const char* what) {
  std::fprintf(stderr, "bench_resp_parser: %s\n", what);
  std::exit(1);
}

// Feeds `stream` through `p` in reads of at most `read` bytes into `out` (kept alive for the whole
// batch, as a caller would keep its values); returns replies parsed.
std::size_t run_parser(kvtier::resp::parser& p, const std::string& stream, std::size_t read,
                       std::vector<kvtier::resp::value>& out) {
  out.clear();
  std::size_t pos = 0;
  std::error_code ec;
  while (pos < stream.size()) {
    std::span<std::byte> into = p.prepare();
    const std::size_t n = std::min({into.size(), read, stream.size() - pos});
    std::memcpy(into.data(), stream.data() + pos, n);
    p.commit(n);
    pos += n;
    while (auto v = p.next(ec)) out.push_back(std::move(*v));
    if (ec) fail("parse error");
  }
  return out.size();
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t bytes = arg(argc, argv, "--bytes", 12400000);
  const std::size_t batch = std::max<std::size_t>(1, arg(argc, argv, "--batch", 8));
  const std::size_t read = std::max<std::size_t>(1, arg(argc, argv, "--read", 256 << 10));
  const std::size_t reps = std::max<std::size_t>(1, arg(argc, argv, "--reps", 15));

  // The pipelined reply stream, as the server would send it.
  std::string payload(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) payload[i] = static_cast<char>((i * 131) >> 3);
  std::string stream;
  const std::string header = "$" + std::to_string(bytes) + "\r\n";
  stream.reserve(batch * (header.size() + bytes + 2));
  for (std::size_t k = 0; k < batch; ++k) stream += header + payload + "\r\n";

  // Caller buffers, faulted in once so no variant pays the first-touch page faults.
  std::vector<std::string> dst(batch, std::string(bytes, '\x01'));

  std::vector<double> t_dest, t_string, t_copy;
  std::vector<kvtier::resp::value> values;
  kvtier::resp::parser p;
  for (std::size_t r = 0; r <= reps; ++r) {  // r == 0 warms up and is not recorded
    for (auto& d : dst) p.expect_destination(std::as_writable_bytes(std::span(d)));
    auto t0 = clock_type::now();
    if (run_parser(p, stream, read, values) != batch) fail("dest: wrong reply count");
    const double dest_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (dst[batch - 1] != payload) fail("dest: payload differs");

    t0 = clock_type::now();
    if (run_parser(p, stream, read, values) != batch) fail("string: wrong reply count");
    const double string_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (values[batch - 1].str != payload) fail("string: payload differs");
    values.clear();

    // Baseline: the same reads, copied header-less into the same destinations.
    t0 = clock_type::now();
    std::size_t pos = 0;
    for (std::size_t k = 0; k < batch; ++k) {
      pos += header.size();
      for (std::size_t off = 0; off < bytes;) {
        const std::size_t n = std::min(read, bytes - off);
        std::memcpy(dst[k].data() + off, stream.data() + pos, n);
        off += n;
        pos += n;
      }
      pos += 2;
    }
    const double copy_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (r == 0) continue;
    t_dest.push_back(dest_s);
    t_string.push_back(string_s);
    t_copy.push_back(copy_s);
  }

  const double total = static_cast<double>(batch * bytes);
  const double dest_gbps = total / median(t_dest) / 1e9;
  const double string_gbps = total / median(t_string) / 1e9;
  const double copy_gbps = total / median(t_copy) / 1e9;
  std::printf("stream: %zu bulk replies of %zu bytes, reads of %zu bytes, %zu repetitions, medians\n", batch,
              bytes, read, reps);
  std::printf("%-8s %8.2f GB/s  ratio %.3f  (payload straight into the caller's destinations)\n", "dest",
              dest_gbps, dest_gbps / copy_gbps);
  std::printf("%-8s %8.2f GB/s  ratio %.3f  (no destination: payload into the reply string)\n", "string",
              string_gbps, string_gbps / copy_gbps);
  std::printf("%-8s %8.2f GB/s  (baseline: memcpy of the same bytes, same read sizes)\n", "memcpy",
              copy_gbps);
  std::printf(
      "{\"bench\":\"resp_parser\",\"value_bytes\":%zu,\"batch\":%zu,\"read_bytes\":%zu,\"reps\":%zu,"
      "\"dest_gb_per_s\":%.3f,\"string_gb_per_s\":%.3f,\"memcpy_gb_per_s\":%.3f,"
      "\"ratio_dest_over_memcpy\":%.3f,\"ratio_string_over_memcpy\":%.3f,\"loadavg_1m\":%.2f}\n",
      bytes, batch, read, reps, dest_gbps, string_gbps, copy_gbps, dest_gbps / copy_gbps,
      string_gbps / copy_gbps, kvtier_bench::load_average());
  return 0;
}
