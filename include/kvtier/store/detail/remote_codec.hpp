// kvtier/store/detail/remote_codec.hpp: what every Redis-protocol store does per key, whatever
// the routing (one server: remote_store; a cluster: cluster_store): key names, the EXISTS / GET /
// SET commands with the value header and its parser gate, the verdict on each reply, counters and
// the last error in words.
//
//   kvtier::detail::remote_codec codec(ns);
//   kvtier::detail::remote_scratch s;
//   s.size_for(n);                              // before any add_get: the checks stay in place
//   codec.add_get(s, j, key, name, dst[i]);      // the j-th entry of this batch
//   ... execute s.batch ...
//   status[i] = codec.get_status(s.batch.reply(k), s, j, key, dst[i], where, name);
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "kvtier/store/remote_stats.hpp"
#include "kvtier/store/value_header.hpp"

namespace kvtier {

namespace detail {

/// A value's payload length: a span's size, or a length given as a number (a put in pieces).
template <class Value>
std::size_t payload_length(const Value& v) noexcept {
  if constexpr (std::is_integral_v<Value>)
    return v;
  else
    return v.size();
}

/// The payload lengths of values given in pieces (their sum per value).
inline std::vector<std::size_t> piece_lengths(
    std::span<const std::span<const std::span<const std::byte>>> values) {
  std::vector<std::size_t> lengths(values.size(), 0);
  for (std::size_t i = 0; i < values.size(); ++i)
    for (const auto& p : values[i]) lengths[i] += p.size();
  return lengths;
}

/// A batch and the per-entry buffers of one call on one connection (keep one per connection).
struct remote_scratch {
  resp::batch batch;
  std::vector<std::vector<std::byte>> headers;  ///< entry j's value header (size from the format)
  std::vector<std::span<std::byte>> parts;
  std::vector<value_check> checks;  ///< entry j's framing: header gate and running checksum
  std::vector<std::span<const std::byte>> out_parts;
  std::vector<std::span<const std::byte>> piece_parts;  ///< a put in pieces: the entry being added
  std::vector<std::string> names;                       ///< the entries' key names

  /// Room for n entries; call before adding any (the gates' addresses must not move).
  void size_for(std::size_t n) {
    batch.clear();
    headers.resize(n);
    parts.resize(2 * n);
    checks.resize(n);
    out_parts.resize(2 * n);
    names.resize(n);
  }
};

/// Per-key commands and verdicts shared by the Redis-protocol stores.
class remote_codec {
 public:
  /// `hash_tag` non-empty: every key name carries "{hash_tag}", so a cluster keeps them in one slot.
  /// `format`: the value format written and expected (value_header.hpp).
  explicit remote_codec(key_namespace ns, std::string hash_tag = {}, value_format format = value_format::v1())
      : ns_(std::move(ns)),
        fingerprint_(ns_.fingerprint()),
        format_(format),
        prefix_(key_prefix(ns_, hash_tag)) {}

  const key_namespace& ns() const noexcept { return ns_; }
  const value_format& format() const noexcept { return format_; }

  /// A get or put's argument check, before anything is sent: invalid_argument when the three
  /// spans differ in length or the format cannot frame one of `values` (version 2 with too many
  /// groups).
  template <class Span>
  std::error_code check_batch(std::span<const chunk_key> keys, std::span<const Span> values,
                              std::span<const chunk_status> status) const noexcept {
    bool ok = keys.size() == values.size() && keys.size() == status.size();
    for (std::size_t i = 0; ok && i < values.size(); ++i) ok = format_.valid_for(values[i].size());
    return ok ? std::error_code{} : make_error_code(errc::invalid_argument);
  }
  /// check_batch() of values given by their lengths (a put in pieces).
  std::error_code check_lengths(std::span<const chunk_key> keys, std::span<const std::size_t> lengths,
                                std::span<const chunk_status> status) const noexcept {
    bool ok = keys.size() == lengths.size() && keys.size() == status.size();
    for (std::size_t i = 0; ok && i < lengths.size(); ++i) ok = format_.valid_for(lengths[i]);
    return ok ? std::error_code{} : make_error_code(errc::invalid_argument);
  }
  /// A prehashed put's check: one digest per value, each of this store's format and its value's length.
  std::error_code check_digests(std::span<const std::span<const std::byte>> values,
                                std::span<const value_digest> digests) const noexcept {
    bool ok = values.size() == digests.size();
    for (std::size_t i = 0; ok && i < values.size(); ++i) ok = digests[i].fits(format_, values[i].size());
    return ok ? std::error_code{} : make_error_code(errc::invalid_argument);
  }
  /// check_digests() of values given by their lengths.
  std::error_code check_digests(std::span<const std::size_t> lengths,
                                std::span<const value_digest> digests) const noexcept {
    bool ok = lengths.size() == digests.size();
    for (std::size_t i = 0; ok && i < lengths.size(); ++i) ok = digests[i].fits(format_, lengths[i]);
    return ok ? std::error_code{} : make_error_code(errc::invalid_argument);
  }

  /// A put in pieces' argument check (check_lengths, and check_digests when there are digests);
  /// `lengths` gets each value's payload length, the sum of its pieces.
  std::error_code check_pieces(std::span<const chunk_key> keys, std::span<const value_pieces> values,
                               std::span<const value_digest> digests, std::span<const chunk_status> status,
                               std::vector<std::size_t>& lengths) const {
    if (keys.size() != values.size() || keys.size() != status.size())
      return make_error_code(errc::invalid_argument);
    lengths = piece_lengths(values);
    if (auto ec = check_lengths(keys, lengths, status)) return ec;
    return digests.empty() ? std::error_code{} : check_digests(lengths, digests);
  }

  /// The server-side key name of `key`.
  std::string key_text(const chunk_key& key) const { return remote_key_text(prefix_, key); }

  void add_exists(resp::batch& b, std::string_view name) const { b.add({"EXISTS", name}); }

  /// GET `name` as entry j of `s`: header into s.headers[j], payload into dst. The value's
  /// framing (s.checks[j]) rides on the parser's destination: it checks the header before any
  /// payload byte reaches dst, then folds each piece into the checksum as it lands there.
  void add_get(remote_scratch& s, std::size_t j, const chunk_key& key, std::string_view name,
               std::span<std::byte> dst) const {
    s.headers[j].resize(format_.header_size(dst.size()));
    s.parts[2 * j] = std::span<std::byte>(s.headers[j]);
    s.parts[2 * j + 1] = dst;
    s.checks[j].expect(format_, fingerprint_, key, dst.size());
    s.batch.add_into({"GET", name}, std::span<const std::span<std::byte>>(s.parts).subspan(2 * j, 2),
                     resp::destination_gate{&header_gate, &s.checks[j], &payload_landed});
  }

  /// GETRANGE of layer group g of `name` as entry j of `s` (a group-major read, remote_store::
  /// get_by_group): group 0 brings the header too (into `header`, checked by `check`'s gate before
  /// a payload byte reaches dst); a later group lands after an empty first part, passed only while
  /// the header `check` kept is ok, and feeds the same running checksum, so each group is compared
  /// with the checksum table of the header read with group 0. `check` and `header` are the key's,
  /// kept across the rounds; dst is the whole payload.
  void add_get_range(remote_scratch& s, std::size_t j, value_check& check, std::vector<std::byte>& header,
                     std::string_view name, std::span<std::byte> dst, std::size_t g) const {
    const std::size_t hdr = format_.header_size(dst.size());
    const std::size_t from = g == 0 ? 0 : hdr + format_.groups_end(dst.size(), g);
    const std::size_t last = hdr + format_.groups_end(dst.size(), g + 1) - 1;  // GETRANGE's end is inclusive
    s.parts[2 * j] = g == 0 ? std::span<std::byte>(header) : std::span<std::byte>();
    s.parts[2 * j + 1] = format_.group(dst, g);
    s.batch.add_into({"GETRANGE", name, std::to_string(from), std::to_string(last)},
                     std::span<const std::span<std::byte>>(s.parts).subspan(2 * j, 2),
                     resp::destination_gate{g == 0 ? &header_gate : &header_kept, &check, &payload_landed});
  }

  /// Verdict on the GETRANGE reply of group g (add_get_range): hit when groups [0, g] of the value
  /// are in dst and each matched the header's checksum; miss when the key is gone (GETRANGE of an
  /// absent key is an empty string; a stored value is never empty: it has a header); corrupt when
  /// the header is refused, the range came back with another length (the value was replaced by one
  /// of another length, or is shorter) or the group failed its checksum (e.g. the value was
  /// overwritten between two ranged reads). Counted once per key, like get_status: `last` says g is
  /// the key's last group (a hit then counts the value's hit and bytes).
  chunk_status range_status(const resp::value& r, const value_check& c, std::span<const std::byte> header,
                            const chunk_key& key, std::span<std::byte> dst, std::size_t g, bool last,
                            std::string_view where, std::string_view name) {
    if (r.is_null() || (r.kind == resp::type::bulk_string && r.length == 0 && !r.into_destination)) {
      bump(stats_.misses);
      return chunk_status::miss;
    }
    if (r.kind != resp::type::bulk_string) return key_error("GETRANGE", r, where, name);
    const std::size_t expected = format_.group(dst, g).size() + (g == 0 ? header.size() : 0);
    if (!r.into_destination && !r.refused_by_gate) {
      bump(stats_.wrong_length);
      return corrupt(where, name, key,
                     "group " + std::to_string(g) + ": GETRANGE returned " + std::to_string(r.length) +
                         " bytes, expected " + std::to_string(expected) + " (the value has another length)");
    }
    const header_check hc = check_value_header(format_, header, fingerprint_, key, dst.size());
    if (r.refused_by_gate || hc != header_check::ok) {
      bump(hc == header_check::wrong_length ? stats_.wrong_length : stats_.bad_header);
      return corrupt(where, name, key, "header: " + std::string(to_string(hc)));
    }
    const std::size_t end = format_.groups_end(dst.size(), g + 1);
    if (c.seen() != end || c.bad_group() != c.groups()) {
      bump(stats_.bad_checksum);
      return corrupt(where, name, key,
                     c.seen() != end
                         ? "group " + std::to_string(g) + " incomplete (" + std::to_string(c.seen()) +
                               " of " + std::to_string(end) + " bytes checked)"
                         : "checksum mismatch in group " + std::to_string(c.bad_group()) + " of " +
                               std::to_string(c.groups()) + " (read by range)");
    }
    if (last) {
      bump(stats_.hits);
      bump(stats_.bytes_fetched, dst.size());
    }
    return chunk_status::hit;
  }

  /// SET `name` to header + src as entry j of `s` (written from the caller's memory). With
  /// `digest` (src's checksums, computed by the caller: check_digests() accepted them) the header
  /// is written from it, with no pass over src; else src is hashed here, in full, before its
  /// first byte is sent: a source that changes while it is sent then fails its checksum
  /// (corrupt), never a mix that passes.
  void add_put(remote_scratch& s, std::size_t j, const chunk_key& key, std::string_view name,
               std::span<const std::byte> src, const value_digest* digest = nullptr) const {
    s.headers[j].resize(format_.header_size(src.size()));
    if (digest != nullptr)
      encode_value_header(*digest, fingerprint_, key, s.headers[j]);
    else
      encode_value_header(format_, fingerprint_, key, src, s.headers[j]);
    s.out_parts[2 * j] = std::span<const std::byte>(s.headers[j]);
    s.out_parts[2 * j + 1] = src;
    s.batch.add_with_payload({"SET", name},
                             std::span<const std::span<const std::byte>>(s.out_parts).subspan(2 * j, 2));
  }

  /// add_put() of a value of `length` bytes given in `pieces` (their concatenation), each written
  /// from where it lies. Without `digest` the pieces are hashed here, in full, first (as add_put).
  void add_put_pieces(remote_scratch& s, std::size_t j, const chunk_key& key, std::string_view name,
                      std::span<const std::span<const std::byte>> pieces, std::size_t length,
                      const value_digest* digest = nullptr) const {
    value_digest own;
    if (digest == nullptr) {
      value_hasher h;
      h.begin(format_, length);
      for (const auto& p : pieces) h.update(p);
      own = h.digest();
      digest = &own;
    }
    s.headers[j].resize(format_.header_size(length));
    encode_value_header(*digest, fingerprint_, key, s.headers[j]);
    s.piece_parts.clear();  // the batch copies the list: one list serves every entry
    s.piece_parts.push_back(std::span<const std::byte>(s.headers[j]));
    s.piece_parts.insert(s.piece_parts.end(), pieces.begin(), pieces.end());
    s.batch.add_with_payload({"SET", name}, s.piece_parts);
  }

  /// Verdict on an EXISTS reply. `where` names the server for the error text.
  chunk_status exists_status(const resp::value& r, std::string_view where, std::string_view name) {
    if (r.kind == resp::type::integer) return r.integer > 0 ? chunk_status::hit : chunk_status::miss;
    return key_error("EXISTS", r, where, name);
  }

  /// Verdict on a SET reply of `bytes` payload bytes.
  chunk_status put_status(const resp::value& r, std::size_t bytes, std::string_view where,
                          std::string_view name) {
    if (r.kind == resp::type::simple_string) {
      bump(stats_.bytes_stored, bytes);
      return chunk_status::stored;
    }
    return key_error("SET", r, where, name);  // e.g. OOM with maxmemory and noeviction
  }

  /// Verdict on a GET reply whose bytes went to s.headers[j] + dst (or did not). A corrupt
  /// value is counted and named in last_error(): the key, its chunk and why. `stored_bytes` (if
  /// set) gets the payload length of a stored value whose length differs from header + dst
  /// (stored_payload()); it is left alone otherwise.
  chunk_status get_status(const resp::value& r, const remote_scratch& s, std::size_t j, const chunk_key& key,
                          std::span<std::byte> dst, std::string_view where, std::string_view name,
                          std::size_t* stored_bytes = nullptr) {
    const std::span<const std::byte> header(s.headers[j]);
    if (r.is_null()) {
      bump(stats_.misses);
      return chunk_status::miss;
    }
    if (r.kind != resp::type::bulk_string) return key_error("GET", r, where, name);  // WRONGTYPE and the like
    if (!r.into_destination && !r.refused_by_gate) {  // stored length != header + dst: dst untouched
      // A version-1 value read by a version-2 store: another length, so refused here.
      const bool v1_value = format_.version != 1 && r.length == value_header::size + dst.size();
      bump(v1_value ? stats_.other_format : stats_.wrong_length);
      if (stored_bytes && !v1_value) *stored_bytes = stored_payload(r.length);
      return corrupt(where, name, key,
                     v1_value ? std::string("a version-1 value (this store reads version 2)")
                              : "stored length " + std::to_string(r.length) + ", expected " +
                                    std::to_string(header.size() + dst.size()) + " (header + payload)");
    }
    // The gate passed this header already (or refused it); checked again here so a hit never
    // rests on the parser alone.
    const header_check hc = check_value_header(format_, header, fingerprint_, key, dst.size());
    if (r.refused_by_gate || hc != header_check::ok) {  // refused: nothing was written to dst
      bump(hc == header_check::wrong_length ? stats_.wrong_length : stats_.bad_header);
      return corrupt(where, name, key, "header: " + std::string(to_string(hc)));
    }
    // The checksum ran while the payload landed in dst (s.checks[j]): no second pass.
    const value_check& c = s.checks[j];
    if (!c.payload_ok()) {
      bump(stats_.bad_checksum);
      return corrupt(where, name, key,
                     c.seen() != dst.size() ? "payload incomplete (" + std::to_string(c.seen()) + " of " +
                                                  std::to_string(dst.size()) + " bytes checked)"
                     : c.groups() == 1 ? std::string("payload checksum mismatch")
                                       : "checksum mismatch in group " + std::to_string(c.bad_group()) +
                                             " of " + std::to_string(c.groups()));
    }
    bump(stats_.hits);
    bump(stats_.bytes_fetched, dst.size());
    return chunk_status::hit;
  }

  /// The payload length that a stored value of `total` bytes (header + payload) has in this
  /// store's format, or SIZE_MAX when no payload length frames to `total`: what a get tells
  /// apart from a destination of another size (the value's length is all the reply says before
  /// it is discarded).
  std::size_t stored_payload(std::size_t total) const noexcept {
    std::size_t lo = 0, hi = total;  // P + header_size(P) grows with P where the format frames P
    if (format_.version != 1 && format_.group_bytes != 0)
      hi = static_cast<std::size_t>(
          std::min<std::uint64_t>(hi, value_format::max_groups * format_.group_bytes));
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (mid + format_.header_size(mid) < total)
        lo = mid + 1;
      else
        hi = mid;
    }
    return format_.valid_for(lo) && lo + format_.header_size(lo) == total ? lo : SIZE_MAX;
  }

  /// A key the call could not finish.
  static chunk_status unfinished(const std::error_code& ec) noexcept {
    return ec == errc::timeout ? chunk_status::timeout : chunk_status::error;
  }

  /// Counts a failed call and keeps its text.
  void count_call(const std::error_code& ec, std::string text) {
    if (!ec) return;
    bump(ec == errc::timeout ? stats_.timeouts : stats_.errors);
    note(std::move(text));
  }
  void count_redirect() noexcept { bump(stats_.redirects); }
  void count_retry() noexcept { bump(stats_.retries); }
  void count_refresh() noexcept { bump(stats_.map_refreshes); }

  /// Keeps `text` as the last error.
  void note(std::string text) {
    std::lock_guard<std::mutex> lock(error_mu_);
    last_error_ = std::move(text);
  }
  std::string last_error() const {
    std::lock_guard<std::mutex> lock(error_mu_);
    return last_error_;
  }

  remote_store_stats stats() const noexcept {
    remote_store_stats s;
    s.hits = load(stats_.hits);
    s.misses = load(stats_.misses);
    s.wrong_length = load(stats_.wrong_length);
    s.bad_header = load(stats_.bad_header);
    s.bad_checksum = load(stats_.bad_checksum);
    s.other_format = load(stats_.other_format);
    s.corrupt = s.wrong_length + s.bad_header + s.bad_checksum + s.other_format;
    s.timeouts = load(stats_.timeouts);
    s.errors = load(stats_.errors);
    s.bytes_fetched = load(stats_.bytes_fetched);
    s.bytes_stored = load(stats_.bytes_stored);
    s.redirects = load(stats_.redirects);
    s.retries = load(stats_.retries);
    s.map_refreshes = load(stats_.map_refreshes);
    return s;
  }

 private:
  struct counters {
    std::atomic<std::uint64_t> hits{0}, misses{0}, wrong_length{0}, bad_header{0}, bad_checksum{0},
        other_format{0}, timeouts{0}, errors{0}, bytes_fetched{0}, bytes_stored{0}, redirects{0}, retries{0},
        map_refreshes{0};
  };
  static void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
    c.fetch_add(n, std::memory_order_relaxed);
  }
  static std::uint64_t load(const std::atomic<std::uint64_t>& c) noexcept {
    return c.load(std::memory_order_relaxed);
  }

  // A key's error reply (or a reply of the wrong type): counted, and its text kept.
  chunk_status key_error(std::string_view command, const resp::value& r, std::string_view where,
                         std::string_view name) {
    bump(stats_.errors);
    std::string text(where);
    text += ": ";
    text += command;
    text += " ";
    text += name;
    text += ": ";
    text += r.is_error() ? r.str : "reply of type " + std::string(resp::to_string(r.kind));
    note(std::move(text));
    return chunk_status::error;
  }

  // A corrupt value: "<where>: GET <name> (chunk <32 hex digits>): corrupt: <why>" as the last error.
  chunk_status corrupt(std::string_view where, std::string_view name, const chunk_key& key,
                       const std::string& why) {
    std::string text(where);
    text += ": GET ";
    text += name;
    char hex[32];
    key.to_hex(hex);
    text += " (chunk ";
    text.append(hex, sizeof hex);
    text += "): corrupt: " + why;
    note(std::move(text));
    return chunk_status::corrupt;
  }

  static bool header_gate(void* context, std::span<const std::byte> header) noexcept {
    return static_cast<value_check*>(context)->header(header) == header_check::ok;
  }
  // A later group of a ranged read: its bytes are trusted only under the header read with group 0.
  static bool header_kept(void* context, std::span<const std::byte>) noexcept {
    return static_cast<value_check*>(context)->header_verdict() == header_check::ok;
  }
  static void payload_landed(void* context, std::span<const std::byte> piece) noexcept {
    static_cast<value_check*>(context)->payload(piece);
  }

  // "kvtier:<ns>:", or "kvtier:{<tag>}:<ns>:" with a hash tag; built once.
  static std::string key_prefix(const key_namespace& ns, const std::string& tag) {
    std::string p = remote_key_prefix(ns);
    if (!tag.empty()) p.insert(p.find(':') + 1, "{" + tag + "}:");
    return p;
  }

  key_namespace ns_;
  std::uint64_t fingerprint_;
  value_format format_;
  std::string prefix_;
  counters stats_;
  mutable std::mutex error_mu_;
  std::string last_error_;
};

}  // namespace detail
}  // namespace kvtier
