// kvtier/resp/asio_tls_connection.hpp: the Asio RESP connection with TLS (OpenSSL) for rediss://
// and resp+tls:// endpoints; plain resp:// and resp+unix:// endpoints work unchanged.
//
// The handshake runs after the TCP connect, inside the connect's deadline (connection_options::
// connect_timeout and the caller's). The server's certificate chain is checked against
// tls_options::ca_file (or the system's CAs) and its name against the endpoint's host (or
// tls_options::server_name), which is also sent as SNI for a host name; an IP literal is
// checked against the certificate's IP addresses. A failed handshake is errc::tls_failed and
// last_error() says why in OpenSSL's words ("certificate verify failed: certificate has expired",
// "wrong version number" for a plaintext server, ...).
//
//   #include "kvtier/resp/asio_tls_connection.hpp"   // link kvtier::tls
//   kvtier::resp::connection_options opt{.server = kvtier::resp::parse_url("rediss://10.0.0.5:6380").value};
//   opt.tls.ca_file = "/etc/kvtier/ca.pem";
//   kvtier::resp::asio_tls_connection conn(opt);
//   kvtier::remote_store<kvtier::resp::asio_tls_connection> l2(ns, opt);
//
// An idle TLS connection is checked for EOF only (bytes waiting may be a TLS record such as a
// session ticket, not a stray reply). Not thread-safe, like every connection.
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "kvtier/errc.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/connection.hpp"

namespace kvtier::resp {

namespace detail {

/// The OpenSSL policy of basic_asio_connection: a context built once from tls_options, and a
/// TLS stream over the connection's TCP socket per connect.
class asio_openssl_tls {
 public:
  static constexpr bool enabled = true;
  static constexpr auto client = boost::asio::ssl::stream_base::client;
  using stream_type = boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>;

  asio_openssl_tls(boost::asio::io_context&, const connection_options&) {}

  /// A fresh TLS stream over `socket`, configured from `opt`. Errors (a CA, certificate or key
  /// file that does not load) are errc::tls_failed with the reason in `why`.
  std::error_code start(boost::asio::ip::tcp::socket& socket, const connection_options& opt,
                        std::string& why) {
    if (!ctx_) {
      auto ctx = std::make_unique<boost::asio::ssl::context>(boost::asio::ssl::context::tls_client);
      boost::system::error_code e;
      ctx->set_options(boost::asio::ssl::context::default_workarounds | boost::asio::ssl::context::no_sslv2 |
                           boost::asio::ssl::context::no_sslv3 | boost::asio::ssl::context::no_tlsv1 |
                           boost::asio::ssl::context::no_tlsv1_1,
                       e);
      const tls_options& t = opt.tls;
      if (!e) t.ca_file.empty() ? ctx->set_default_verify_paths(e) : ctx->load_verify_file(t.ca_file, e);
      if (e) return fail(why, "CA file '" + t.ca_file + "': " + e.message());
      if (!t.cert_file.empty()) {
        ctx->use_certificate_chain_file(t.cert_file, e);
        if (e) return fail(why, "certificate file '" + t.cert_file + "': " + e.message());
        ctx->use_private_key_file(t.key_file.empty() ? t.cert_file : t.key_file,
                                  boost::asio::ssl::context::pem, e);
        if (e) return fail(why, "key file '" + t.key_file + "': " + e.message());
      }
      ctx_ = std::move(ctx);
    }
    stream_.emplace(socket, *ctx_);
    const std::string& name = opt.tls.server_name.empty() ? opt.server.host : opt.tls.server_name;
    boost::system::error_code e;
    const bool is_address = (boost::asio::ip::make_address(name, e), !e);
    if (!is_address) SSL_set_tlsext_host_name(stream_->native_handle(), name.c_str());  // SNI
    if (opt.tls.verify_peer) {
      stream_->set_verify_mode(boost::asio::ssl::verify_peer, e);
      if (!e) stream_->set_verify_callback(boost::asio::ssl::host_name_verification(name), e);
    } else {
      stream_->set_verify_mode(boost::asio::ssl::verify_none, e);
    }
    if (e) return fail(why, "setting up verification: " + e.message());
    return {};
  }

  bool active() const noexcept { return stream_.has_value(); }
  stream_type& stream() noexcept { return *stream_; }
  void reset() noexcept { stream_.reset(); }

  /// Why the handshake failed: the certificate check's verdict when that failed, else OpenSSL's
  /// (or the socket's) error text.
  std::string explain(const boost::system::error_code& e) const {
    std::string text = e.message();
    if (stream_) {
      const long v = SSL_get_verify_result(const_cast<stream_type&>(*stream_).native_handle());
      if (v != X509_V_OK) text += ": " + std::string(X509_verify_cert_error_string(v));
    }
    if (e == boost::asio::error::eof || e == boost::asio::error::connection_reset)
      text += " (is the server speaking TLS on this port?)";
    return text;
  }

 private:
  static std::error_code fail(std::string& why, std::string text) {
    why = std::move(text);
    return make_error_code(errc::tls_failed);
  }

  std::unique_ptr<boost::asio::ssl::context> ctx_;
  std::optional<stream_type> stream_;
};

}  // namespace detail

/// Asio RESP connection that also speaks TLS (rediss://, resp+tls://).
using asio_tls_connection = basic_asio_connection<detail::asio_openssl_tls>;
static_assert(connection<asio_tls_connection>);

}  // namespace kvtier::resp
