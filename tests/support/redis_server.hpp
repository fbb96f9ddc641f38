// tests/support/redis_server.hpp: real redis-server processes for integration tests,
// and a "black hole" server that accepts connections and never answers.
//
// Each redis_server runs /usr/bin/redis-server on a free loopback port (bind
// 127.0.0.1, no persistence, its own temp dir) and is always stopped by PID in the
// destructor, so a failing test never leaves a server behind. Test support code:
// it throws std::runtime_error when a server cannot be started.
//
//   kvtier::test::redis_server srv;                          // started, answers PING
//   auto url = srv.url();                                    // "resp://127.0.0.1:PORT"
//   srv.call({"SET", "k", "raw bytes"});                     // blocking helper client
//   srv.kill();                                              // SIGKILL by PID
//   srv.restart();                                           // same port, empty data
//
//   // one argv element per word: redis joins them into one config line
//   kvtier::test::redis_server acl({.extra_args = {"--user", "alice", "on", ">secret", "~*", "&*", "+@all"},
//                                   .unix_socket = true, .harness_user = "alice", .harness_password =
//                                   "secret"});
//   kvtier::test::black_hole_server hole;                    // connect works, replies never come
//
// The child gets PR_SET_PDEATHSIG(SIGKILL), so it also dies if the test process is killed before
// its destructors run. That signal follows the *thread* that forked: create servers on a thread
// that outlives them (normally the test's own thread).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kvtier::test {

namespace detail {

/// A loopback port that was free a moment ago (bound to port 0, then released).
inline std::uint16_t pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("pick_free_port: socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("pick_free_port: bind/getsockname failed");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// A blocking loopback TCP connection with send/receive timeouts; -1 on failure.
inline int connect_loopback(std::uint16_t port, std::chrono::milliseconds timeout) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Minimal blocking RESP2 reader used only by the test harness (independent of the
/// library under test). Returns the reply re-serialised compactly:
///   +OK -> "OK", -ERR x -> "-ERR x", :5 -> "5", $3 abc -> "abc", $-1 -> "(nil)",
///   arrays -> "[a,b,...]".
class harness_reader {
 public:
  explicit harness_reader(int fd) : fd_(fd) {}
  std::string reply() {
    std::string line = read_line();
    if (line.empty()) throw std::runtime_error("redis harness: empty reply line");
    const char t = line[0];
    std::string rest = line.substr(1);
    switch (t) {
      case '+':
        return rest;
      case '-':
        return "-" + rest;
      case ':':
        return rest;
      case '$': {
        const long long n = std::stoll(rest);
        if (n < 0) return "(nil)";
        std::string body = read_exact(static_cast<std::size_t>(n) + 2);
        body.resize(static_cast<std::size_t>(n));
        return body;
      }
      case '*': {
        const long long n = std::stoll(rest);
        if (n < 0) return "(nil)";
        std::string out = "[";
        for (long long i = 0; i < n; ++i) out += (i ? "," : "") + reply();
        return out + "]";
      }
      default:
        throw std::runtime_error("redis harness: unexpected reply type '" + line + "'");
    }
  }

 private:
  bool fill() {
    char tmp[65536];
    ssize_t n;
    do n = ::recv(fd_, tmp, sizeof tmp, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<std::size_t>(n));
    return true;
  }
  std::string read_line() {
    for (;;) {
      auto pos = buf_.find("\r\n");
      if (pos != std::string::npos) {
        std::string line = buf_.substr(0, pos);
        buf_.erase(0, pos + 2);
        return line;
      }
      if (!fill()) throw std::runtime_error("redis harness: connection closed or timed out");
    }
  }
  std::string read_exact(std::size_t n) {
    while (buf_.size() < n)
      if (!fill()) throw std::runtime_error("redis harness: connection closed or timed out");
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
  }
  int fd_;
  std::string buf_;
};

inline void send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("redis harness: send failed");
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

inline std::string encode_command(std::initializer_list<std::string_view> args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (auto a : args) {
    out += "$" + std::to_string(a.size()) + "\r\n";
    out.append(a.data(), a.size());
    out += "\r\n";
  }
  return out;
}

}  // namespace detail

/// A redis-server child process on 127.0.0.1:port(); stopped by PID in the destructor.
class redis_server {
 public:
  struct options {
    /// Extra command-line arguments, one argv element per word, e.g. {"--requirepass", "pw"}
    /// or {"--user", "alice", "on", ">secret", "~*", "&*", "+@all"}.
    std::vector<std::string> extra_args{};
    /// Also listen on a Unix socket in the server's temp dir (see unix_path()).
    bool unix_socket = false;
    /// How long to wait for the server to answer PING after start.
    std::chrono::milliseconds start_timeout{10000};
    /// Password the harness's own client uses (call(), readiness check): AUTH user pw.
    std::string harness_user{};
    std::string harness_password{};
    std::string executable = "/usr/bin/redis-server";
    /// Highest port to use (a cluster node needs port + 10000 for its bus, so <= 55535).
    std::uint16_t max_port = 65535;
    /// 0: a free port picked (retried if taken). Otherwise exactly this port, one attempt: the
    /// constructor throws if it is taken (callers that need given ports, e.g. consecutive
    /// ones for a `{rank+N}` URL, pick again).
    std::uint16_t port = 0;
    /// Non-empty: also listen with TLS on tls_port() (a second free port), with these arguments
    /// (--tls-cert-file ... --tls-key-file ... --tls-ca-cert-file ...). The plain port stays for
    /// the harness's own client.
    std::vector<std::string> tls_args{};
  };

  redis_server() : redis_server(options{}) {}
  explicit redis_server(options opt) : opt_(std::move(opt)) {
    char tmpl[] = "/tmp/kvtier-redis-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("redis_server: mkdtemp failed");
    dir_ = tmpl;
    if (opt_.port != 0) {  // exactly this port: one attempt
      port_ = opt_.port;
      if (!opt_.tls_args.empty()) tls_port_ = detail::pick_free_port();
      if (launch()) return;
      const std::string log = read_log();
      cleanup_dir();
      throw std::runtime_error("redis_server: could not start redis-server on port " + std::to_string(port_) +
                               "; log:\n" + log);
    }
    // A port picked free can be taken by someone else before the server binds it:
    // retry with a fresh port a few times.
    for (int attempt = 0;; ++attempt) {
      port_ = detail::pick_free_port();
      for (int pick = 0; port_ > opt_.max_port && pick < 1000; ++pick) port_ = detail::pick_free_port();
      if (!opt_.tls_args.empty()) {  // within max_port too: with --tls-cluster the bus is tls_port + 10000
        tls_port_ = detail::pick_free_port();
        for (int pick = 0; (tls_port_ > opt_.max_port || tls_port_ == port_) && pick < 1000; ++pick)
          tls_port_ = detail::pick_free_port();
      }
      if (port_ <= opt_.max_port && tls_port_ <= opt_.max_port && launch()) return;
      if (attempt == 4) {
        std::string log = read_log();
        cleanup_dir();
        throw std::runtime_error("redis_server: could not start redis-server; log:\n" + log);
      }
    }
  }

  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  ~redis_server() {
    stop();
    cleanup_dir();
  }

  std::uint16_t port() const noexcept { return port_; }
  /// The TLS port (only with options::tls_args).
  std::uint16_t tls_port() const noexcept { return tls_port_; }
  pid_t pid() const noexcept { return pid_; }
  bool running() const noexcept { return pid_ > 0; }
  const std::string& dir() const noexcept { return dir_; }
  /// "resp://127.0.0.1:PORT" (no credentials).
  std::string url() const { return "resp://127.0.0.1:" + std::to_string(port_); }
  /// Path of the Unix socket (only with options::unix_socket).
  std::string unix_path() const { return dir_ + "/redis.sock"; }
  /// "resp+unix:///tmp/.../redis.sock" (only with options::unix_socket).
  std::string unix_url() const { return "resp+unix://" + unix_path(); }

  /// SIGKILL by PID and reap: the server vanishes without closing anything gracefully.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    reap_blocking();
  }

  /// SIGTERM, wait up to 5 s, then SIGKILL. Always reaps the child.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill();
  }

  /// Stops the server if running and starts a fresh one on the same port (empty data).
  void restart() {
    stop();
    std::error_code ignore;
    std::filesystem::remove(unix_path(), ignore);
    // The port was ours a moment ago; redis sets SO_REUSEADDR, so TIME_WAIT is no obstacle.
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (launch()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("redis_server: restart on port " + std::to_string(port_) + " failed; log:\n" +
                             read_log());
  }

  /// One command through a fresh blocking harness connection (AUTH first when
  /// harness credentials are set). Returns the reply in compact text form (see
  /// detail::harness_reader). Independent of the library under test.
  std::string call(std::initializer_list<std::string_view> args,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) const {
    int fd = detail::connect_loopback(port_, timeout);
    if (fd < 0) throw std::runtime_error("redis_server::call: connect failed");
    struct closer {
      int fd;
      ~closer() { ::close(fd); }
    } c{fd};
    detail::harness_reader rd(fd);
    if (!opt_.harness_password.empty()) {
      if (opt_.harness_user.empty())
        detail::send_all(fd, detail::encode_command({"AUTH", opt_.harness_password}));
      else
        detail::send_all(fd, detail::encode_command({"AUTH", opt_.harness_user, opt_.harness_password}));
      std::string r = rd.reply();
      if (r != "OK") throw std::runtime_error("redis_server::call: AUTH failed: " + r);
    }
    detail::send_all(fd, detail::encode_command(args));
    return rd.reply();
  }

  /// The server's log so far (stdout and stderr of the process).
  std::string read_log() const {
    std::ifstream in(dir_ + "/redis.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  // Starts the process on port_ and waits for it to answer; false if it exited or
  // never answered (the child is then killed and reaped).
  bool launch() {
    std::vector<std::string> args = {opt_.executable,
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir_,
                                     "--daemonize",
                                     "no",
                                     "--logfile",
                                     ""};
    if (opt_.unix_socket) {
      args.insert(args.end(), {"--unixsocket", unix_path(), "--unixsocketperm", "700"});
    }
    if (!opt_.tls_args.empty()) {
      args.insert(args.end(), {"--tls-port", std::to_string(tls_port_)});
      args.insert(args.end(), opt_.tls_args.begin(), opt_.tls_args.end());
    }
    args.insert(args.end(), opt_.extra_args.begin(), opt_.extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log_path = dir_ + "/redis.log";
    const pid_t parent = ::getpid();

    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("redis_server: fork failed");
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (log >= 0) {
        ::dup2(log, 1);
        ::dup2(log, 2);
      }
      // Die with the test process even if it is killed before its destructors run.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    if (wait_ready()) return true;
    kill();
    return false;
  }

  bool wait_ready() {
    const auto until = std::chrono::steady_clock::now() + opt_.start_timeout;
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {  // exited (e.g. port taken)
        pid_ = -1;
        return false;
      }
      int fd = detail::connect_loopback(port_, std::chrono::milliseconds(500));
      if (fd >= 0) {
        bool ok = false;
        try {
          detail::send_all(fd, detail::encode_command({"PING"}));
          detail::harness_reader rd(fd);
          std::string r = rd.reply();  // PONG, or -NOAUTH when a password is required
          ok = !r.empty() && r.rfind("-LOADING", 0) != 0;
        } catch (const std::exception&) {
        }
        ::close(fd);
        if (ok) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void reap_blocking() {
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  void cleanup_dir() noexcept {
    std::error_code ignore;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignore);
  }

  options opt_;
  std::string dir_;
  std::uint16_t port_ = 0;
  std::uint16_t tls_port_ = 0;
  pid_t pid_ = -1;
};

/// A loopback TCP server that accepts every connection and never reads or writes:
/// connect succeeds, requests vanish, replies never come. For timeout tests. Given a
/// `greeting`, it writes those bytes to each connection once it is accepted (e.g. garbage
/// for protocol-error tests) and is silent afterwards.
class black_hole_server {
 public:
  explicit black_hole_server(std::string greeting = {}) : greeting_(std::move(greeting)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error("black_hole_server: socket failed");
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(listen_fd_);
      throw std::runtime_error("black_hole_server: bind/listen failed");
    }
    port_ = ntohs(a.sin_port);
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      ::close(listen_fd_);
      throw std::runtime_error("black_hole_server: pipe failed");
    }
    thread_ = std::thread([this] { run(); });
  }
  black_hole_server(const black_hole_server&) = delete;
  black_hole_server& operator=(const black_hole_server&) = delete;
  ~black_hole_server() {
    char c = 'x';
    [[maybe_unused]] auto n = ::write(wake_[1], &c, 1);
    thread_.join();
    close_accepted();
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  std::uint16_t port() const noexcept { return port_; }
  std::string url() const { return "resp://127.0.0.1:" + std::to_string(port_); }
  /// Connections accepted so far.
  std::size_t accepted() const noexcept { return accepted_.load(); }
  /// Closes every accepted connection (the client sees EOF / connection lost).
  void close_accepted() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }

 private:
  void run() {
    for (;;) {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      int r = ::poll(p, 2, -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 || (p[1].revents & POLLIN)) return;
      if (p[0].revents & POLLIN) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          if (!greeting_.empty()) {
            try {
              detail::send_all(fd, greeting_);
            } catch (const std::exception&) {
            }
          }
          std::lock_guard<std::mutex> lock(mu_);
          fds_.push_back(fd);
          accepted_.fetch_add(1);
        }
      }
    }
  }

  std::string greeting_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::atomic<std::size_t> accepted_{0};
};

}  // namespace kvtier::test
