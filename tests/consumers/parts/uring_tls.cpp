// kvtier::uring_tls: an io_uring connection over OpenSSL, constructed (sets up its ring;
// connects lazily: no server needed; links liburing and OpenSSL's libssl).
#include <kvtier/resp/uring_tls_connection.hpp>

#include <string>

static_assert(kvtier::resp::connection<kvtier::resp::uring_tls_connection>);

std::string use_uring_tls() {
  kvtier::resp::uring_tls_connection conn(kvtier::resp::connection_options{});
  return conn.connected() ? "connected?" : "ok";
}
