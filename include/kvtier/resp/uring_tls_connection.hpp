// kvtier/resp/uring_tls_connection.hpp: the io_uring RESP connection with TLS (OpenSSL) for
// rediss:// and resp+tls:// endpoints; plain resp:// and resp+unix:// endpoints work unchanged.
//
// The ring moves ciphertext: a SEND from, and a RECV into, the buffers of an OpenSSL BIO pair
// (no copy on either side); OpenSSL encrypts and decrypts in memory, and a GET payload is
// decrypted straight into the caller's span. Configuration and failures are those of
// asio_tls_connection (the same code): the CA, certificate and key of tls_options, chain and
// name verification on by default, SNI for a host name, the handshake inside the connect's
// deadline, errc::tls_failed with OpenSSL's reason in last_error() ("certificate verify failed:
// certificate has expired", ...), and every exchange bounded by the caller's deadline.
//
//   #include "kvtier/resp/uring_tls_connection.hpp"   // link kvtier::uring_tls
//   kvtier::resp::connection_options opt{.server = kvtier::resp::parse_url("rediss://10.0.0.5:6380").value};
//   opt.tls.ca_file = "/etc/kvtier/ca.pem";
//   kvtier::remote_store<kvtier::resp::uring_tls_connection> l2(ns, opt);
//
// Not thread-safe, like every connection.
#pragma once

#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/detail/tls_openssl.hpp"
#include "kvtier/resp/uring_connection.hpp"

namespace kvtier::resp {

/// io_uring RESP connection that also speaks TLS (rediss://, resp+tls://).
using uring_tls_connection = basic_uring_connection<detail::tls_engine>;
static_assert(connection<uring_tls_connection>);

}  // namespace kvtier::resp
