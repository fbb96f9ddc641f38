// tests/support/test_pki.hpp: a CA and certificates made with the `openssl` command line in a
// temporary directory (removed by the destructor), for TLS tests and benchmarks.
//
//   kvtier::test::test_pki pki;                       // throws std::runtime_error on failure
//   redis_server srv({.tls_args = pki.server_args()});
//   opt.tls.ca_file = pki.path("ca.pem");
//
// Files: ca.pem (signs the rest), other-ca.pem (a CA nobody trusts), server.pem/.key (CN and
// SAN 127.0.0.1, SAN localhost), client.pem/.key, expired.pem/.key (a server certificate with
// -days 0: notAfter == notBefore, expired a second later).
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace kvtier::test {

class test_pki {
 public:
  test_pki() {
    char tmpl[] = "/tmp/kvtier-tls-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("test_pki: mkdtemp failed");
    dir_ = tmpl;
    const std::string d = dir_ + "/";
    run("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + d + "ca.key -out " + d +
        "ca.pem -days 2 -subj /CN=kvtier-test-ca");
    run("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + d + "other-ca.key -out " + d +
        "other-ca.pem -days 2 -subj /CN=kvtier-other-ca");
    if (FILE* f = std::fopen((d + "san.ext").c_str(), "w")) {
      std::fputs("subjectAltName=IP:127.0.0.1,DNS:localhost\n", f);
      std::fclose(f);
    }
    sign("server", "127.0.0.1", "-days 2");
    sign("client", "kvtier-client", "-days 2");
    sign("expired", "127.0.0.1", "-days 0");
  }
  test_pki(const test_pki&) = delete;
  test_pki& operator=(const test_pki&) = delete;
  ~test_pki() {
    std::error_code ignore;
    std::filesystem::remove_all(dir_, ignore);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  /// redis-server arguments for a TLS port serving certificate `cert` ("server" or "expired"),
  /// requiring client certificates signed by ca.pem unless `client_certs` is false.
  std::vector<std::string> server_args(const std::string& cert = "server", bool client_certs = true) const {
    std::vector<std::string> a = {"--tls-cert-file",   path(cert + ".pem"),  "--tls-key-file",
                                  path(cert + ".key"), "--tls-ca-cert-file", path("ca.pem")};
    if (!client_certs) a.insert(a.end(), {"--tls-auth-clients", "no"});
    return a;
  }

 private:
  static void run(const std::string& cmd) {
    if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0)
      throw std::runtime_error("test_pki: failed: " + cmd);
  }
  void sign(const std::string& name, const std::string& cn, const std::string& days) {
    const std::string d = dir_ + "/";
    run("openssl req -newkey rsa:2048 -nodes -keyout " + d + name + ".key -out " + d + name +
        ".csr -subj /CN=" + cn);
    run("openssl x509 -req -in " + d + name + ".csr -CA " + d + "ca.pem -CAkey " + d +
        "ca.key -CAcreateserial -out " + d + name + ".pem " + days + " -extfile " + d + "san.ext");
  }

  std::string dir_;
};

}  // namespace kvtier::test
