// kvtier::asio: an Asio connection, constructed (it connects lazily: no server needed).
#include <kvtier/resp/asio_connection.hpp>

#include <string>

static_assert(kvtier::resp::connection<kvtier::resp::asio_connection>);

std::string use_asio() {
  kvtier::resp::asio_connection conn(kvtier::resp::connection_options{});
  return conn.connected() ? "connected?" : "ok";
}
