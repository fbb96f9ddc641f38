// kvtier/comm/bootstrap.hpp: handing a few bytes from one rank to all others before
// any communicator exists (e.g. NCCL's unique id), through the deployment's own runtime.
//
// A bootstrap publishes bytes under a name on one rank and lets every other rank
// fetch them by a deadline. Adapters:
//   - resp_bootstrap (here): a namespaced key on the deployment's RESP server
//     (Redis, Valkey, ...); the last of the W-1 readers deletes it, and a TTL removes
//     it if a reader never comes.
//   - mpi_bootstrap (kvtier/comm/mpi.hpp): a broadcast from the publishing rank.
//
//   kvtier::resp::asio_connection conn({.server = url.value});
//   const std::string run = kvtier::comm::launcher_run_nonce();   // e.g. the PMIx namespace
//   kvtier::comm::resp_bootstrap<kvtier::resp::asio_connection> boot(conn, "engine-a", run, world - 1);
//   std::array<std::byte, 128> id;
//   auto ec = rank == 0 ? boot.publish("nccl-id", id, dl) : boot.fetch("nccl-id", id, dl);
//
// Every rank uses the same name for the same hand-over, and a fresh name (or a
// fresh namespace) for each new one; fetch() wants exactly the published size.
//
// The run nonce: a job restarted under the same namespace within the key's TTL
// would otherwise let a reader GET the previous run's key (say, the NCCL id of a
// run that crashed before every reader came) before the new rank 0 published. The
// nonce is part of the key, so every run reads only its own. It must be the same on
// every rank of one run and differ between runs: the launcher's job id
// (launcher_run_nonce() reads PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid,
// SLURM_JOB_ID + SLURM_RESTART_COUNT, TORCHELASTIC_RUN_ID), or one the job's
// scheduler hands every rank. An empty nonce is refused (invalid_argument).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/resp/connection.hpp"

namespace kvtier::comm {

/// publish(name, bytes, dl) on one rank; fetch(name, out, dl) on every other rank
/// (out.size() = the published size). Both return by dl.
template <class B>
concept bootstrap = requires(B& b, const B& cb, std::string_view name, std::span<const std::byte> in,
                             std::span<std::byte> out, kvtier::deadline dl) {
  { b.publish(name, in, dl) } -> std::same_as<std::error_code>;
  { b.fetch(name, out, dl) } -> std::same_as<std::error_code>;
  { cb.last_error() } -> std::convertible_to<std::string>;
};

/// A per-run nonce from the launcher's environment (the same on every rank of one
/// run, different for the next run), or "" when no known launcher set one.
inline std::string launcher_run_nonce() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : std::string();
  };
  if (auto v = env("PMIX_NAMESPACE"); !v.empty()) return "pmix-" + v;  // OpenMPI 4/5, PMIx launchers
  if (auto v = env("OMPI_MCA_ess_base_jobid"); !v.empty()) return "ompi-" + v;
  if (auto v = env("SLURM_JOB_ID"); !v.empty()) {
    const std::string step = env("SLURM_STEP_ID"), restart = env("SLURM_RESTART_COUNT");
    return "slurm-" + v + "." + (step.empty() ? "0" : step) + "." + (restart.empty() ? "0" : restart);
  }
  if (auto v = env("TORCHELASTIC_RUN_ID"); !v.empty()) {  // torchrun: plus the restart count
    const std::string restart = env("TORCHELASTIC_RESTART_COUNT");
    return "torch-" + v + "." + (restart.empty() ? "0" : restart);
  }
  return {};
}

/// Bootstrap over a RESP server. The key is "<ns>:bootstrap:<nonce>:<name>"; its
/// reader count "<key>:reads". `run_nonce` identifies this run (see the file
/// comment; must not be empty); `readers` = ranks that fetch (W - 1). Fetchers poll
/// (GET, then a short sleep) until the key appears or dl passes.
template <resp::connection Conn>
class resp_bootstrap {
 public:
  struct options {
    std::chrono::milliseconds ttl{60'000};  ///< the key expires if not every reader came
    std::chrono::milliseconds poll{5};      ///< pause between GETs while the key is absent
  };

  resp_bootstrap(Conn& conn, std::string ns, std::string run_nonce, rank_t readers, options opt = {})
      : conn_(&conn), ns_(std::move(ns)), nonce_(std::move(run_nonce)), readers_(readers), opt_(opt) {}

  const std::string& last_error() const noexcept { return last_error_; }
  /// The key a name is published under.
  std::string key(std::string_view name) const {
    return ns_ + ":bootstrap:" + nonce_ + ":" + std::string(name);
  }

  std::error_code publish(std::string_view name, std::span<const std::byte> bytes, kvtier::deadline dl) {
    if (auto ec = check_nonce()) return ec;
    const std::string k = key(name), ttl = std::to_string(opt_.ttl.count());
    b_.clear();
    b_.add({"DEL", k + ":reads"});
    const std::span<const std::byte> part = bytes;
    b_.add_with_payload({"SET", k}, std::span(&part, 1));  // the value is SET's last argument
    b_.add({"PEXPIRE", k, ttl});
    if (auto ec = run("publish " + k, dl)) return ec;
    if (readers_ == 0) return del(k, dl);  // nobody will read it
    return {};
  }

  std::error_code fetch(std::string_view name, std::span<std::byte> out, kvtier::deadline dl) {
    if (auto ec = check_nonce()) return ec;
    const std::string k = key(name);
    for (;;) {
      b_.clear();
      b_.add_into({"GET", k}, out);
      if (auto ec = run("fetch " + k, dl)) return ec;
      const resp::value& v = b_.reply(0);
      if (!v.is_null()) {
        if (!v.into_destination || v.length != out.size()) {
          last_error_ = "bootstrap: " + k + " holds " + std::to_string(v.length) + " bytes, expected " +
                        std::to_string(out.size());
          return kvtier::errc::wrong_length;
        }
        return count_read(k, dl);
      }
      if (kvtier::expired(dl)) {
        last_error_ = "bootstrap: " + k + " was not published by the deadline";
        return kvtier::errc::timeout;
      }
      std::this_thread::sleep_for(std::min<kvtier::clock::duration>(opt_.poll, kvtier::time_left(dl)));
    }
  }

 private:
  std::error_code check_nonce() {
    if (!nonce_.empty()) return {};
    last_error_ =
        "bootstrap: the run nonce is empty: pass an id of this run that every rank shares "
        "(e.g. launcher_run_nonce() or the scheduler's job id), so a restarted job never reads "
        "a previous run's key";
    return kvtier::errc::invalid_argument;
  }

  // Every reader counts itself; the last one deletes the key and its counter.
  std::error_code count_read(const std::string& k, kvtier::deadline dl) {
    b_.clear();
    b_.add({"INCR", k + ":reads"});
    b_.add({"PEXPIRE", k + ":reads", std::to_string(opt_.ttl.count())});
    if (auto ec = run("count the read of " + k, dl)) return ec;
    if (b_.reply(0).integer >= static_cast<std::int64_t>(readers_)) return del(k, dl);
    return {};
  }
  std::error_code del(const std::string& k, kvtier::deadline dl) {
    b_.clear();
    b_.add({"DEL", k, k + ":reads"});
    return run("delete " + k, dl);
  }

  std::error_code run(const std::string& what, kvtier::deadline dl) {
    if (auto ec = conn_->execute(b_, dl)) {
      last_error_ = "bootstrap: " + what + ": " + ec.message();
      return ec;
    }
    for (const auto& v : b_.replies())
      if (v.is_error()) {
        last_error_ = "bootstrap: " + what + ": server replied " + v.str;
        return kvtier::errc::server_error;
      }
    return {};
  }

  Conn* conn_;
  std::string ns_, nonce_;
  rank_t readers_;
  options opt_;
  resp::batch b_;
  std::string last_error_;
};

}  // namespace kvtier::comm
