// libFuzzer target for kvtier::resp::parser.
//
// Input: an 8-byte header that picks the limits, the destinations and the read splits, then the
// bytes of the stream (shorter inputs use defaults). Oracles, besides ASan/UBSan:
//  1. the stream parsed whole without destinations, and parsed again in random pieces with
//     destinations, gives the same replies and the same error (destination replies compared by
//     the bytes that landed in the destination);
//  2. no read loop gets stuck (prepare() empty after next());
//  3. every parsed reply serializes and parses back to itself;
//  4. with destination gates (header byte 7, bit 0): a gate runs exactly once per reply of the
//     destination's length, before any byte reaches a later part; a refused reply is flagged
//     and leaves the later parts untouched.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/resp/encoder.hpp"
#include "kvtier/resp/parser.hpp"
#include "resp_codec/feed.hpp"

namespace {

using namespace kvtier::resp;
using kvtier::test::feed;
using kvtier::test::parsed;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_resp_parser: oracle failed: %s\n", what);
    std::abort();
  }
}

struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

struct dest_info {
  bool active = false;
  std::string bytes;
  std::size_t reply = 0;  // index in whole.values
  std::size_t first = 0;  // size of the first part
  int gate_calls = 0;
  bool gate_accepted = false;
  bool later_untouched_at_gate = true;
};

// Accepts a first part that is empty or starts with an even byte; records what it saw.
bool fuzz_gate(void* context, std::span<const std::byte> first) noexcept {
  auto& d = *static_cast<dest_info*>(context);
  ++d.gate_calls;
  d.later_untouched_at_gate &=
      first.size() == d.first && std::all_of(d.bytes.begin() + static_cast<std::ptrdiff_t>(d.first),
                                             d.bytes.end(), [](char c) { return c == '\xa5'; });
  d.gate_accepted = first.empty() || (std::to_integer<unsigned>(first[0]) & 1u) == 0;
  return d.gate_accepted;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::uint8_t hdr[8] = {};
  const std::size_t hdr_len = std::min<std::size_t>(size, 8);
  std::memcpy(hdr, data, hdr_len);
  const std::string_view stream(reinterpret_cast<const char*>(data) + hdr_len, size - hdr_len);

  parser_limits lim;
  constexpr std::size_t buffers[] = {32, 33, 48, 64, 100, 256, 4096, 64 << 10};
  lim.buffer_bytes = buffers[hdr[0] & 7];
  lim.max_bulk = (hdr[1] & 1) ? 64 : (hdr[1] & 2) ? 5000 : (1u << 20);  // big enough, cheap per run
  lim.max_aggregate = (hdr[1] & 4) ? 4 : (1u << 20);
  lim.max_depth = (hdr[1] & 8) ? 3 : 32;
  const bool with_dest = (hdr[1] & 16) == 0;
  const bool with_gate = (hdr[7] & 1) != 0;
  rng r{(std::uint64_t{hdr[2]} << 24 | std::uint64_t{hdr[3]} << 16 | std::uint64_t{hdr[4]} << 8 | hdr[5]) *
            2654435761u +
        1};
  const std::size_t max_piece = std::size_t{1} << (hdr[6] % 14);

  // 1. Whole, no destinations.
  parser whole_parser(lim);
  const parsed whole = feed(whole_parser, stream);
  check(!whole.stuck, "stuck (whole)");

  // 2. Random pieces, destinations derived from the replies found in run 1.
  std::vector<std::size_t> pieces(1 + r.next() % 64);
  for (auto& p : pieces) p = 1 + r.next() % max_piece;
  parser split_parser(lim);
  std::vector<dest_info> dests;  // not resized after the gates take addresses of its elements
  if (with_dest) {
    for (std::size_t i = 0; i < whole.values.size(); ++i) {
      const value& v = whole.values[i];
      if (v.kind == type::push) continue;  // a push is not a reply: it takes no destination
      dest_info d;
      d.reply = i;
      const auto pick = r.next() % 4;
      d.active = pick != 0;
      std::size_t len = v.kind == type::bulk_string ? v.str.size() : r.next() % 16;
      if (pick == 3) len += 1 + r.next() % 3;  // wrong length
      d.bytes.assign(len, '\xa5');
      dests.push_back(std::move(d));
    }
    // A few more than there are replies (requests whose replies never came).
    for (std::uint64_t extra = r.next() % 3; extra > 0; --extra)
      dests.push_back({true, std::string(8, '\xa5'), SIZE_MAX});
    for (auto& d : dests) {
      if (!d.active) {
        split_parser.expect_no_destination();
        continue;
      }
      // Up to three parts.
      std::vector<std::span<std::byte>> parts;
      auto all = std::as_writable_bytes(std::span(d.bytes));
      const std::size_t a = all.empty() ? 0 : r.next() % (all.size() + 1);
      const std::size_t b = a + (all.size() == a ? 0 : r.next() % (all.size() - a + 1));
      parts.push_back(all.subspan(0, a));
      parts.push_back(all.subspan(a, b - a));
      parts.push_back(all.subspan(b));
      d.first = a;
      split_parser.expect_destination(parts,
                                      with_gate ? destination_gate{&fuzz_gate, &d} : destination_gate{});
    }
  }
  const parsed split = feed(split_parser, stream, pieces);
  check(!split.stuck, "stuck (split)");
  check(split.ec == whole.ec, "same error for every split");
  check(split.values.size() == whole.values.size(), "same number of replies for every split");
  std::size_t next_dest = 0;
  for (std::size_t i = 0; i < whole.values.size(); ++i) {
    const value& w = whole.values[i];
    const value& s = split.values[i];
    const dest_info* d = nullptr;
    if (with_dest && w.kind != type::push) d = &dests[next_dest++];
    if (d && d->active && w.kind == type::bulk_string) {
      check(s.kind == type::bulk_string && s.str.empty() && s.length == w.length, "destination reply shape");
      if (d->bytes.size() == w.str.size() && with_gate) {
        check(d->gate_calls == 1 && d->later_untouched_at_gate, "gate ran once, before the later parts");
        check(d->bytes.compare(0, d->first, w.str, 0, d->first) == 0, "first part filled before the gate");
        if (d->gate_accepted) {
          check(s.into_destination && !s.refused_by_gate && d->bytes == w.str, "accepted: payload in place");
        } else {
          check(!s.into_destination && s.refused_by_gate, "refused reply flagged");
          check(std::all_of(d->bytes.begin() + static_cast<std::ptrdiff_t>(d->first), d->bytes.end(),
                            [](char c) { return c == '\xa5'; }),
                "refused: later parts untouched");
        }
      } else if (d->bytes.size() == w.str.size()) {
        check(s.into_destination && d->bytes == w.str, "payload in the destination");
      } else {
        check(!s.into_destination && !s.refused_by_gate && d->gate_calls == 0,
              "wrong-length destination not used");
      }
    } else {
      check(s == w, "same reply for every split");
    }
    if (d && !(d->active && w.kind == type::bulk_string && d->bytes.size() == w.str.size())) {
      check(d->gate_calls == 0, "no gate for a reply that does not fill the destination");
      check(std::all_of(d->bytes.begin(), d->bytes.end(), [](char c) { return c == '\xa5'; }),
            "unused destination untouched");
    }
  }

  // 3. Round trip of whatever parsed.
  if (!whole.values.empty()) {
    std::string again;
    for (const auto& v : whole.values) serialize(v, again);
    parser_limits big = lim;
    big.buffer_bytes = 64 << 10;
    parser rt_parser(big);
    const parsed rt = feed(rt_parser, again);
    check(!rt.ec && rt.values == whole.values, "serialize → parse round trip");
  }
  return 0;
}
