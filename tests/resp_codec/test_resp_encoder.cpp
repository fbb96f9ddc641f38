// Byte-level tests of kvtier::resp::request_builder and serialize().
#include <catch2/catch.hpp>

#include <array>
#include <limits>
#include <string>
#include <vector>

#include "kvtier/resp/encoder.hpp"

using namespace kvtier::resp;

namespace {
std::string flatten(request_builder& b) {
  std::string out;
  for (auto s : b.buffers()) out.append(reinterpret_cast<const char*>(s.data()), s.size());
  return out;
}
}  // namespace

TEST_CASE("encoder: a command is an array of bulk strings", "[unit]") {
  request_builder b;
  b.command({"GET", "key"});
  CHECK(flatten(b) == "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
  CHECK(b.commands() == 1);
  CHECK(b.total_bytes() == flatten(b).size());
}

TEST_CASE("encoder: payload is referenced, not copied", "[unit]") {
  request_builder b;
  std::string payload(1000, 'x');
  b.command_with_payload({"SET", "k"}, std::as_bytes(std::span(payload)));
  bool referenced = false;
  for (auto s : b.buffers()) {
    if (reinterpret_cast<const char*>(s.data()) == payload.data()) referenced = true;
  }
  CHECK(referenced);
  CHECK(flatten(b) == "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000\r\n" + payload + "\r\n");
}

TEST_CASE("encoder: binary-safe arguments, run-time argument lists, one span per copied run", "[unit]") {
  request_builder b;
  const std::string bin("a\r\n\0b", 5);
  std::vector<std::string_view> args = {"EXISTS", bin, ""};
  b.command(std::span<const std::string_view>(args));
  b.command({"PING"});
  CHECK(flatten(b) == "*3\r\n$6\r\nEXISTS\r\n$5\r\n" + bin + "\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n");
  CHECK(b.buffers().size() == 1);  // small parts coalesce into one span
  CHECK(b.commands() == 2);
}

TEST_CASE("encoder: payload in several caller parts, batch layout", "[unit]") {
  request_builder b;
  const std::string hdr = "HDR", body = "payload";
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(hdr)), std::span<const std::byte>(),
                                              std::as_bytes(std::span(body))};
  b.command_with_payload({"SET", "k"}, parts);
  b.command_with_payload({"SET", "e"}, {});  // empty payload
  b.command({"GET", "k"});
  CHECK(flatten(b) ==
        "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nHDRpayload\r\n"
        "*3\r\n$3\r\nSET\r\n$1\r\ne\r\n$0\r\n\r\n"
        "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
  // copied run, hdr, body, copied run (CRLF + the next commands); the empty part is skipped.
  auto bufs = b.buffers();
  REQUIRE(bufs.size() == 4);
  CHECK(bufs[1].data() == parts[0].data());
  CHECK(bufs[2].data() == parts[2].data());
  CHECK(b.total_bytes() == flatten(b).size());
  // Initializer-list parts and the single-span form produce the same bytes.
  request_builder c;
  c.command_with_payload({"SET", "k"}, {parts[0], parts[2]});
  request_builder d;
  const std::string whole = hdr + body;
  d.command_with_payload({"SET", "k"}, std::as_bytes(std::span(whole)));
  CHECK(flatten(c) == flatten(d));
}

TEST_CASE("encoder: clear() empties the batch and keeps working", "[unit]") {
  request_builder b;
  b.command({"GET", "a"});
  b.clear();
  CHECK(b.commands() == 0);
  CHECK(b.total_bytes() == 0);
  CHECK(b.buffers().empty());
  b.command({"GET", "b"});
  CHECK(flatten(b) == "*2\r\n$3\r\nGET\r\n$1\r\nb\r\n");
}

TEST_CASE("serialize: RESP3 bytes of every type", "[unit]") {
  auto v = [](type t, std::string s = {}) {
    value x;
    x.kind = t;
    x.str = std::move(s);
    return x;
  };
  CHECK(serialize(v(type::simple_string, "OK")) == "+OK\r\n");
  CHECK(serialize(v(type::simple_error, "ERR x")) == "-ERR x\r\n");
  CHECK(serialize(v(type::bulk_string, "a\r\nb")) == "$4\r\na\r\nb\r\n");
  CHECK(serialize(v(type::bulk_error, "E")) == "!1\r\nE\r\n");
  CHECK(serialize(v(type::verbatim_string, "txt:hi")) == "=6\r\ntxt:hi\r\n");
  CHECK(serialize(v(type::big_number, "-123")) == "(-123\r\n");
  CHECK(serialize(v(type::null)) == "_\r\n");
  value i = v(type::integer);
  i.integer = -42;
  CHECK(serialize(i) == ":-42\r\n");
  value d = v(type::double_);
  d.dbl = 1.5;
  CHECK(serialize(d) == ",1.5\r\n");
  d.dbl = -std::numeric_limits<double>::infinity();
  CHECK(serialize(d) == ",-inf\r\n");
  d.dbl = std::numeric_limits<double>::quiet_NaN();
  CHECK(serialize(d) == ",nan\r\n");
  value t = v(type::boolean);
  t.boolean = true;
  CHECK(serialize(t) == "#t\r\n");
  value m = v(type::map);
  m.elements = {v(type::simple_string, "k"), i};
  CHECK(serialize(m) == "%1\r\n+k\r\n:-42\r\n");
  value a = v(type::array);
  a.elements = {m, v(type::null)};
  CHECK(serialize(a) == "*2\r\n%1\r\n+k\r\n:-42\r\n_\r\n");
  a.kind = type::set;
  CHECK(serialize(a).substr(0, 4) == "~2\r\n");
  a.kind = type::push;
  CHECK(serialize(a).substr(0, 4) == ">2\r\n");
  m.kind = type::attribute;
  CHECK(serialize(m).substr(0, 4) == "|1\r\n");
}
