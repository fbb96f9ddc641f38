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
// Bytes that arrive after a batch's last reply close the connection, as on a plain one (see
// connection.hpp): after the last reply and before each batch the session is drained without
// waiting. A record that is not data (a session ticket, a key update) is consumed and the
// connection kept; application data nobody asked for, or the session's end, closes it (the
// next batch reconnects). Not thread-safe, like every connection.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "kvtier/errc.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/detail/tls_openssl.hpp"

namespace kvtier::resp {

namespace detail {

/// The OpenSSL policy of basic_asio_connection: a context built once from tls_options, and a
/// TLS stream over the connection's TCP socket per connect. Context, verification settings and
/// failure texts are the ones the io_uring transport uses (detail/tls_openssl.hpp).
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
      ssl_ctx_ptr native;
      if (std::error_code ec = make_tls_client_context(opt.tls, native, why)) return ec;
      ctx_ = std::make_unique<boost::asio::ssl::context>(native.release());  // takes ownership
    }
    stream_.emplace(socket, *ctx_);
    return configure_tls_client(stream_->native_handle(), opt, why);
  }

  bool active() const noexcept { return stream_.has_value(); }
  /// Records received and not yet read by the application (decrypted or not).
  bool has_buffered() noexcept { return SSL_has_pending(stream_->native_handle()) == 1; }
  stream_type& stream() noexcept { return *stream_; }
  void reset() noexcept { stream_.reset(); }

  /// Why the handshake failed: OpenSSL's (or the socket's) error text, the certificate check's
  /// verdict when that failed, and a hint when the peer closed.
  std::string explain(const boost::system::error_code& e) {
    const bool closed = e == boost::asio::error::eof || e == boost::asio::error::connection_reset;
    return tls_failure_text(stream_ ? stream_->native_handle() : nullptr, e.message(), closed);
  }

 private:
  std::unique_ptr<boost::asio::ssl::context> ctx_;
  std::optional<stream_type> stream_;
};

}  // namespace detail

/// Asio RESP connection that also speaks TLS (rediss://, resp+tls://).
using asio_tls_connection = basic_asio_connection<detail::asio_openssl_tls>;
static_assert(connection<asio_tls_connection>);

}  // namespace kvtier::resp
