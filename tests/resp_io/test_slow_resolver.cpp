// A name server that hangs must not hold a connect past the caller's deadline, on either
// transport. This executable replaces getaddrinfo() (the symbol in the executable wins over
// libc's): names under ".slow.kvtier.test" answer "not found" only after 4 s, like a resolver
// whose server does not reply; everything else goes to the real getaddrinfo.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <netdb.h>

#include <chrono>
#include <cstring>
#include <string_view>
#include <thread>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "resp_io/io_test_util.hpp"

extern "C" int getaddrinfo(const char* node, const char* service, const addrinfo* hints,
                           addrinfo** res) noexcept {
  const std::string_view name = node != nullptr ? node : "";
  constexpr std::string_view slow = ".slow.kvtier.test";
  const bool numeric = hints != nullptr && (hints->ai_flags & AI_NUMERICHOST) != 0;
  if (!numeric && name.size() > slow.size() && name.substr(name.size() - slow.size()) == slow) {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    return EAI_NONAME;
  }
  using fn = int (*)(const char*, const char*, const addrinfo*, addrinfo**);
  static const fn real = reinterpret_cast<fn>(::dlsym(RTLD_NEXT, "getaddrinfo"));
  return real(node, service, hints, res);
}

using namespace std::chrono_literals;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::resp::asio_connection;
using kvtier::resp::uring_connection;
using kvtier::test::options_for;
using kvtier::test::require_returned_by;

TEMPLATE_TEST_CASE("connection: a resolver that hangs fails the connect by the deadline", "[integration]",
                   asio_connection, uring_connection) {
  TestType conn(options_for("resp://db.slow.kvtier.test:6379"));
  const auto dl = deadline_after(300ms);
  const std::error_code ec = conn.ping(dl);
  REQUIRE(ec == errc::timeout);
  require_returned_by(dl);  // deadline + margin; the resolver answers only after 4 s
  REQUIRE_FALSE(conn.connected());
}
