// kvtier/metrics.hpp: cheap counters, gauges and latency histograms for the
// store and fetch-queue paths, and a writer for the Prometheus text format.
//
// Every update is one relaxed atomic operation (histograms: three), so the hot
// paths can record unconditionally. Components take an optional `metrics*`;
// one `metrics` object can be shared by all the stores and queues of a rank.
//
//   kvtier::metrics m;
//   kvtier::memory_store l1(8ull << 30);
//   kvtier::fetch_queue q(l1, {.metrics = &m});
//   ...
//   std::string text = kvtier::to_prometheus(m, "kvtier", "rank=\"3\"");
//   // kvtier_lookups_total{rank="3"} 1234 ...
//   kvtier::write_prometheus(text, l2.stats(), "kvtier_l2", "rank=\"3\"");  // a remote store's counters
//   // kvtier_l2_breaker_trips_total{rank="3"} 1   (a silent server tripped its breaker once)
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/chunk_status.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/store/remote_stats.hpp"

namespace kvtier {

/// A monotonically increasing count.
class counter {
 public:
  void add(std::uint64_t n = 1) noexcept { v_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> v_{0};
};

/// A value that goes up and down (queue depth, bytes in flight).
class gauge {
 public:
  void add(std::int64_t n) noexcept { v_.fetch_add(n, std::memory_order_relaxed); }
  void sub(std::int64_t n) noexcept { v_.fetch_sub(n, std::memory_order_relaxed); }
  void set(std::int64_t n) noexcept { v_.store(n, std::memory_order_relaxed); }
  std::int64_t value() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> v_{0};
};

/// Latency histogram with fixed bucket bounds from 10 us to ~84 s (x2 per
/// bucket), plus an overflow bucket. observe() is lock-free: it finds the bucket
/// with a bit scan, no loop over bounds.
class histogram {
 public:
  static constexpr std::size_t bucket_count = 24;  ///< finite buckets; one more for +Inf
  /// Upper bound of finite bucket i in seconds: 10 us * 2^i.
  static constexpr double upper_bound_seconds(std::size_t i) noexcept {
    return 10e-6 * static_cast<double>(std::uint64_t{1} << i);
  }

  void observe(clock::duration d) noexcept {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    const std::uint64_t u = ns > 0 ? static_cast<std::uint64_t>(ns) : 0;
    // bucket i holds (10us * 2^(i-1), 10us * 2^i]; bucket 0 holds [0, 10us].
    const std::uint64_t units = u == 0 ? 0 : (u - 1) / 10'000;  // whole 10-us steps below u
    std::size_t i = units == 0 ? 0 : static_cast<std::size_t>(std::bit_width(units));
    if (i > bucket_count) i = bucket_count;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(u, std::memory_order_relaxed);
  }

  std::uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }
  double sum_seconds() const noexcept {
    return static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  }
  /// Observations in bucket i alone (i == bucket_count is the overflow bucket).
  std::uint64_t bucket(std::size_t i) const noexcept { return buckets_[i].load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<std::uint64_t>, bucket_count + 1> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ns_{0};
};

/// Per-tier outcomes of store calls (exists and get), counted per key
/// (`stored`, a put's status, is not counted here: puts count bytes_written).
struct tier_metrics {
  counter hits, misses, corrupt, timeouts, errors;
  counter bytes_read, bytes_written;

  /// Counts `status` of one batched call.
  void record(std::span<const chunk_status> status) noexcept {
    std::uint64_t n[7] = {};  // one per chunk_status
    for (chunk_status s : status) ++n[static_cast<std::size_t>(s)];
    if (n[0]) hits.add(n[0]);
    if (n[1]) misses.add(n[1]);
    if (n[2]) corrupt.add(n[2]);
    if (n[3]) timeouts.add(n[3]);
    if (n[4]) errors.add(n[4]);
  }
};

/// All the figures of one rank's cache tier.
struct metrics {
  tier_metrics l1, l2;  ///< recorded by tiered_store (fetch_queue records only the request-level figures)

  counter lookups;           ///< lookup / prefetch requests completed
  counter loads;             ///< load requests completed
  counter chunks_requested;  ///< chunks in completed lookups and loads
  counter chunks_loaded;     ///< chunks inside reported loaded prefixes
  counter bytes_loaded;      ///< bytes inside reported loaded prefixes
  counter timeouts;          ///< requests whose store call ran out of time
  counter corrupt_values;    ///< chunks reported corrupt to a request
  counter cancelled;         ///< requests completed as cancelled
  counter rejected;          ///< submissions refused (queue_full, shutdown, invalid_argument)
  counter prefetch_reused;   ///< chunks a load took from a prefetch instead of the store
  counter puts;              ///< write-back (put) requests completed
  counter chunks_stored;     ///< chunks a completed put reported stored
  counter bytes_stored;      ///< bytes of those chunks

  gauge queue_depth;         ///< requests submitted and not yet picked up by a worker
  gauge requests_in_flight;  ///< requests submitted and not yet completed
  gauge bytes_in_flight;     ///< destination + prefetch staging bytes held by unfinished work

  histogram lookup_latency;  ///< submit to completion, lookups and prefetches
  histogram load_latency;    ///< submit to completion, loads
  histogram queue_wait;      ///< submit to a worker picking the request up
  histogram put_latency;     ///< submit to completion, puts
};

namespace detail {
inline void store_prom_line(std::string& out, std::string_view prefix, std::string_view name,
                            std::string_view labels, std::string_view extra_label, double value) {
  out += prefix;
  out += '_';
  out += name;
  if (!labels.empty() || !extra_label.empty()) {
    out += '{';
    out += labels;
    if (!labels.empty() && !extra_label.empty()) out += ',';
    out += extra_label;
    out += '}';
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", value);
  out += buf;
}
inline void store_prom_header(std::string& out, std::string_view prefix, std::string_view name,
                              std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += prefix;
  out += '_';
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += prefix;
  out += '_';
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

/// One histogram: its header, cumulative buckets, +Inf, _sum and _count.
inline void store_prom_histogram(std::string& out, std::string_view prefix, std::string_view name,
                                 std::string_view help, std::string_view labels, const histogram& h) {
  store_prom_header(out, prefix, name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  std::uint64_t cumulative = 0;
  char le[48];
  for (std::size_t i = 0; i < histogram::bucket_count; ++i) {
    cumulative += h.bucket(i);
    std::snprintf(le, sizeof le, "le=\"%.6g\"", histogram::upper_bound_seconds(i));
    store_prom_line(out, prefix, bucket, labels, le, static_cast<double>(cumulative));
  }
  cumulative += h.bucket(histogram::bucket_count);
  store_prom_line(out, prefix, bucket, labels, "le=\"+Inf\"", static_cast<double>(cumulative));
  store_prom_line(out, prefix, std::string(name) + "_sum", labels, {}, h.sum_seconds());
  store_prom_line(out, prefix, std::string(name) + "_count", labels, {}, static_cast<double>(h.count()));
}
}  // namespace detail

/// Appends `m` to `out` in the Prometheus text exposition format (version 0.0.4).
/// `prefix` starts every metric name; `labels` (e.g. `rank="3"`) is added to
/// every sample and must already be valid label syntax.
inline void write_prometheus(std::string& out, const metrics& m, std::string_view prefix = "kvtier",
                             std::string_view labels = {}) {
  using detail::store_prom_header;
  using detail::store_prom_line;
  auto simple = [&](std::string_view name, std::string_view type, std::string_view help, double v) {
    store_prom_header(out, prefix, name, type, help);
    store_prom_line(out, prefix, name, labels, {}, v);
  };
  auto tiers = [&](std::string_view name, std::string_view help, auto member) {
    store_prom_header(out, prefix, name, "counter", help);
    store_prom_line(out, prefix, name, labels, "tier=\"l1\"", static_cast<double>((m.l1.*member).value()));
    store_prom_line(out, prefix, name, labels, "tier=\"l2\"", static_cast<double>((m.l2.*member).value()));
  };
  auto hist = [&](std::string_view name, std::string_view help, const histogram& h) {
    detail::store_prom_histogram(out, prefix, name, help, labels, h);
  };

  tiers("tier_hits_total", "Keys found, per tier.", &tier_metrics::hits);
  tiers("tier_misses_total", "Keys not found, per tier.", &tier_metrics::misses);
  tiers("tier_corrupt_total", "Keys whose value failed its length or integrity check, per tier.",
        &tier_metrics::corrupt);
  tiers("tier_timeouts_total", "Keys not finished by their deadline, per tier.", &tier_metrics::timeouts);
  tiers("tier_errors_total", "Keys that failed with an I/O or server error, per tier.",
        &tier_metrics::errors);
  tiers("tier_read_bytes_total", "Payload bytes delivered by each tier.", &tier_metrics::bytes_read);
  tiers("tier_written_bytes_total", "Payload bytes stored into each tier.", &tier_metrics::bytes_written);
  auto c = [](const counter& x) { return static_cast<double>(x.value()); };
  auto g = [](const gauge& x) { return static_cast<double>(x.value()); };
  simple("lookups_total", "counter", "Lookup and prefetch requests completed.", c(m.lookups));
  simple("loads_total", "counter", "Load requests completed.", c(m.loads));
  simple("chunks_requested_total", "counter", "Chunks in completed lookups and loads.",
         c(m.chunks_requested));
  simple("chunks_loaded_total", "counter", "Chunks inside reported loaded prefixes.", c(m.chunks_loaded));
  simple("loaded_bytes_total", "counter", "Bytes inside reported loaded prefixes.", c(m.bytes_loaded));
  simple("request_timeouts_total", "counter", "Requests whose store call ran out of time.", c(m.timeouts));
  simple("corrupt_values_total", "counter", "Chunks reported corrupt to a request.", c(m.corrupt_values));
  simple("cancelled_total", "counter", "Requests completed as cancelled.", c(m.cancelled));
  simple("rejected_total", "counter", "Submissions refused (queue full, shutdown, invalid argument).",
         c(m.rejected));
  simple("prefetch_reused_chunks_total", "counter", "Chunks a load took from an earlier prefetch.",
         c(m.prefetch_reused));
  simple("puts_total", "counter", "Write-back (put) requests completed.", c(m.puts));
  simple("chunks_stored_total", "counter", "Chunks completed puts reported stored.", c(m.chunks_stored));
  simple("stored_bytes_total", "counter", "Bytes of the chunks completed puts reported stored.",
         c(m.bytes_stored));
  simple("queue_depth", "gauge", "Requests waiting for a worker.", g(m.queue_depth));
  simple("requests_in_flight", "gauge", "Requests submitted and not completed.", g(m.requests_in_flight));
  simple("bytes_in_flight", "gauge", "Destination and staging bytes held by unfinished work.",
         g(m.bytes_in_flight));
  hist("lookup_latency_seconds", "Lookup and prefetch latency, submit to completion.", m.lookup_latency);
  hist("load_latency_seconds", "Load latency, submit to completion.", m.load_latency);
  hist("put_latency_seconds", "Put (write-back) latency, submit to completion.", m.put_latency);
  hist("queue_wait_seconds", "Time from submit until a worker picks the request up.", m.queue_wait);
}

/// Appends a remote store's counters (remote_store, cluster_store: stats()) as Prometheus
/// counters `<prefix>_<name>_total`, among them down_refusals (calls refused at once while the
/// server was down) and breaker_trips (times a silent server tripped its breaker).
inline void write_prometheus(std::string& out, const remote_store_stats& s, std::string_view prefix = "kvtier_l2",
                             std::string_view labels = {}) {
  const auto counter = [&](std::string_view name, std::string_view help, std::uint64_t v) {
    const std::string full = std::string(name) + "_total";
    detail::store_prom_header(out, prefix, full, "counter", help);
    detail::store_prom_line(out, prefix, full, labels, {}, static_cast<double>(v));
  };
  counter("hits", "Values delivered verified.", s.hits);
  counter("misses", "Keys absent.", s.misses);
  counter("corrupt", "Values rejected by their length, header or checksum.", s.corrupt);
  counter("timeouts", "Calls that hit their deadline (refusals while down included).", s.timeouts);
  counter("errors", "Calls lost to connection or protocol errors, and error replies.", s.errors);
  counter("fetched_bytes", "Payload bytes of hits.", s.bytes_fetched);
  counter("stored_bytes", "Payload bytes of successful puts.", s.bytes_stored);
  counter("down_refusals", "Calls refused at once, without I/O, while their server was down.", s.down_refusals);
  counter("breaker_trips", "Times a server's breaker tripped on timeouts in a row.", s.breaker_trips);
}

/// write_prometheus() into a new string.
inline std::string to_prometheus(const metrics& m, std::string_view prefix = "kvtier",
                                 std::string_view labels = {}) {
  std::string out;
  write_prometheus(out, m, prefix, labels);
  return out;
}

}  // namespace kvtier
