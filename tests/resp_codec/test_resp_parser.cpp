// Byte-level tests of kvtier::resp::parser.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "kvtier/resp/parser.hpp"

using namespace kvtier::resp;

TEST_CASE("parser: simple string", "[unit]") {
  parser p;
  std::string in = "+OK\r\n";
  auto s = p.prepare();
  std::memcpy(s.data(), in.data(), in.size());
  p.commit(in.size());
  std::error_code ec;
  auto v = p.next(ec);
  REQUIRE(v);
  CHECK(v->kind == type::simple_string);
  CHECK(v->str == "OK");
}
