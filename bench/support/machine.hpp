// bench/support/machine.hpp: what a benchmark reports beside its figures about the machine it
// ran on: the 1-minute load average (every bench's JSON line carries it as "loadavg_1m"), this
// process's CPU seconds, a redis-server's CPU seconds.
//
//   const double s0 = kvtier_bench::server_cpu_s(srv), c0 = kvtier_bench::cpu_self_s();
//   ... timed part ...
//   std::printf("server CPU-s/GB %.3f, load %.2f\n", (kvtier_bench::server_cpu_s(srv) - s0) / gb,
//               kvtier_bench::load_average());
#pragma once

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kvtier_bench {

/// The 1-minute load average (/proc/loadavg), 0 when unreadable.
inline double load_average() {
  double l = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = 0;
    std::fclose(f);
  }
  return l;
}

/// User + system CPU seconds of this process, every thread (getrusage).
inline double cpu_self_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return s(u.ru_utime) + s(u.ru_stime);
}

/// used_cpu_sys + used_cpu_user of the server (INFO cpu), seconds. A template over the server
/// (kvtier::test::redis_server) so that benches without a server include this header too.
template <class Server>
double server_cpu_s(const Server& srv) {
  const std::string info = srv.call({"INFO", "cpu"});
  auto field = [&](const char* name) {
    const std::size_t at = info.find(name);
    return at == std::string::npos ? 0.0 : std::strtod(info.c_str() + at + std::strlen(name), nullptr);
  };
  return field("used_cpu_sys:") + field("used_cpu_user:");
}

}  // namespace kvtier_bench
