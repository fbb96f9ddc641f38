// Unit tests of the transport-neutral half of a RESP connection (connection_base) over a
// scripted in-memory transport: what the "server" sends is fixed per exchange, so stream
// faults (extra replies, junk after the last reply) are deterministic, with no socket.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/resp/connection.hpp"

using namespace std::chrono_literals;
using kvtier::deadline;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::resp::batch;
using kvtier::resp::connection_base;
using kvtier::resp::connection_options;
using kvtier::resp::type;

namespace {

// Each exchange swallows the whole request, then "receives" the next scripted reply text
// (in pieces of at most `chunk` bytes), stopping once the batch has all its replies.
class scripted_connection : public connection_base<scripted_connection> {
 public:
  explicit scripted_connection(std::vector<std::string> replies, std::size_t chunk = 1 << 20,
                               connection_options opt = {})
      : connection_base(std::move(opt)), replies_(std::move(replies)), chunk_(chunk) {}

  std::size_t exchanges = 0;
  std::size_t closes = 0;

  std::error_code transport_connect(deadline) {
    open_ = true;
    return {};
  }
  std::error_code transport_exchange(deadline) {
    if (!open_) return make_error_code(errc::connection_lost);  // like a closed socket
    while (write_pending()) {
      std::size_t n = 0;
      for (const auto& s : write_buffers()) n += s.size();
      on_written(n);
    }
    const std::string text = exchanges < replies_.size() ? replies_[exchanges] : std::string();
    ++exchanges;
    std::size_t off = 0;
    while (!replies_done()) {
      if (off == text.size()) return make_error_code(errc::connection_lost);
      const std::span<std::byte> into = read_span();
      const std::size_t n = std::min({into.size(), text.size() - off, chunk_});
      std::memcpy(into.data(), text.data() + off, n);
      off += n;
      if (std::error_code ec = on_read(n)) return ec;
    }
    return {};
  }
  void transport_close() noexcept {
    ++closes;
    open_ = false;
  }
  bool transport_peer_closed() noexcept { return false; }

 private:
  std::vector<std::string> replies_;
  std::size_t chunk_;
  bool open_ = false;
};

}  // namespace

TEST_CASE("connection_base: replies beyond the batch are not counted and close the stream", "[unit]") {
  // One command, two replies arrive in the same read: the second was never asked for.
  scripted_connection conn({"+PONG\r\n+PONG\r\n", "+OK\r\n"});
  batch b;
  b.add({"PING"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(1s)));
  REQUIRE(b.completed() == 1);
  REQUIRE(b.replies().size() == 1);
  REQUIRE(b.reply(0).str == "PONG");
  REQUIRE_FALSE(conn.connected());  // the stream cannot be trusted after unrequested bytes

  // The next batch starts on a fresh stream: its reply is its own, not the stray PONG.
  b.clear();
  b.add({"SET", "k", "v"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(1s)));
  REQUIRE(b.completed() == 1);
  REQUIRE(b.reply(0).kind == type::simple_string);
  REQUIRE(b.reply(0).str == "OK");
}

TEST_CASE("connection_base: many stray replies after a short batch stay out of it", "[unit]") {
  std::string flood = ":1\r\n";
  for (int i = 0; i < 64; ++i) flood += ":2\r\n";
  scripted_connection conn({flood});
  batch b;
  b.add({"EXISTS", "k"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(1s)));
  REQUIRE(b.completed() == 1);
  REQUIRE(b.reply(0).integer == 1);
  REQUIRE_FALSE(conn.connected());
}

TEST_CASE("connection_base: an empty command is refused before anything is sent", "[unit]") {
  // A server answers nothing to "*0\r\n", so every later reply would be matched to the
  // command before it. The batch is refused whole instead.
  scripted_connection conn({"+PONG\r\n"});
  batch b;
  b.add(std::span<const std::string_view>{});
  b.add({"PING"});
  REQUIRE(conn.execute(b, deadline_after(1s)) == errc::invalid_argument);
  REQUIRE(b.completed() == 0);
  REQUIRE(conn.exchanges == 0);
  std::vector<std::byte> dst(4);
  b.clear();  // clear() forgets the empty command
  b.add_into(std::span<const std::string_view>{}, std::span<const std::span<std::byte>>{});
  REQUIRE(conn.execute(b, deadline_after(1s)) == errc::invalid_argument);
  b.clear();
  b.add({"PING"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(1s)));
  REQUIRE(b.reply(0).str == "PONG");
}

TEST_CASE("connection_base: bytes after the handshake's replies fail that connect attempt", "[unit]") {
  connection_options opt;
  opt.server.db = 1;                // SELECT 1: a handshake round trip
  opt.reconnect_backoff_min = 0ms;  // no backoff: the next call tries again at once (else it fails fast)
  // The handshake gets one stray reply more than it asked for: the stream is closed, so the
  // attempt failed (it used to count as connected and send the batch into a closed socket).
  scripted_connection conn({"+OK\r\n+OK\r\n", "+OK\r\n", "+PONG\r\n"}, 1 << 20, opt);
  batch b;
  b.add({"PING"});
  REQUIRE(conn.execute(b, deadline_after(1s)) == errc::protocol_error);
  REQUIRE(conn.stats().connects == 0);
  REQUIRE(conn.stats().connect_failures == 1);
  REQUIRE_FALSE(conn.connected());
  REQUIRE_FALSE(conn.execute(b, deadline_after(1s)));  // the next attempt: a clean handshake
  REQUIRE(b.reply(0).str == "PONG");
  REQUIRE(conn.connected());
  REQUIRE(conn.stats().connects == 1);
}

TEST_CASE(
    "connection_base: in reconnect backoff a call fails at once, even when its deadline covers the wait",
    "[unit]") {
  connection_options opt;
  opt.server.db = 99;  // SELECT 99: the scripted server refuses it once, then would accept
  opt.reconnect_backoff_min = 1000ms;
  scripted_connection conn({"-ERR DB index is out of range\r\n", "+OK\r\n", "+PONG\r\n"}, 1 << 20, opt);
  batch b;
  b.add({"PING"});
  REQUIRE(conn.execute(b, deadline_after(5s)) == errc::server_error);
  REQUIRE(conn.down_until().has_value());
  REQUIRE(conn.last_connect_error() == errc::server_error);
  // The next attempt is 1 s away and this deadline 5 s: it used to sleep 1 s and try again (and
  // succeed here); now it fails at once with the last attempt's error and does not try.
  REQUIRE(conn.execute(b, deadline_after(5s)) == errc::server_error);
  REQUIRE(conn.stats().connect_failures == 1);
  REQUIRE(conn.stats().down_refusals == 1);
  REQUIRE(conn.exchanges == 1);
  INFO(conn.last_error());
  REQUIRE(conn.last_error().find("SELECT: ERR DB index is out of range") != std::string::npos);
  REQUIRE(conn.last_error().find("server down") != std::string::npos);
}
