// libFuzzer target for the value header and its parser gate (kvtier/store/value_header.hpp),
// driven end to end through remote_store::get over an in-memory transport: the "server" answers
// a pipelined batch of GETs with values built from the input, delivered in pieces of a chosen
// size, so the header gate runs at every split of the 56 header bytes.
//
// Input: byte 0 picks the number of GETs (1..4) and the parser's buffer size, byte 1 the read
// piece size, byte 2 the namespace; then per GET a 4-byte record [mode, dst_len, a, b] followed by its bytes:
//   mode % 6 == 0: raw value: the next `a` bytes are stored verbatim;
//            == 1: a valid value of the next dst_len payload bytes, then byte a ^= b;
//            == 2: valid but for another key (the next GET's), byte a ^= b;
//            == 3: valid but written under another namespace;
//            == 4: missing key (null reply);
//            == 5: an error reply.
// Oracles, besides ASan/UBSan:
//  1. a GET is a hit exactly when its stored value is the canonical encoding of (namespace,
//     key, payload) with a payload of the destination's length (reference encoder below,
//     written from the documented layout, not with encode_value_header), and then the
//     destination holds that payload byte for byte;
//  2. a value whose header is refused, or whose length differs, leaves the destination
//     untouched; only a valid header with an altered payload may have written it (corrupt);
//  3. check_value_header() on the stored header agrees with a field-by-field reference check.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvtier/resp/connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "kvtier/store/value_header.hpp"

namespace {

using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::header_check;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_value_header: oracle failed: %s\n", what);
    std::abort();
  }
}

// What the in-memory server answers to the next batch, and the size of each read.
struct script {
  std::string replies;
  std::size_t piece = 1;
};
script g_script;

// Swallows the request, then delivers g_script.replies in pieces; no handshake is configured.
class memory_connection : public kvtier::resp::connection_base<memory_connection> {
 public:
  explicit memory_connection(kvtier::resp::connection_options opt) : connection_base(std::move(opt)) {}
  std::error_code transport_connect(kvtier::deadline) { return {}; }
  std::error_code transport_exchange(kvtier::deadline) {
    while (write_pending()) {
      std::size_t n = 0;
      for (const auto& s : write_buffers()) n += s.size();
      on_written(n);
    }
    const std::string& text = g_script.replies;
    std::size_t off = 0;
    while (!replies_done()) {
      if (off == text.size()) return on_read(0);  // EOF mid-batch
      const std::span<std::byte> into = read_span();
      const std::size_t n = std::min({into.size(), text.size() - off, g_script.piece});
      std::memcpy(into.data(), text.data() + off, n);
      off += n;
      if (std::error_code ec = on_read(n)) return ec;
    }
    return {};
  }
  void transport_close() noexcept {}
  bool transport_peer_closed() noexcept { return false; }
};

// Reference encoder from the documented layout (little-endian fields, XXH3-64 checksums).
void put_le(std::string& s, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
std::string reference_value(std::uint64_t ns, const chunk_key& k, std::string_view payload) {
  std::string s = "KVTH";
  put_le(s, 1, 2);
  put_le(s, 56, 2);
  put_le(s, ns, 8);
  put_le(s, k.hi, 8);
  put_le(s, k.lo, 8);
  put_le(s, payload.size(), 8);
  put_le(s, XXH3_64bits(payload.data(), payload.size()), 8);
  put_le(s, XXH3_64bits(s.data(), 48), 8);
  s += payload;
  return s;
}
std::uint64_t get_le(std::string_view s, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}
header_check reference_check(std::string_view h, std::uint64_t ns, const chunk_key& k, std::size_t len) {
  if (h.substr(0, 4) != "KVTH") return header_check::bad_magic;
  if (get_le(h, 4, 2) != 1 || get_le(h, 6, 2) != 56) return header_check::bad_version;
  if (get_le(h, 48, 8) != XXH3_64bits(h.data(), 48)) return header_check::header_corrupt;
  if (get_le(h, 8, 8) != ns) return header_check::wrong_namespace;
  if (get_le(h, 16, 8) != k.hi || get_le(h, 24, 8) != k.lo) return header_check::wrong_key;
  if (get_le(h, 32, 8) != len) return header_check::wrong_length;
  return header_check::ok;
}

struct reader {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  std::string_view take(std::size_t k) {
    k = std::min(k, n);
    std::string_view s(reinterpret_cast<const char*>(p), k);
    p += k;
    n -= k;
    return s;
  }
};

constexpr std::size_t piece_sizes[] = {1, 2, 3, 7, 17, 55, 56, 57, 64, 4096};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  const std::uint8_t b0 = in.byte();
  const std::size_t gets = 1 + b0 % 4;
  constexpr std::size_t buffers[] = {32, 64, 100, 4096};  // 32: the header line barely fits
  g_script.piece = piece_sizes[in.byte() % std::size(piece_sizes)];
  const kvtier::key_namespace ns{.model = "fuzz-" + std::to_string(in.byte())};
  const std::uint64_t fp = ns.fingerprint();

  std::vector<chunk_key> keys(gets);
  for (std::size_t i = 0; i < gets; ++i) keys[i] = chunk_key{0x1000 + i, 0x2000 + i * 7};

  struct expect {
    bool stored = false;  // a bulk reply (not null, not error)
    std::string value;    // the stored bytes
    std::string payload;  // the payload a hit must deliver
    bool hit = false;
  };
  std::vector<expect> want(gets);
  std::vector<std::vector<std::byte>> dst(gets);
  g_script.replies.clear();
  for (std::size_t i = 0; i < gets; ++i) {
    const std::uint8_t mode = in.byte() % 6;
    const std::size_t len = in.byte();
    const std::uint8_t a = in.byte(), b = in.byte();
    dst[i].assign(len, std::byte{0xa5});
    expect& w = want[i];
    if (mode == 4) {
      g_script.replies += "$-1\r\n";
      continue;
    }
    if (mode == 5) {
      g_script.replies += "-ERR fuzz\r\n";
      continue;
    }
    w.stored = true;
    if (mode == 0) {
      w.value = std::string(in.take(a));
    } else {
      const std::string_view payload = in.take(len);
      const chunk_key& k = mode == 2 ? keys[(i + 1) % gets] : keys[i];
      const std::uint64_t f = mode == 3 ? fp ^ 1 : fp;
      w.value = reference_value(f, k, payload);
      w.value[a % w.value.size()] ^= static_cast<char>(b);
    }
    w.hit =
        w.value.size() == kvtier::value_header::size + len &&
        w.value == reference_value(fp, keys[i], std::string_view(w.value).substr(kvtier::value_header::size));
    w.payload =
        w.value.size() >= kvtier::value_header::size ? w.value.substr(kvtier::value_header::size) : "";
    g_script.replies += "$" + std::to_string(w.value.size()) + "\r\n" + w.value + "\r\n";

    // Oracle 3: the header check alone, against the field-by-field reference.
    if (w.value.size() >= kvtier::value_header::size) {
      std::array<std::byte, kvtier::value_header::size> h;
      std::memcpy(h.data(), w.value.data(), h.size());
      check(kvtier::check_value_header(h, fp, keys[i], len) ==
                reference_check(std::string_view(w.value).substr(0, h.size()), fp, keys[i], len),
            "check_value_header disagrees with the reference check");
    }
  }

  kvtier::resp::connection_options opt;
  opt.health_check_idle = std::chrono::milliseconds(0);
  opt.limits.buffer_bytes = buffers[(b0 >> 2) % std::size(buffers)];
  kvtier::remote_store<memory_connection> store(ns, opt);
  std::vector<std::span<std::byte>> spans(dst.begin(), dst.end());
  std::vector<chunk_status> status(gets, chunk_status::hit);
  const std::error_code ec = store.get(keys, spans, status, kvtier::deadline_after(std::chrono::seconds(10)));
  check(!ec, "a well-formed reply stream failed the batch");

  for (std::size_t i = 0; i < gets; ++i) {
    const expect& w = want[i];
    const std::string_view got(reinterpret_cast<const char*>(dst[i].data()), dst[i].size());
    const bool untouched =
        std::all_of(dst[i].begin(), dst[i].end(), [](std::byte c) { return c == std::byte{0xa5}; });
    if (!w.stored) {
      check(status[i] != chunk_status::hit && untouched, "a null or error reply was a hit or wrote the span");
      continue;
    }
    // Oracle 1.
    check((status[i] == chunk_status::hit) == w.hit, "hit differs from the canonical-encoding oracle");
    if (w.hit) {
      check(got == w.payload, "a hit delivered other bytes than the stored payload");
      continue;
    }
    check(status[i] == chunk_status::corrupt, "a stored, refused value is not corrupt");
    // Oracle 2: only a value of the right length with a header that passes may touch the span.
    const bool header_ok = w.value.size() == kvtier::value_header::size + dst[i].size() &&
                           reference_check(std::string_view(w.value).substr(0, kvtier::value_header::size),
                                           fp, keys[i], dst[i].size()) == header_check::ok;
    if (!header_ok) check(untouched, "a refused header or a wrong length wrote the span");
  }
  return 0;
}
