// Byte-level tests of kvtier::resp::request_builder and serialize().
#include <catch2/catch.hpp>

#include <array>
#include <string>

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
