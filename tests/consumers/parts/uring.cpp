// kvtier::uring: an io_uring connection, constructed (sets up its ring; connects lazily).
#include <kvtier/resp/uring_connection.hpp>

#include <string>

static_assert(kvtier::resp::connection<kvtier::resp::uring_connection>);

std::string use_uring() {
  kvtier::resp::uring_connection conn(kvtier::resp::connection_options{});
  return conn.connected() ? "connected?" : "ok";
}
