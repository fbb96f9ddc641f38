// tests/support/run_command.hpp: run an example binary from a test, and four redis-servers on
// consecutive loopback ports for the examples' 'resp://127.0.0.1:{rank+BASE}' template.
#pragma once

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace kvtier::test {

struct command_result {
  int rc = -1;
  std::string out;  // stdout; stderr goes to the test's log
};

/// Runs `cmd` through the shell, bounded by `timeout -k 5 <limit_s>`.
inline command_result run_command(const std::string& cmd, int limit_s = 120) {
  const std::string full = "timeout -k 5 " + std::to_string(limit_s) + " " + cmd;
  INFO(full);
  FILE* p = ::popen(full.c_str(), "r");
  REQUIRE(p != nullptr);
  command_result r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// Four redis-servers on consecutive free loopback ports (base + rank), stopped by PID.
struct four_servers {
  std::vector<std::unique_ptr<redis_server>> s;
  std::uint16_t base = 0;
  four_servers() {
    for (int attempt = 0; attempt < 20 && s.size() < 4; ++attempt) {
      s.clear();
      base = detail::pick_free_port();
      if (base > 65000) continue;
      try {
        for (std::uint16_t r = 0; r < 4; ++r)
          s.push_back(std::make_unique<redis_server>(
              redis_server::options{.port = static_cast<std::uint16_t>(base + r)}));
      } catch (const std::runtime_error&) {  // a port was taken: another base
      }
    }
    REQUIRE(s.size() == 4);
  }
  /// The shell-quoted URL template for rank r's server.
  std::string url() const { return "'resp://127.0.0.1:{rank+" + std::to_string(base) + "}'"; }
};

}  // namespace kvtier::test
