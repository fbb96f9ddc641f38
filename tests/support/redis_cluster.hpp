// tests/support/redis_cluster.hpp: a real Redis Cluster on loopback for integration tests:
// masters and replicas as redis_server children (--cluster-enabled yes), joined by
// `redis-cli --cluster create ... --cluster-replicas R --cluster-yes`, ready once every node says
// cluster_state:ok, every replica's link is up and all nodes agree on the masters' slots. Stopped
// by PID in the destructor (each redis_server's). Test support code: throws std::runtime_error.
//
//   kvtier::test::redis_cluster cluster;                     // 3 masters + 3 replicas
//   auto url = cluster.url();                                // "resp+cluster://127.0.0.1:P1,..."
//   std::size_t m = cluster.master_of_slot(866);             // index into nodes()
//   cluster.node(m).kill();                                  // failover follows
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/redis_server.hpp"

namespace kvtier::test {

class redis_cluster {
 public:
  struct options {
    std::size_t masters = 3;
    std::size_t replicas_per_master = 1;
    int node_timeout_ms = 1000;  ///< failure detection (and so failover) time
    std::chrono::milliseconds ready_timeout{30000};
    /// Non-empty: every node also listens with TLS (redis_server::options::tls_args) and the
    /// cluster bus runs over TLS (--tls-cluster yes), so clients asking over TLS are told TLS
    /// ports; the plain ports stay for the harness.
    std::vector<std::string> tls_args{};
  };

  redis_cluster() : redis_cluster(options{}) {}
  explicit redis_cluster(options opt) : opt_(opt) {
    const std::size_t n = opt.masters * (1 + opt.replicas_per_master);
    for (std::size_t i = 0; i < n; ++i) {
      redis_server::options o{
          .extra_args = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-node-timeout", std::to_string(opt.node_timeout_ms),
                         "--cluster-require-full-coverage", "no"},
          .max_port = 55535,
          .tls_args = opt.tls_args};
      if (!opt.tls_args.empty()) o.extra_args.insert(o.extra_args.end(), {"--tls-cluster", "yes"});
      nodes_.push_back(std::make_unique<redis_server>(std::move(o)));
    }
    std::vector<std::string> args = {"/usr/bin/redis-cli", "--cluster", "create"};
    for (const auto& s : nodes_) args.push_back("127.0.0.1:" + std::to_string(s->port()));
    args.insert(args.end(), {"--cluster-replicas", std::to_string(opt.replicas_per_master), "--cluster-yes"});
    run_cli(args, nodes_.front()->dir() + "/cluster-create.log");
    wait_ready(opt.ready_timeout);
  }

  std::size_t size() const noexcept { return nodes_.size(); }
  redis_server& node(std::size_t i) { return *nodes_[i]; }

  /// "resp+cluster://127.0.0.1:P1,127.0.0.1:P2,..." with every node as a seed.
  std::string url() const {
    std::string u = "resp+cluster://";
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->port());
    return u;
  }

  /// "resp+cluster+tls://127.0.0.1:T1,..." with every node's TLS port (only with options::tls_args).
  std::string tls_url() const {
    std::string u = "resp+cluster+tls://";
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->tls_port());
    return u;
  }

  /// Index of the node that a running node's CLUSTER SLOTS names master of `slot`, or size().
  std::size_t master_of_slot(unsigned slot) const {
    for (const auto& s : nodes_) {
      if (!s->running()) continue;
      try {
        const std::uint16_t port =
            port_of(s->call({"CLUSTER", "SLOTS"}, std::chrono::milliseconds(1000)), slot);
        for (std::size_t i = 0; i < nodes_.size(); ++i)
          if (nodes_[i]->port() == port) return i;
      } catch (const std::exception&) {
      }
    }
    return nodes_.size();
  }

  /// Reassigns an empty `slot` to master `to` the way Redis moves a slot (IMPORTING on the
  /// target, NODE on the target first, a config epoch bump, NODE on the others), then waits until
  /// every node agrees. A gossip message the old owner sent before its SETSLOT can still hand the
  /// slot back on a node: the assignment is repeated, at most 4 times. False if it never held.
  bool move_empty_slot(unsigned slot, std::size_t to) {
    const std::size_t from = master_of_slot(slot);
    if (from >= nodes_.size() || to >= nodes_.size()) return false;
    if (from == to) return true;
    const std::string s = std::to_string(slot), to_id = id(to);
    (void)nodes_[to]->call({"CLUSTER", "SETSLOT", s, "IMPORTING", id(from)});
    for (int attempt = 0; attempt < 4; ++attempt) {
      (void)nodes_[to]->call({"CLUSTER", "SETSLOT", s, "NODE", to_id});
      for (std::size_t i = 0; i < nodes_.size(); ++i)
        if (i != to && nodes_[i]->running()) (void)nodes_[i]->call({"CLUSTER", "SETSLOT", s, "NODE", to_id});
      (void)nodes_[to]->call({"CLUSTER", "BUMPEPOCH"});
      try {
        wait_ready(std::chrono::seconds(3));
        if (master_of_slot(slot) == to) return true;
      } catch (const std::exception&) {
      }
    }
    return false;
  }

  /// Cluster node id of node i.
  std::string id(std::size_t i) const { return nodes_[i]->call({"CLUSTER", "MYID"}); }

  /// Waits until every running node says cluster_state:ok and all agree on 16384 served slots.
  void wait_ready(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::string last;
    while (std::chrono::steady_clock::now() < until) {
      if (ready(last)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("redis_cluster: not ready in time: " + last);
  }

 private:
  // The master port of the range holding `slot` in the harness's compact CLUSTER SLOTS text
  // ([[a,b,[ip,port,id,...],...],...]); 0 if none.
  static std::uint16_t port_of(const std::string& slots, unsigned slot) {
    std::size_t pos = 0;
    while ((pos = slots.find('[', pos + 1)) != std::string::npos) {
      unsigned a = 0, b = 0, p = 0;
      char ip[64] = {};
      if (std::sscanf(slots.c_str() + pos, "[%u,%u,[%63[^,],%u", &a, &b, ip, &p) == 4 && a <= slot &&
          slot <= b)
        return static_cast<std::uint16_t>(p);
    }
    return 0;
  }

  bool ready(std::string& why) {
    std::string reference;
    for (const auto& s : nodes_) {
      if (!s->running()) continue;
      try {
        const std::string info = s->call({"CLUSTER", "INFO"}, std::chrono::milliseconds(1000));
        if (info.find("cluster_state:ok") == std::string::npos)
          return why = "node " + std::to_string(s->port()) + " not ok", false;
        const std::string role = s->call({"ROLE"}, std::chrono::milliseconds(1000));
        if (role.rfind("[slave", 0) == 0 && role.find(",connected,") == std::string::npos)
          return why = "replica " + std::to_string(s->port()) + " not in sync: " + role, false;
        // Every node's view of the masters' ranges (ignoring replicas' order) must match.
        std::string view = masters_view(s->call({"CLUSTER", "SLOTS"}, std::chrono::milliseconds(1000)));
        if (reference.empty()) reference = view;
        if (view != reference) return why = "nodes disagree on the slot map", false;
      } catch (const std::exception& e) {
        return why = std::string("node ") + std::to_string(s->port()) + ": " + e.what(), false;
      }
    }
    if (reference.empty()) return why = "no running node", false;
    return true;
  }

  // "a-b@port;" for each range, sorted, from the compact CLUSTER SLOTS text.
  static std::string masters_view(const std::string& slots) {
    std::vector<std::string> ranges;
    std::size_t covered = 0;
    std::size_t pos = 0;
    while ((pos = slots.find('[', pos + 1)) != std::string::npos) {
      unsigned a = 0, b = 0, p = 0;
      char ip[64] = {};
      if (std::sscanf(slots.c_str() + pos, "[%u,%u,[%63[^,],%u", &a, &b, ip, &p) == 4) {
        ranges.push_back(std::to_string(a) + "-" + std::to_string(b) + "@" + std::to_string(p));
        covered += b - a + 1;
      }
    }
    std::sort(ranges.begin(), ranges.end());
    std::string out = std::to_string(covered) + ":";
    for (const auto& r : ranges) out += r + ";";
    return covered == 16384 ? out : "incomplete " + out;
  }

  // Runs redis-cli with `args`, output to `log`; throws unless it exits 0 within 60 s.
  static void run_cli(const std::vector<std::string>& args, const std::string& log) {
    std::vector<char*> argv;
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("redis_cluster: fork failed");
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int st = 0;
    while (::waitpid(pid, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        throw std::runtime_error("redis_cluster: redis-cli --cluster create timed out");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::ifstream in(log);
      std::stringstream ss;
      ss << in.rdbuf();
      throw std::runtime_error("redis_cluster: redis-cli --cluster create failed:\n" + ss.str());
    }
  }

  options opt_;
  std::vector<std::unique_ptr<redis_server>> nodes_;
};

}  // namespace kvtier::test
