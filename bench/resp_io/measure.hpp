// bench/resp_io/measure.hpp: what the RESP GET benchmark measures about one client process.
//
// A client runs in its own forked child so that its peak RSS, CPU time and page faults are its own:
//
//   peak_rss_meter rss;          // resets the peak-RSS watermark
//   usage_meter m;               // snapshots rusage
//   ... connect, fetch batches ...
//   process_usage u = m.stop();  // CPU seconds, minor faults
//   long kib = rss.delta_kib();  // peak RSS above the start
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "probe_stats.hpp"

namespace kvtier_bench {

using kvtier_probe::percentile;  // tools/probe/probe_stats.hpp: the probe's rule, one copy

inline double median(const std::vector<double>& v) { return percentile(v, 0.5); }

/// A field of /proc/self/status in KiB ("VmRSS", "VmHWM"); -1 if unreadable.
inline long proc_status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  std::size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtol(line.c_str() + n + 1, nullptr, 10);
    }
  }
  return -1;
}

/// Peak RSS above the RSS at construction, whatever happened in between.
class peak_rss_meter {
 public:
  peak_rss_meter() {
    // "5" resets VmHWM to the current RSS (Linux >= 4.0), so the peak is this phase's own.
    if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
      std::fputs("5", f);
      std::fclose(f);
    }
    start_kib_ = proc_status_kib("VmRSS");
  }
  long delta_kib() const { return proc_status_kib("VmHWM") - start_kib_; }

 private:
  long start_kib_ = 0;
};

/// User + system CPU seconds of process `pid` so far (from /proc/PID/stat); 0 if unreadable.
inline double process_cpu_s(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t close = stat.rfind(')');  // the command name may contain spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state; utime and stime are 14 and 15
    if (i == 14) utime = std::stoull(f);
    if (i == 15) {
      stime = std::stoull(f);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct process_usage {
  double cpu_s = 0;       ///< user + system CPU of the whole process (all its threads)
  long minor_faults = 0;  ///< minor page faults
};

/// CPU time and minor faults of the calling process from construction to stop().
class usage_meter {
 public:
  usage_meter() { getrusage(RUSAGE_SELF, &start_); }
  process_usage stop() const {
    rusage end{};
    getrusage(RUSAGE_SELF, &end);
    return {
        seconds(end.ru_utime) + seconds(end.ru_stime) - seconds(start_.ru_utime) - seconds(start_.ru_stime),
        end.ru_minflt - start_.ru_minflt};
  }

 private:
  static double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; }
  rusage start_{};
};

}  // namespace kvtier_bench
