// Byte-level tests of kvtier::resp::parser: every RESP2/RESP3 type, malformed input, limits,
// destinations, the fixed buffer. Every input is parsed whole and byte by byte.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/resp/encoder.hpp"
#include "kvtier/resp/parser.hpp"
#include "resp_codec/feed.hpp"

using namespace kvtier::resp;
using kvtier::errc;
using kvtier::test::feed;
using kvtier::test::parse_all;
using kvtier::test::parsed;

namespace {

const std::size_t one_byte[] = {1};

// Parses `in` whole and byte by byte; both must agree. Returns the whole-input result.
parsed both(std::string_view in, parser_limits limits = {}) {
  parsed whole = parse_all(in, {}, limits);
  parsed bytes = parse_all(in, one_byte, limits);
  CHECK_FALSE(whole.stuck);
  CHECK_FALSE(bytes.stuck);
  CHECK(whole.ec == bytes.ec);
  CHECK(whole.values == bytes.values);
  return whole;
}

// The single reply `in` encodes.
value one(std::string_view in) {
  parsed r = both(in);
  INFO("input: " << in);
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.values.size() == 1);
  return r.values[0];
}

std::error_code error_of(std::string_view in, parser_limits limits = {}) {
  parsed r = both(in, limits);
  INFO("input: " << in);
  CHECK(r.values.empty());
  return r.ec;
}

std::span<std::byte> bytes_of(std::string& s) { return std::as_writable_bytes(std::span(s)); }

}  // namespace

TEST_CASE("parser: simple string, simple error", "[unit]") {
  value v = one("+OK\r\n");
  CHECK(v.kind == type::simple_string);
  CHECK(v.str == "OK");
  CHECK(v.length == 2);
  CHECK(one("+\r\n").str.empty());
  v = one("-ERR unknown command\r\n");
  CHECK(v.kind == type::simple_error);
  CHECK(v.is_error());
  CHECK(v.str == "ERR unknown command");
}

TEST_CASE("parser: integers", "[unit]") {
  CHECK(one(":0\r\n").integer == 0);
  CHECK(one(":1000\r\n").integer == 1000);
  CHECK(one(":-42\r\n").integer == -42);
  CHECK(one(":+7\r\n").integer == 7);
  CHECK(one(":9223372036854775807\r\n").integer == INT64_MAX);
  CHECK(one(":-9223372036854775808\r\n").integer == INT64_MIN);
  CHECK(one(":5\r\n").kind == type::integer);
}

TEST_CASE("parser: bulk strings are binary-safe", "[unit]") {
  value v = one("$5\r\nhello\r\n");
  CHECK(v.kind == type::bulk_string);
  CHECK(v.str == "hello");
  CHECK(v.length == 5);
  CHECK_FALSE(v.into_destination);
  CHECK(one("$0\r\n\r\n").str.empty());
  const std::string bin("a\r\nb\0c\r", 7);
  CHECK(one("$7\r\n" + bin + "\r\n").str == bin);
}

TEST_CASE("parser: null in all three spellings", "[unit]") {
  CHECK(one("$-1\r\n").kind == type::null);
  CHECK(one("*-1\r\n").kind == type::null);
  CHECK(one("_\r\n").kind == type::null);
  CHECK(one("_\r\n").is_null());
}

TEST_CASE("parser: doubles", "[unit]") {
  CHECK(one(",1.5\r\n").dbl == 1.5);
  CHECK(one(",-2\r\n").dbl == -2.0);
  CHECK(one(",+3.25\r\n").dbl == 3.25);
  CHECK(one(",1e10\r\n").dbl == 1e10);
  CHECK(one(",1.5E-3\r\n").dbl == 1.5e-3);
  CHECK(one(",inf\r\n").dbl == INFINITY);
  CHECK(one(",-inf\r\n").dbl == -INFINITY);
  CHECK(std::isnan(one(",nan\r\n").dbl));
  CHECK(one(",0\r\n").kind == type::double_);
}

TEST_CASE("parser: booleans, big numbers", "[unit]") {
  CHECK(one("#t\r\n").boolean);
  CHECK_FALSE(one("#f\r\n").boolean);
  CHECK(one("#t\r\n").kind == type::boolean);
  value v = one("(3492890328409238509324850943850943825024385\r\n");
  CHECK(v.kind == type::big_number);
  CHECK(v.str == "3492890328409238509324850943850943825024385");
  CHECK(one("(-12\r\n").str == "-12");
}

TEST_CASE("parser: verbatim strings and blob errors", "[unit]") {
  value v = one("=15\r\ntxt:Some string\r\n");
  CHECK(v.kind == type::verbatim_string);
  CHECK(v.str == "txt:Some string");
  v = one("!21\r\nSYNTAX invalid syntax\r\n");
  CHECK(v.kind == type::bulk_error);
  CHECK(v.is_error());
  CHECK(v.str == "SYNTAX invalid syntax");
}

TEST_CASE("parser: arrays, maps, sets, pushes, nesting", "[unit]") {
  value v = one("*3\r\n:1\r\n$3\r\nfoo\r\n*2\r\n+a\r\n_\r\n");
  REQUIRE(v.kind == type::array);
  REQUIRE(v.elements.size() == 3);
  CHECK(v.length == 3);
  CHECK(v.elements[0].integer == 1);
  CHECK(v.elements[1].str == "foo");
  REQUIRE(v.elements[2].elements.size() == 2);
  CHECK(v.elements[2].elements[1].kind == type::null);

  v = one("%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n");
  REQUIRE(v.kind == type::map);
  REQUIRE(v.elements.size() == 4);
  CHECK(v.elements[2].str == "second");
  CHECK(v.elements[3].integer == 2);

  v = one("~2\r\n+a\r\n#t\r\n");
  CHECK(v.kind == type::set);
  CHECK(v.elements.size() == 2);

  v = one(">3\r\n+message\r\n+chan\r\n$2\r\nhi\r\n");
  CHECK(v.kind == type::push);
  CHECK(v.elements.size() == 3);

  CHECK(one("*0\r\n").elements.empty());
  CHECK(one("*0\r\n").kind == type::array);
  CHECK(one("%0\r\n").kind == type::map);
  CHECK(one("*1\r\n*1\r\n*0\r\n").elements[0].elements[0].kind == type::array);
}

TEST_CASE("parser: attributes are parsed and dropped", "[unit]") {
  // Top level: the attribute precedes the reply it annotates.
  value v =
      one("|1\r\n+key-popularity\r\n%2\r\n$1\r\na\r\n,0.1923\r\n$1\r\nb\r\n,0.0012\r\n*2\r\n:2039123\r\n:"
          "9543892\r\n");
  REQUIRE(v.kind == type::array);
  CHECK(v.elements.size() == 2);
  CHECK(v.elements[1].integer == 9543892);
  // Nested: it does not count as an element.
  v = one("*2\r\n|1\r\n+ttl\r\n:3600\r\n+a\r\n+b\r\n");
  REQUIRE(v.elements.size() == 2);
  CHECK(v.elements[0].str == "a");
  // Empty attribute.
  CHECK(one("|0\r\n:5\r\n").integer == 5);
}

TEST_CASE("parser: pipelined replies in one read", "[unit]") {
  parsed r = both("+OK\r\n:1\r\n$3\r\nabc\r\n_\r\n*1\r\n+x\r\n");
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.values.size() == 5);
  CHECK(r.values[2].str == "abc");
  CHECK(r.values[4].elements[0].str == "x");
}

TEST_CASE("parser: an incomplete reply is not returned", "[unit]") {
  for (std::string in :
       {"+OK", "+OK\r", "$5\r\nhel", "$5\r\nhello", "$5\r\nhello\r", "*2\r\n:1\r\n", "|1\r\n+a\r\n+b\r\n"}) {
    parsed r = both(in);
    INFO(in);
    CHECK_FALSE(r.ec);
    CHECK(r.values.empty());
  }
}

TEST_CASE("parser: malformed input is a sticky protocol error", "[unit]") {
  const char* bad[] = {
      "?x\r\n",                     // unknown type byte
      "\r\n",                       // no type byte
      "+a\nb\r\n",                  // LF inside a line
      "+OK\rX",                     // CR not followed by LF
      ":\r\n",                      // empty integer
      ":12a\r\n",                   // non-digit
      ": 1\r\n",                    // space
      ":+-1\r\n",                   // two signs
      ":9223372036854775808\r\n",   // overflow
      ":-9223372036854775809\r\n",  // underflow
      "$\r\n",                      // empty length
      "$x\r\n",                     // non-digit length
      "$-2\r\n",                    // negative length other than -1
      "$+5\r\n",                    // signed length
      "$?\r\n",
      "*?\r\n",        // streamed strings and aggregates are not supported
      "$3\r\nabcXY",   // payload not followed by CRLF
      "$3\r\nabc\rX",  // payload followed by CR only
      "*-2\r\n",       // negative count
      "*x\r\n",        // bad count
      "%-1\r\n",       // null map does not exist
      "~-1\r\n",       // null set does not exist
      "!-1\r\n",       // null blob error does not exist
      "=-1\r\n",       // null verbatim does not exist
      "#x\r\n",
      "#\r\n",
      "#tt\r\n",  // booleans
      "_x\r\n",   // null with a body
      ",\r\n",
      ",abc\r\n",
      ",infinity\r\n",
      ",1.5x\r\n",
      ",0x10\r\n",
      ",+\r\n",
      ",--1\r\n",  // doubles
      "(\r\n",
      "(12a\r\n",
      "(+\r\n",           // big numbers
      "=3\r\ntxt\r\n",    // verbatim shorter than "fmt:"
      "=5\r\ntxtab\r\n",  // verbatim without the colon
  };
  for (const char* in : bad) {
    INFO("input: " << in);
    CHECK(error_of(in) == errc::protocol_error);
  }
  // Replies before the error are delivered; nothing after it, even valid bytes.
  parsed r = both("+a\r\n:1\r\n?\r\n+b\r\n");
  CHECK(r.ec == errc::protocol_error);
  CHECK(r.values.size() == 2);
  parser p;
  parsed first = feed(p, "?\r\n");
  CHECK(first.ec == errc::protocol_error);
  parsed later = feed(p, "+OK\r\n");
  CHECK(later.values.empty());
  CHECK(later.ec == errc::protocol_error);
  CHECK(p.error() == errc::protocol_error);
  // reset() (after a reconnect) starts clean.
  p.reset();
  later = feed(p, "+OK\r\n");
  REQUIRE(later.values.size() == 1);
  CHECK(later.values[0].str == "OK");
}

TEST_CASE("parser: a first byte that starts no RESP type fails at once, without a CRLF", "[unit]") {
  // An HTTP server's body has no CR at all: waiting for a line end would wait for ever.
  for (const char* in : {"<", "<!DOCTYPE HTML>\n<html>\n", "H", "HTTP/1.1 400", "+OK\r\nx"}) {
    INFO("input: " << in);
    parser p;
    parsed r = feed(p, in);
    CHECK(r.ec == errc::protocol_error);
  }
  // A valid type byte still waits for its line.
  parser p;
  parsed r = feed(p, "+O");
  CHECK_FALSE(r.ec);
  CHECK(r.values.empty());
}

TEST_CASE("parser: a reply string grows with the bytes that arrive, not its announced length", "[unit]") {
  // A header announcing 400 MB (under the default 512 MB max_bulk) must not make the client
  // allocate 400 MB before a byte arrives (found by fuzz_cluster_replies as a 5 s timeout: the
  // whole string was zeroed up front). prepare() offers the reply string's free slice, so its
  // size is what has been allocated ahead of the data: at most max(64 KiB, bytes received).
  parser p;
  const std::string head = "$400000000\r\n";
  auto in = p.prepare();
  std::memcpy(in.data(), head.data(), head.size());
  p.commit(head.size());
  std::error_code ec;
  REQUIRE_FALSE(p.next(ec));
  REQUIRE_FALSE(ec);
  std::size_t received = 0;
  for (int i = 0; i < 40; ++i) {  // 40 slices, 4 MB in all: the string doubles as they come
    in = p.prepare();
    REQUIRE(p.prepared_payload());
    CHECK(in.size() <= std::max<std::size_t>(64u << 10, received));
    const std::size_t n = std::min<std::size_t>(in.size(), 100000);
    std::memset(in.data(), 'x', n);
    p.commit(n);
    received += n;
    REQUIRE_FALSE(p.next(ec));
    REQUIRE_FALSE(ec);
  }
  CHECK(received > 2u << 20);  // the slices did grow past the first step
  // And a string that does arrive is whole and exact, across the growth steps.
  std::string payload(300000, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 + 7);
  const value v = one("$" + std::to_string(payload.size()) + "\r\n" + payload + "\r\n");
  CHECK(v.str == payload);
}

TEST_CASE("parser: limits are too_large errors", "[unit]") {
  parser_limits lim;
  lim.max_bulk = 10;
  lim.max_aggregate = 3;
  lim.max_depth = 2;
  CHECK(both("$10\r\n0123456789\r\n", lim).values.size() == 1);
  CHECK(error_of("$11\r\n", lim) == errc::too_large);
  CHECK(error_of("!11\r\n", lim) == errc::too_large);
  CHECK(error_of("=11\r\n", lim) == errc::too_large);
  CHECK(error_of("$99999999999999999999999\r\n", lim) == errc::too_large);
  CHECK(both("*3\r\n:1\r\n:2\r\n:3\r\n", lim).values.size() == 1);
  CHECK(error_of("*4\r\n", lim) == errc::too_large);
  CHECK(error_of("%4\r\n", lim) == errc::too_large);
  CHECK(error_of("*1000000000000\r\n", lim) == errc::too_large);
  CHECK(both("*1\r\n*1\r\n:1\r\n", lim).values.size() == 1);
  CHECK(error_of("*1\r\n*1\r\n*1\r\n", lim) == errc::too_large);
  CHECK(error_of("*1\r\n|1\r\n|1\r\n", lim) == errc::too_large);  // attributes nest too
  // A whole reply is capped too: many small nested aggregates, each under max_aggregate.
  parser_limits few;
  few.max_reply_elements = 4;
  // [[1, 2], 3]: 2 inner + 2 outer = 4 elements, twice in a row (the count restarts per reply)
  CHECK(both("*2\r\n*2\r\n:1\r\n:2\r\n:3\r\n*2\r\n*2\r\n:1\r\n:2\r\n:3\r\n", few).values.size() == 2);
  // [[1, 2], [3]]: 2 + 1 + 2 = 5 elements
  CHECK(error_of("*2\r\n*2\r\n:1\r\n:2\r\n*1\r\n:3\r\n", few) == errc::too_large);
  // A header line longer than the internal buffer.
  lim = {};
  lim.buffer_bytes = 64;
  CHECK(error_of("+" + std::string(100, 'a') + "\r\n", lim) == errc::too_large);
  CHECK(error_of("+" + std::string(200, 'a'), lim) == errc::too_large);
  CHECK(both("+" + std::string(60, 'a') + "\r\n", lim).values.size() == 1);
  // The error is sticky, valid bytes after it change nothing.
  parsed r = both("+a\r\n$11\r\n0123456789a\r\n+b\r\n", parser_limits{10, 3, 2, 64});
  CHECK(r.values.size() == 1);
  CHECK(r.ec == errc::too_large);
}

TEST_CASE("parser: bulk strings far larger than the fixed buffer", "[unit]") {
  parser_limits lim;
  lim.buffer_bytes = 32;
  std::string big(100000, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  const std::string in = "$100000\r\n" + big + "\r\n*2\r\n$100000\r\n" + big + "\r\n+tail\r\n";
  const std::size_t pieces[] = {1, 7, 4096, 3, 65536};
  for (auto sizes : {std::span<const std::size_t>(), std::span<const std::size_t>(pieces)}) {
    parsed r = parse_all(in, sizes, lim);
    REQUIRE_FALSE(r.ec);
    REQUIRE(r.values.size() == 2);
    CHECK(r.values[0].str == big);
    CHECK(r.values[1].elements[0].str == big);
    CHECK(r.values[1].elements[1].str == "tail");
  }
}

TEST_CASE("parser: without a destination, a large payload is read straight into the reply string", "[unit]") {
  parser_limits lim;
  lim.buffer_bytes = 64;
  parser p(lim);
  std::string head = "$1000\r\n";
  auto s = p.prepare();
  std::memcpy(s.data(), head.data(), head.size());
  p.commit(head.size());
  std::error_code ec;
  CHECK_FALSE(p.next(ec));
  auto direct = p.prepare();
  CHECK(p.prepared_payload());
  CHECK(direct.size() == 1000);  // exactly the payload: the buffer is bypassed
  std::memset(direct.data(), 'z', direct.size());
  p.commit(direct.size());
  CHECK_FALSE(p.next(ec));
  s = p.prepare();
  std::memcpy(s.data(), "\r\n", 2);
  p.commit(2);
  auto v = p.next(ec);
  REQUIRE(v);
  CHECK(v->str == std::string(1000, 'z'));
}

TEST_CASE("parser: destination of the exact length receives the payload in place", "[unit]") {
  std::string dst(11, '.');
  parser p;
  p.expect_destination(bytes_of(dst));
  CHECK(p.pending_destinations() == 1);
  parsed r = feed(p, "$11\r\nhello world\r\n");
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.values.size() == 1);
  CHECK(r.values[0].kind == type::bulk_string);
  CHECK(r.values[0].into_destination);
  CHECK(r.values[0].length == 11);
  CHECK(r.values[0].str.empty());
  CHECK(dst == "hello world");
  CHECK(p.pending_destinations() == 0);
}

TEST_CASE("parser: prepare() hands out the destination itself (zero copy)", "[unit]") {
  std::string dst(5000, '.');
  parser_limits lim;
  lim.buffer_bytes = 64;
  parser p(lim);
  p.expect_destination(bytes_of(dst));
  const std::string head = "$5000\r\nab";  // header plus the first payload bytes in one read
  auto s = p.prepare();
  std::memcpy(s.data(), head.data(), head.size());
  p.commit(head.size());
  std::error_code ec;
  CHECK_FALSE(p.next(ec));
  CHECK(dst.substr(0, 3) == "ab.");
  auto direct = p.prepare();
  CHECK(p.prepared_payload());
  CHECK(reinterpret_cast<char*>(direct.data()) == dst.data() + 2);
  CHECK(direct.size() == 4998);
  std::memset(direct.data(), 'q', 4998);
  p.commit(4998);
  CHECK_FALSE(p.next(ec));
  s = p.prepare();
  CHECK_FALSE(p.prepared_payload());
  CHECK(reinterpret_cast<char*>(s.data()) != dst.data() + 5000);  // back in the internal buffer
  std::memcpy(s.data(), "\r\n", 2);
  p.commit(2);
  auto v = p.next(ec);
  REQUIRE(v);
  CHECK(v->into_destination);
  CHECK(dst == "ab" + std::string(4998, 'q'));
}

TEST_CASE("parser: destination split into parts (header + payload)", "[unit]") {
  std::string hdr(4, '.'), body(7, '.'), empty;
  std::span<std::byte> parts[] = {bytes_of(hdr), bytes_of(empty), bytes_of(body)};
  for (std::size_t piece : {1, 2, 3, 100}) {
    hdr.assign(4, '.');
    body.assign(7, '.');
    parser_limits lim;
    lim.buffer_bytes = 32;
    parser p(lim);
    p.expect_destination(parts);
    const std::size_t pieces[] = {piece};
    parsed r = feed(p, "$11\r\nHEADpayload\r\n", pieces);
    REQUIRE_FALSE(r.ec);
    REQUIRE(r.values.size() == 1);
    CHECK(r.values[0].into_destination);
    CHECK(hdr == "HEAD");
    CHECK(body == "payload");
  }
}

TEST_CASE("parser: destination of the wrong length is left alone, the stream stays in sync", "[unit]") {
  for (std::size_t buffer : {32, 64 << 10}) {
    std::string dst(4, '.');
    parser_limits lim;
    lim.buffer_bytes = buffer;
    parser p(lim);
    p.expect_destination(bytes_of(dst));
    p.expect_no_destination();
    const std::string big(300, 'x');
    parsed r = feed(p, "$300\r\n" + big + "\r\n+next\r\n", one_byte);
    REQUIRE_FALSE(r.ec);
    REQUIRE(r.values.size() == 2);
    CHECK(r.values[0].kind == type::bulk_string);
    CHECK_FALSE(r.values[0].into_destination);
    CHECK(r.values[0].length == 300);
    CHECK(r.values[0].str.empty());  // discarded
    CHECK(dst == "....");
    CHECK(r.values[1].str == "next");
  }
}

TEST_CASE("parser: null, errors and other replies consume their destination untouched", "[unit]") {
  std::string a(3, '.'), b(3, '.'), c(3, '.'), d(3, '.');
  parser p;
  p.expect_destination(bytes_of(a));
  p.expect_destination(bytes_of(b));
  p.expect_destination(bytes_of(c));
  p.expect_destination(bytes_of(d));
  parsed r = feed(p, "$-1\r\n-ERR x\r\n*1\r\n$3\r\nabc\r\n$3\r\nxyz\r\n", one_byte);
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.values.size() == 4);
  CHECK(r.values[0].kind == type::null);
  CHECK(r.values[1].is_error());
  // Only a top-level bulk string goes to a destination; a nested one goes to str.
  CHECK(r.values[2].elements[0].str == "abc");
  CHECK_FALSE(r.values[2].elements[0].into_destination);
  CHECK(r.values[3].into_destination);
  CHECK(a == "...");
  CHECK(b == "...");
  CHECK(c == "...");
  CHECK(d == "xyz");
  CHECK(p.pending_destinations() == 0);
}

TEST_CASE("parser: pushes do not consume a destination; attributes do not either", "[unit]") {
  std::string dst(2, '.');
  parser p;
  p.expect_destination(bytes_of(dst));
  parsed r = feed(p, ">2\r\n+invalidate\r\n$2\r\nno\r\n|1\r\n+a\r\n$2\r\nno\r\n$2\r\nok\r\n");
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.values.size() == 2);
  CHECK(r.values[0].kind == type::push);
  CHECK(r.values[0].elements[1].str == "no");
  CHECK(r.values[1].into_destination);
  CHECK(dst == "ok");
}

TEST_CASE("parser: expect_no_destination keeps the queue aligned", "[unit]") {
  std::string dst(2, '.');
  parser p;
  p.expect_no_destination();
  p.expect_destination(bytes_of(dst));
  parsed r = feed(p, "$2\r\nab\r\n$2\r\ncd\r\n$2\r\nef\r\n");
  REQUIRE(r.values.size() == 3);
  CHECK(r.values[0].str == "ab");
  CHECK_FALSE(r.values[0].into_destination);
  CHECK(r.values[1].into_destination);
  CHECK(dst == "cd");
  CHECK(r.values[2].str == "ef");  // no destination registered: like expect_no_destination
}

TEST_CASE("parser: empty destination and empty bulk", "[unit]") {
  parser p;
  p.expect_destination(std::span<std::byte>());
  parsed r = feed(p, "$0\r\n\r\n");
  REQUIRE(r.values.size() == 1);
  CHECK(r.values[0].into_destination);
  CHECK(r.values[0].length == 0);
}

TEST_CASE("parser: reset drops buffered bytes, destinations and the reply in progress", "[unit]") {
  std::string dst(5, '.');
  parser p;
  p.expect_destination(bytes_of(dst));
  parsed r = feed(p, "$5\r\nab");
  CHECK(r.values.empty());
  p.reset();
  CHECK(p.pending_destinations() == 0);
  CHECK(p.buffered() == 0);
  r = feed(p, "$5\r\nhello\r\n");
  REQUIRE(r.values.size() == 1);
  CHECK(r.values[0].str == "hello");
  CHECK(dst == "ab...");
}

TEST_CASE("parser: a moved parser keeps its reply in progress", "[unit]") {
  parser a;
  parsed r = feed(a, "*2\r\n$3\r\nab");
  parser b(std::move(a));
  r = feed(b, "c\r\n:1\r\n");
  REQUIRE(r.values.size() == 1);
  CHECK(r.values[0].elements[0].str == "abc");
}

TEST_CASE("parser: a destination registered while a reply is arriving is for the next reply", "[unit]") {
  std::string dst(2, '.');
  parser p;
  parsed r = feed(p, "$2\r\nab");
  CHECK(r.values.empty());
  p.expect_destination(bytes_of(dst));
  r = feed(p, "\r\n$2\r\ncd\r\n");
  REQUIRE(r.values.size() == 2);
  CHECK(r.values[0].str == "ab");
  CHECK(r.values[1].into_destination);
  CHECK(dst == "cd");
  CHECK(p.pending_destinations() == 0);
}

namespace {

// A gate that accepts a first part reading "GOOD" and records what it saw when it ran.
struct gate_probe {
  int calls = 0;
  std::string seen;                    // the first part, as passed to the gate
  const std::string* later = nullptr;  // a later part: must still hold its sentinel at gate time
  bool later_untouched = true;
};

bool good_gate(void* context, std::span<const std::byte> first) noexcept {
  auto& g = *static_cast<gate_probe*>(context);
  ++g.calls;
  g.seen.assign(reinterpret_cast<const char*>(first.data()), first.size());
  if (g.later) g.later_untouched &= g.later->find_first_not_of('#') == std::string::npos;
  return g.seen == "GOOD";
}

}  // namespace

TEST_CASE("parser: a destination gate decides after the first part, before any byte reaches a later part",
          "[unit]") {
  // Small and large payloads (the large one passes the 32-byte buffer and is read directly);
  // every input whole (header and payload in one read) and in pieces down to 1 byte.
  for (std::size_t body_size : {7, 3000}) {
    std::string good_body(body_size, 'p'), evil_body(body_size, 'f');
    for (std::size_t i = 0; i < body_size; ++i) good_body[i] = static_cast<char>('a' + i % 26);
    const std::string len = std::to_string(4 + body_size);
    const std::string input = "$" + len + "\r\nGOOD" + good_body + "\r\n+next\r\n$" + len + "\r\nEVIL" +
                              evil_body + "\r\n+after\r\n";
    for (std::size_t buffer : {32, 64 << 10}) {
      for (std::size_t piece : {0, 1, 2, 3, 5, 7, 64, 100000}) {
        INFO("body " << body_size << " buffer " << buffer << " piece " << piece);
        std::string hdr1(4, '#'), body1(body_size, '#'), hdr2(4, '#'), body2(body_size, '#'), empty;
        std::span<std::byte> parts1[] = {bytes_of(hdr1), bytes_of(empty), bytes_of(body1)};
        std::span<std::byte> parts2[] = {bytes_of(hdr2), bytes_of(body2)};
        gate_probe g1, g2;
        g1.later = &body1;
        g2.later = &body2;
        parser_limits lim;
        lim.buffer_bytes = buffer;
        parser p(lim);
        p.expect_destination(parts1, destination_gate{&good_gate, &g1});
        p.expect_no_destination();
        p.expect_destination(parts2, destination_gate{&good_gate, &g2});
        p.expect_no_destination();
        const std::size_t pieces[] = {piece};
        parsed r = feed(p, input,
                        piece == 0 ? std::span<const std::size_t>() : std::span<const std::size_t>(pieces));
        REQUIRE_FALSE(r.ec);
        REQUIRE_FALSE(r.stuck);
        REQUIRE(r.values.size() == 4);
        // Accepted: every part filled.
        CHECK(g1.calls == 1);
        CHECK(g1.seen == "GOOD");
        CHECK(g1.later_untouched);
        CHECK(r.values[0].into_destination);
        CHECK_FALSE(r.values[0].refused_by_gate);
        CHECK(r.values[0].length == 4 + body_size);
        CHECK(hdr1 == "GOOD");
        CHECK(body1 == good_body);
        CHECK(r.values[1].str == "next");
        // Refused: the later part still holds its sentinel; the stream stays in sync.
        CHECK(g2.calls == 1);
        CHECK(g2.seen == "EVIL");
        CHECK(g2.later_untouched);
        CHECK(r.values[2].kind == type::bulk_string);
        CHECK_FALSE(r.values[2].into_destination);
        CHECK(r.values[2].refused_by_gate);
        CHECK(r.values[2].length == 4 + body_size);
        CHECK(r.values[2].str.empty());
        CHECK(hdr2 == "EVIL");
        CHECK(body2 == std::string(body_size, '#'));
        CHECK(r.values[3].str == "after");
        CHECK(p.pending_destinations() == 0);
      }
    }
  }
}

TEST_CASE("parser: a gate on an empty first part runs before any payload byte arrives", "[unit]") {
  for (std::size_t piece : {1, 100}) {
    std::string empty, body(5, '#');
    std::span<std::byte> parts[] = {bytes_of(empty), bytes_of(body)};
    gate_probe g;
    g.later = &body;
    parser p;
    p.expect_destination(parts, destination_gate{&good_gate, &g});
    const std::size_t pieces[] = {piece};
    parsed r = feed(p, "$5\r\nhello\r\n:1\r\n", pieces);
    REQUIRE_FALSE(r.ec);
    REQUIRE(r.values.size() == 2);
    CHECK(g.calls == 1);
    CHECK(g.seen.empty());
    CHECK(g.later_untouched);
    CHECK(r.values[0].refused_by_gate);
    CHECK_FALSE(r.values[0].into_destination);
    CHECK(body == "#####");
    CHECK(r.values[1].integer == 1);
  }
}

TEST_CASE("parser: a gate is not consulted for a reply of another length, a null or an error", "[unit]") {
  std::string hdr(4, '#'), body(3, '#');
  std::span<std::byte> parts[] = {bytes_of(hdr), bytes_of(body)};
  gate_probe g;
  parser p;
  for (int i = 0; i < 3; ++i) p.expect_destination(parts, destination_gate{&good_gate, &g});
  parsed r = feed(p, "$8\r\nGOODabcd\r\n$-1\r\n-ERR x\r\n", one_byte);
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.values.size() == 3);
  CHECK(g.calls == 0);
  CHECK_FALSE(r.values[0].into_destination);
  CHECK_FALSE(r.values[0].refused_by_gate);
  CHECK(r.values[1].is_null());
  CHECK(r.values[2].is_error());
  CHECK(hdr == "####");
  CHECK(body == "###");
}

namespace {

// Records what a destination's `landed` observer saw: the bytes, in order, and where they were.
struct landed_probe {
  gate_probe gate;
  std::string bytes;
  std::size_t calls = 0, largest = 0;
  const std::byte* next_at = nullptr;  // where the next piece must start (contiguous within a part)
  bool in_place = true;                // every piece was the destination's own memory, in order
  std::vector<std::span<std::byte>> parts;
};

bool landed_gate(void* context, std::span<const std::byte> first) noexcept {
  return good_gate(&static_cast<landed_probe*>(context)->gate, first);
}

void landed_piece(void* context, std::span<const std::byte> piece) noexcept {
  auto& l = *static_cast<landed_probe*>(context);
  ++l.calls;
  l.largest = std::max(l.largest, piece.size());
  bool inside = false;
  for (std::size_t k = 1; k < l.parts.size(); ++k)
    inside |= piece.data() >= l.parts[k].data() &&
              piece.data() + piece.size() <= l.parts[k].data() + l.parts[k].size();
  // A piece starts where the last one ended, or at the start of a later part.
  bool starts_right = piece.data() == l.next_at;
  for (std::size_t k = 1; k < l.parts.size(); ++k) starts_right |= piece.data() == l.parts[k].data();
  l.in_place &= inside && starts_right;
  l.next_at = piece.data() + piece.size();
  l.bytes.append(reinterpret_cast<const char*>(piece.data()), piece.size());
}

}  // namespace

TEST_CASE("parser: a destination's landed observer sees every later byte once, in order, in bounded pieces",
          "[unit]") {
  // A body larger than landed_slice_bytes (direct reads are capped to it) and a small one.
  for (std::size_t body_size : {std::size_t{9}, parser::landed_slice_bytes * 2 + 1234}) {
    std::string body(body_size, '\0');
    for (std::size_t i = 0; i < body_size; ++i) body[i] = static_cast<char>('a' + (i * 7) % 26);
    const std::string len = std::to_string(4 + body_size);
    const std::string input =
        "$" + len + "\r\nGOOD" + body + "\r\n$" + len + "\r\nEVIL" + body + "\r\n+after\r\n";
    for (std::size_t piece : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{300000}}) {
      if (piece == 1 && body_size > 100) continue;  // byte by byte over 512 KiB: slow, adds nothing
      INFO("body " << body_size << " piece " << piece);
      std::string hdr1(4, '#'), a1(body_size / 3, '#'), b1(body_size - body_size / 3, '#');
      std::string hdr2(4, '#'), a2(body_size, '#');
      auto bytes = [](std::string& s) {
        return std::span<std::byte>(reinterpret_cast<std::byte*>(s.data()), s.size());
      };
      landed_probe l1, l2;
      l1.parts = {bytes(hdr1), bytes(a1), bytes(b1)};
      l2.parts = {bytes(hdr2), bytes(a2)};
      parser p(parser_limits{.buffer_bytes = 64});
      p.expect_destination(l1.parts, destination_gate{&landed_gate, &l1, &landed_piece});
      p.expect_destination(l2.parts, destination_gate{&landed_gate, &l2, &landed_piece});
      p.expect_no_destination();
      const std::size_t pieces[] = {piece};
      parsed r =
          feed(p, input, piece == 0 ? std::span<const std::size_t>() : std::span<const std::size_t>(pieces));
      REQUIRE_FALSE(r.ec);
      REQUIRE(r.values.size() == 3);
      CHECK(r.values[0].into_destination);
      CHECK(l1.bytes == body);  // every payload byte after the header, once, in order
      CHECK(a1 + b1 == body);
      CHECK(l1.in_place);
      CHECK(l1.largest <= parser::landed_slice_bytes);
      CHECK(r.values[1].refused_by_gate);  // refused: the observer never sees its bytes
      CHECK(l2.calls == 0);
      CHECK(a2 == std::string(body_size, '#'));
    }
  }
}

TEST_CASE("parser: a large destination's payload is read straight into it, none through the buffer",
          "[unit]") {
  // Reads as a socket gives them (as much as prepare() takes, the whole stream available): at a
  // reply's start only its length line and the destination's first part go to the internal
  // buffer, so no payload byte is copied from there. A small destination, a null and a reply of
  // another length still parse as ever, and the stream stays in sync.
  const std::size_t big = parser::short_head_read_min * 8 + 77;
  std::string body(big, '\0');
  for (std::size_t i = 0; i < big; ++i) body[i] = static_cast<char>('a' + (i * 5) % 26);
  const std::string len = std::to_string(56 + big);
  const std::string head(56, 'H');
  const std::string input = "$" + len + "\r\n" + head + body + "\r\n" + "$" + len + "\r\n" + head + body +
                            "\r\n$-1\r\n$5\r\nsmall\r\n$3\r\nabc\r\n+OK\r\n";
  std::string h1(56, '.'), p1(big, '.'), h2(56, '.'), p2(big, '.'), h3(56, '.'), p3(big, '.'), tiny(5, '.'),
      other(4, '.');
  std::span<std::byte> d1[] = {bytes_of(h1), bytes_of(p1)}, d2[] = {bytes_of(h2), bytes_of(p2)},
                       d3[] = {bytes_of(h3), bytes_of(p3)};
  parser p;  // the default 64 KiB buffer: without the short head read it takes 64 KiB of payload
  p.expect_destination(d1);
  p.expect_destination(d2);
  p.expect_destination(d3);  // answered by the null
  p.expect_destination(bytes_of(tiny));
  p.expect_destination(bytes_of(other));  // "abc": another length, discarded
  p.expect_no_destination();
  std::size_t pos = 0, through_buffer = 0, reads = 0;
  std::vector<value> got;
  std::error_code ec;
  while (pos < input.size() && reads < 100000) {
    ++reads;
    std::span<std::byte> into = p.prepare();
    REQUIRE_FALSE(into.empty());
    const bool direct = p.prepared_payload();
    const std::size_t n = std::min(into.size(), input.size() - pos);
    std::memcpy(into.data(), input.data() + pos, n);
    p.commit(n);
    if (!direct) through_buffer += n;
    pos += n;
    while (auto v = p.next(ec)) got.push_back(std::move(*v));
    REQUIRE_FALSE(ec);
  }
  REQUIRE(got.size() == 6);
  CHECK(got[0].into_destination);
  CHECK(got[1].into_destination);
  CHECK(h1 == head);
  CHECK(p1 == body);
  CHECK(p2 == body);
  CHECK(got[2].is_null());
  CHECK(p3 == std::string(big, '.'));
  CHECK(got[3].into_destination);
  CHECK(tiny == "small");
  CHECK_FALSE(got[4].into_destination);
  CHECK(other == "....");
  CHECK(got[5].str == "OK");
  // Through the buffer: the two lines and value headers, their CRLFs and the small replies.
  const std::size_t framing = 2 * (len.size() + 3 + 56 + 2) + 5 + 11 + 9 + 5;
  CHECK(through_buffer <= framing);
}
