// kvtier/resp/detail/tls_openssl.hpp: the OpenSSL side of kvtier's TLS, shared by both
// transports (target kvtier::openssl): the client SSL_CTX built from tls_options, the per-
// connection settings (SNI, chain and name verification), the failure text, and a sans-io TLS
// engine over a BIO pair that a transport feeds with ciphertext (the io_uring transport).
//
//   kvtier::resp::detail::ssl_ctx_ptr ctx;
//   std::string why;
//   if (auto ec = kvtier::resp::detail::make_tls_client_context(opt.tls, ctx, why)) { /* why says */ }
//
// Internal: use asio_tls_connection or uring_tls_connection.
#pragma once

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include "kvtier/errc.hpp"
#include "kvtier/resp/connection.hpp"

namespace kvtier::resp::detail {

struct ssl_ctx_free {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};
/// An owned SSL_CTX.
using ssl_ctx_ptr = std::unique_ptr<SSL_CTX, ssl_ctx_free>;

/// OpenSSL's reasons for the errors queued on this thread, earliest first ("; " between them);
/// empties the queue. `fallback` when none is queued.
inline std::string take_openssl_errors(std::string_view fallback = "unknown OpenSSL error") {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    const char* r = ERR_reason_error_string(e);
    std::string one = r != nullptr ? r : ("error " + std::to_string(e));
    if (text.find(one) != std::string::npos) continue;  // the same reason twice says nothing more
    if (!text.empty()) text += "; ";
    text += one;
  }
  return text.empty() ? std::string(fallback) : text;
}

/// A TLS client context from `t`: TLS 1.2 or newer, the CA file (or the system's CA paths), a
/// client certificate chain and key when given. A file that does not load is errc::tls_failed
/// with the file and OpenSSL's reason in `why`.
inline std::error_code make_tls_client_context(const tls_options& t, ssl_ctx_ptr& out, std::string& why) {
  auto fail = [&why](std::string text) {
    why = std::move(text) + ": " + take_openssl_errors();
    return make_error_code(errc::tls_failed);
  };
  ERR_clear_error();
  ssl_ctx_ptr ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return fail("creating the TLS context");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  const int ca = t.ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx.get())
                                   : SSL_CTX_load_verify_locations(ctx.get(), t.ca_file.c_str(), nullptr);
  if (ca != 1) return fail("CA file '" + t.ca_file + "'");
  if (!t.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), t.cert_file.c_str()) != 1)
      return fail("certificate file '" + t.cert_file + "'");
    const std::string& key = t.key_file.empty() ? t.cert_file : t.key_file;
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx.get()) != 1)
      return fail("key file '" + key + "'");
  }
  out = std::move(ctx);
  return {};
}

/// Per-connection settings on `ssl`: SNI for a host name, and with tls_options::verify_peer the
/// chain check plus the name check (host name, or the IP address for an IP literal) against
/// tls_options::server_name or the endpoint's host.
inline std::error_code configure_tls_client(SSL* ssl, const connection_options& opt, std::string& why) {
  const std::string& name = opt.tls.server_name.empty() ? opt.server.host : opt.tls.server_name;
  unsigned char addr[16];
  const bool is_address =
      inet_pton(AF_INET, name.c_str(), addr) == 1 || inet_pton(AF_INET6, name.c_str(), addr) == 1;
  bool ok = is_address || SSL_set_tlsext_host_name(ssl, name.c_str()) == 1;  // SNI: names only
  if (opt.tls.verify_peer) {
    SSL_set_verify(ssl, SSL_VERIFY_PEER, nullptr);
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    ok = ok && (is_address ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) == 1
                           : SSL_set1_host(ssl, name.c_str()) == 1);
  } else {
    SSL_set_verify(ssl, SSL_VERIFY_NONE, nullptr);
  }
  if (ok) return {};
  why = "setting up verification of '" + name + "': " + take_openssl_errors();
  return make_error_code(errc::tls_failed);
}

/// Why a handshake failed: `what` (OpenSSL's reason or the socket's), the certificate check's
/// verdict when that failed, and a hint when the peer closed (a plaintext server).
inline std::string tls_failure_text(SSL* ssl, std::string what, bool peer_closed) {
  if (ssl != nullptr) {
    const long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) what += ": " + std::string(X509_verify_cert_error_string(v));
  }
  if (peer_closed) what += " (is the server speaking TLS on this port?)";
  return what;
}

/// A client TLS session that never touches a socket: plaintext in and out through write() and
/// read(), ciphertext through a BIO pair whose buffers the transport reads from (to_send(),
/// then sent()) and receives into (recv_space(), then received()) without a copy. The spans
/// stay valid until sent()/received(): a transport may hand them to the kernel. While a receive
/// into recv_space() is in flight, call neither read() nor handshake() (they move the buffer).
class tls_engine {
 public:
  static constexpr bool enabled = true;
  /// What a call achieved: `ok`, or what it waits for (ciphertext to arrive, or room to write
  /// once to_send() went out), or the end of the session (`closed`: the peer's close_notify;
  /// `failed`: take_openssl_errors() says why).
  enum class status { ok, want_read, want_write, closed, failed };
  static constexpr int buffer_bytes = 256 * 1024;  // ciphertext buffered per direction

  explicit tls_engine(const connection_options&) {}
  tls_engine(const tls_engine&) = delete;
  tls_engine& operator=(const tls_engine&) = delete;
  ~tls_engine() { reset(); }

  /// A fresh session configured from `opt` (the context is built on the first call).
  std::error_code start(const connection_options& opt, std::string& why) {
    reset();
    if (!ctx_)
      if (std::error_code ec = make_tls_client_context(opt.tls, ctx_, why)) return ec;
    ERR_clear_error();
    ssl_ = SSL_new(ctx_.get());
    BIO* inner = nullptr;
    if (ssl_ == nullptr || BIO_new_bio_pair(&inner, buffer_bytes, &net_, buffer_bytes) != 1) {
      why = "creating a TLS session: " + take_openssl_errors();
      reset();
      return make_error_code(errc::tls_failed);
    }
    SSL_set_bio(ssl_, inner, inner);  // the session owns its half
    SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    // A TLS 1.2 renegotiation could make write() read, which moves the receive buffer.
    SSL_set_options(ssl_, SSL_OP_NO_RENEGOTIATION);
    SSL_set_connect_state(ssl_);
    if (std::error_code ec = configure_tls_client(ssl_, opt, why)) {
      reset();
      return ec;
    }
    return {};
  }
  bool active() const noexcept { return ssl_ != nullptr; }
  void reset() noexcept {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (net_ != nullptr) BIO_free(net_);
    ssl_ = nullptr;
    net_ = nullptr;
  }

  /// One handshake step.
  status handshake() {
    ERR_clear_error();
    return verdict(SSL_do_handshake(ssl_));
  }
  /// Encrypts a prefix of `plain`; `n` says how much (ok).
  status write(std::span<const std::byte> plain, std::size_t& n) {
    n = 0;
    ERR_clear_error();
    const int r =
        SSL_write(ssl_, plain.data(), static_cast<int>(std::min<std::size_t>(plain.size(), INT_MAX)));
    if (r > 0) n = static_cast<std::size_t>(r);
    return verdict(r);
  }
  /// Decrypts into a prefix of `into`; `n` says how much (ok).
  status read(std::span<std::byte> into, std::size_t& n) {
    n = 0;
    ERR_clear_error();
    const int r = SSL_read(ssl_, into.data(), static_cast<int>(std::min<std::size_t>(into.size(), INT_MAX)));
    if (r > 0) n = static_cast<std::size_t>(r);
    return verdict(r);
  }
  /// Plaintext bytes decrypted and not read yet.
  std::size_t pending() const noexcept { return static_cast<std::size_t>(SSL_pending(ssl_)); }

  /// Ciphertext waiting to go out (empty: none).
  std::span<const std::byte> to_send() noexcept {
    char* p = nullptr;
    const auto n = BIO_nread0(net_, &p);
    return n > 0 ? std::span<const std::byte>(reinterpret_cast<const std::byte*>(p),
                                              static_cast<std::size_t>(n))
                 : std::span<const std::byte>{};
  }
  void sent(std::size_t n) noexcept {
    char* p = nullptr;
    BIO_nread(net_, &p, static_cast<int>(n));
  }
  /// Room for ciphertext that arrived (empty: the session must read() first).
  std::span<std::byte> recv_space() noexcept {
    char* p = nullptr;
    const auto n = BIO_nwrite0(net_, &p);
    return n > 0 ? std::span<std::byte>(reinterpret_cast<std::byte*>(p), static_cast<std::size_t>(n))
                 : std::span<std::byte>{};
  }
  void received(std::size_t n) noexcept {
    char* p = nullptr;
    BIO_nwrite(net_, &p, static_cast<int>(n));
  }

  /// Why the session failed (after `failed`), or `what` when the transport knows better.
  std::string explain(std::string what = {}, bool peer_closed = false) {
    if (what.empty()) what = take_openssl_errors("connection closed during the handshake");
    return tls_failure_text(ssl_, std::move(what), peer_closed);
  }

 private:
  status verdict(int r) {
    if (r > 0) return status::ok;
    switch (SSL_get_error(ssl_, r)) {
      case SSL_ERROR_WANT_READ:
        return status::want_read;
      case SSL_ERROR_WANT_WRITE:
        return status::want_write;
      case SSL_ERROR_ZERO_RETURN:
        return status::closed;
      default:
        return status::failed;
    }
  }

  ssl_ctx_ptr ctx_;
  SSL* ssl_ = nullptr;
  BIO* net_ = nullptr;  // the transport's half of the pair
};

}  // namespace kvtier::resp::detail
