// rapidcheck properties of the RESP codec: encode→parse round trips, identical results for every
// split of the input (down to 1-byte pieces), destinations under random splits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kvtier/resp/encoder.hpp"
#include "kvtier/resp/parser.hpp"
#include "resp_codec/feed.hpp"
#include "resp_codec/generators.hpp"
#include "support/property.hpp"

using namespace kvtier::resp;
using kvtier::test::feed;
using kvtier::test::gen_binary;
using kvtier::test::gen_value;
using kvtier::test::make_value;
using kvtier::test::parse_all;
using kvtier::test::parsed;

namespace {

const std::size_t one_byte[] = {1};

std::string serialize_all(const std::vector<value>& vs) {
  std::string out;
  for (const auto& v : vs) serialize(v, out);
  return out;
}

// A small buffer often, so payloads outgrow it; sometimes the default.
parser_limits gen_limits() {
  parser_limits lim;
  lim.buffer_bytes = *rc::gen::element<std::size_t>(32, 33, 64, 100, 4096, 64 << 10);
  return lim;
}

std::vector<std::size_t> gen_pieces() {
  return *rc::gen::nonEmpty(
      rc::gen::container<std::vector<std::size_t>>(rc::gen::inRange<std::size_t>(1, 64)));
}

std::string flatten(request_builder& b) {
  std::string out;
  for (auto s : b.buffers()) out.append(reinterpret_cast<const char*>(s.data()), s.size());
  return out;
}

}  // namespace

TEST_CASE("codec properties: serialize → parse round trip", "[property]") {
  kvtier::test::prop("round trip of random value streams", [] {
    const auto vs = *rc::gen::container<std::vector<value>>(gen_value());
    const std::string in = serialize_all(vs);
    const parser_limits lim = gen_limits();
    parsed r = parse_all(in, {}, lim);
    RC_ASSERT_FALSE(r.stuck);
    RC_ASSERT(r.ec == std::error_code());
    RC_ASSERT(r.values == vs);
  });
}

TEST_CASE("codec properties: every split gives the same replies", "[property]") {
  kvtier::test::prop("valid streams, random and 1-byte splits", [] {
    const auto vs = *rc::gen::container<std::vector<value>>(gen_value());
    const std::string in = serialize_all(vs);
    const parser_limits lim = gen_limits();
    const auto pieces = gen_pieces();
    parsed split = parse_all(in, pieces, lim);
    parsed bytes = parse_all(in, one_byte, lim);
    RC_ASSERT(split.ec == std::error_code());
    RC_ASSERT(split.values == vs);
    RC_ASSERT(bytes.ec == std::error_code());
    RC_ASSERT(bytes.values == vs);
  });
  kvtier::test::prop("arbitrary bytes: same replies and same error for every split", [] {
    // Valid replies with random bytes spliced in: errors at every depth and position.
    auto vs = *rc::gen::container<std::vector<value>>(gen_value(2));
    std::string in = serialize_all(vs);
    const auto junk = *gen_binary();
    const auto at = *rc::gen::inRange<std::size_t>(0, in.size() + 1);
    in.insert(at, junk);
    if (*rc::gen::arbitrary<bool>()) in.erase(*rc::gen::inRange<std::size_t>(0, in.size() + 1), 1);
    parser_limits lim = gen_limits();
    lim.max_bulk = *rc::gen::element<std::size_t>(8, 1000, 512u << 20);
    lim.max_aggregate = *rc::gen::element<std::size_t>(2, 1000);
    lim.max_depth = *rc::gen::element<std::size_t>(1, 2, 32);
    parsed whole = parse_all(in, {}, lim);
    parsed split = parse_all(in, gen_pieces(), lim);
    parsed bytes = parse_all(in, one_byte, lim);
    RC_TAG(whole.ec ? whole.ec.message() : std::string("no error"));
    RC_ASSERT_FALSE(whole.stuck || split.stuck || bytes.stuck);
    RC_ASSERT(whole.ec == split.ec);
    RC_ASSERT(whole.ec == bytes.ec);
    RC_ASSERT(whole.values == split.values);
    RC_ASSERT(whole.values == bytes.values);
  });
}

TEST_CASE("codec properties: attributes are dropped wherever they appear", "[property]") {
  kvtier::test::prop("attribute before a reply or an element", [] {
    const value v = *gen_value(2);
    value attr = *gen_value(1);
    attr.kind = type::attribute;
    if (attr.elements.size() % 2 != 0) attr.elements.pop_back();
    // Top level.
    parsed r = parse_all(serialize(attr) + serialize(v), one_byte);
    RC_ASSERT(r.ec == std::error_code());
    RC_ASSERT(r.values.size() == 1u);
    RC_ASSERT(r.values[0] == v);
    // Before the first element of an array.
    value arr = make_value(type::array);
    arr.elements = {v};
    arr.length = 1;
    r = parse_all("*1\r\n" + serialize(attr) + serialize(v), one_byte);
    RC_ASSERT(r.ec == std::error_code());
    RC_ASSERT(r.values.size() == 1u);
    RC_ASSERT(r.values[0] == arr);
  });
}

TEST_CASE("codec properties: destinations under random splits", "[property]") {
  kvtier::test::prop(
      "payloads land in destinations of the exact length, nowhere else",
      [] {
        struct reply {
          value v;  // what the server sends
          bool has_dest = false;
          std::size_t dest_len = 0;
          std::vector<std::size_t> cuts;  // destination part sizes
        };
        const auto n = *rc::gen::inRange(1, 8);
        std::vector<reply> replies(static_cast<std::size_t>(n));
        for (auto& r : replies) {
          const int kind = *rc::gen::inRange(0, 4);
          if (kind == 0) {
            r.v = *gen_value(1);
            if (r.v.kind == type::push) r.v.kind = type::array;  // a push is not a reply: no destination
          } else if (kind == 1) {
            r.v = make_value(type::null);
          } else {
            r.v = make_value(
                type::bulk_string,
                *rc::gen::oneOf(gen_binary(), rc::gen::container<std::string>(*rc::gen::inRange(0, 3000),
                                                                              rc::gen::arbitrary<char>())));
          }
          r.has_dest = *rc::gen::inRange(0, 4) != 0;
          r.dest_len = kind >= 2 && *rc::gen::inRange(0, 4) != 0 ? r.v.str.size()
                                                                 : *rc::gen::inRange<std::size_t>(0, 50);
          std::size_t left = r.dest_len;
          while (left > 0) {
            const auto c = std::min(left, *rc::gen::inRange<std::size_t>(0, 2000));
            r.cuts.push_back(c);
            left -= c;
          }
          if (*rc::gen::arbitrary<bool>()) r.cuts.insert(r.cuts.begin(), 0);  // empty parts are fine
        }
        std::vector<std::string> dests(replies.size());
        parser p(gen_limits());
        std::string in;
        std::vector<std::size_t> pushes;  // a push arrives before replies[pushes[j]]
        for (std::size_t i = 0; i < replies.size(); ++i) {
          auto& r = replies[i];
          // Out-of-band pushes and attributes around the replies take no destination.
          if (*rc::gen::inRange(0, 4) == 0) {
            value push = make_value(type::push);
            push.elements = {make_value(type::simple_string, "invalidate"),
                             make_value(type::bulk_string, "k")};
            push.length = 2;
            serialize(push, in);
            pushes.push_back(i);
          }
          if (*rc::gen::inRange(0, 4) == 0) in += "|1\r\n+ttl\r\n$2\r\n10\r\n";
          serialize(r.v, in);
          if (!r.has_dest) {
            p.expect_no_destination();
            continue;
          }
          dests[i].assign(r.dest_len, '\x5a');
          std::vector<std::span<std::byte>> parts;
          std::size_t off = 0;
          for (auto c : r.cuts) {
            parts.push_back(std::as_writable_bytes(std::span(dests[i])).subspan(off, c));
            off += c;
          }
          p.expect_destination(parts);
        }
        const auto pieces =
            *rc::gen::element(std::vector<std::size_t>{1}, gen_pieces(), std::vector<std::size_t>{});
        parsed got = feed(p, in, pieces);
        RC_ASSERT(got.ec == std::error_code());
        RC_ASSERT(got.values.size() == replies.size() + pushes.size());
        RC_ASSERT(p.pending_destinations() == 0u);
        std::size_t at = 0;
        for (std::size_t i = 0; i < replies.size(); ++i) {
          if (std::count(pushes.begin(), pushes.end(), i) != 0)
            RC_ASSERT(got.values[at++].kind == type::push);
          const auto& r = replies[i];
          const value& v = got.values[at++];
          const bool bulk_with_dest = r.has_dest && r.v.kind == type::bulk_string;
          if (bulk_with_dest && r.dest_len == r.v.str.size()) {
            RC_ASSERT(v.into_destination);
            RC_ASSERT(v.str.empty());
            RC_ASSERT(v.length == r.v.str.size());
            RC_ASSERT(dests[i] == r.v.str);
          } else {
            if (bulk_with_dest) {  // wrong length: discarded, length reported
              RC_ASSERT(v.kind == type::bulk_string);
              RC_ASSERT_FALSE(v.into_destination);
              RC_ASSERT(v.str.empty());
              RC_ASSERT(v.length == r.v.str.size());
            } else {
              RC_ASSERT(v == r.v);
            }
            RC_ASSERT(std::all_of(dests[i].begin(), dests[i].end(), [](char c) { return c == '\x5a'; }));
          }
        }
      },
      10000);
}

TEST_CASE("codec properties: request_builder output parses back to its arguments", "[property]") {
  kvtier::test::prop("commands round trip through the parser", [] {
    const auto cmds = *rc::gen::resize(
        12, rc::gen::nonEmpty(rc::gen::container<std::vector<std::vector<std::string>>>(
                rc::gen::nonEmpty(rc::gen::container<std::vector<std::string>>(gen_binary())))));
    const auto payloads = *rc::gen::container<std::vector<std::string>>(cmds.size(), gen_binary());
    const auto with_payload = *rc::gen::container<std::vector<bool>>(cmds.size(), rc::gen::arbitrary<bool>());
    request_builder b;
    b.command({"PING"});
    b.clear();  // reuse after clear
    std::vector<value> expected;
    for (std::size_t i = 0; i < cmds.size(); ++i) {
      std::vector<std::string_view> args(cmds[i].begin(), cmds[i].end());
      value arr = make_value(type::array);
      for (const auto& a : cmds[i]) arr.elements.push_back(make_value(type::bulk_string, a));
      if (with_payload[i]) {
        // The payload in two caller-owned parts.
        const std::string_view pl = payloads[i];
        const auto half = pl.size() / 2;
        const std::span<const std::byte> parts[] = {std::as_bytes(std::span(pl.substr(0, half))),
                                                    std::as_bytes(std::span(pl.substr(half)))};
        b.command_with_payload(args, parts);
        arr.elements.push_back(make_value(type::bulk_string, payloads[i]));
      } else {
        b.command(args);
      }
      arr.length = arr.elements.size();
      expected.push_back(std::move(arr));
    }
    RC_ASSERT(b.commands() == cmds.size());
    const std::string wire = flatten(b);
    RC_ASSERT(wire.size() == b.total_bytes());
    parsed r = parse_all(wire, gen_pieces());
    RC_ASSERT(r.ec == std::error_code());
    RC_ASSERT(r.values == expected);
  });
}
