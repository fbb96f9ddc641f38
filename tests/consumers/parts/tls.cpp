// kvtier::tls: an Asio connection over OpenSSL, constructed (it connects lazily: no server
// needed; links OpenSSL's libssl).
#include <kvtier/resp/asio_tls_connection.hpp>

#include <string>

static_assert(kvtier::resp::connection<kvtier::resp::asio_tls_connection>);

std::string use_tls() {
  kvtier::resp::asio_tls_connection conn(kvtier::resp::connection_options{});
  return conn.connected() ? "connected?" : "ok";
}
