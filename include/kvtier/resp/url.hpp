// kvtier/resp/url.hpp: server URLs and per-rank URL templates.
//
// Forms accepted:
//   resp://[user[:password]@]host[:port][/db]          TCP; port defaults to 6379, db to 0
//   resp://[user[:password]@][v6addr]:port[/db]        IPv6 literal in brackets
//   resp+unix://[user[:password]@]/path/to.sock[?db=N] Unix socket (absolute path)
//   rediss://... or resp+tls://...                      TCP with TLS (as resp://; see
//                                                       connection_options::tls)
// User and password may be percent-encoded (%40 for '@', %3A for ':').
//
// Templates: "{rank}" is replaced by the rank anywhere in the text, and "{rank+N}"
// is allowed as the whole port, which becomes N + rank. So rank r of every engine
// can talk to its own server instance:
//
//   auto r = kvtier::resp::parse_url("resp://127.0.0.1:{rank+6400}/0", /*rank=*/3);
//   if (!r) std::cerr << r.message << "\n";   // names what is wrong
//   else    use(r.value);                      // r.value.port == 6403
//
// Parsing never throws; a bad URL is errc::bad_url plus a message (with the password shown as
// "***": redact_url() does the same for any log line). A password may also come from a file or
// the environment instead of the URL (apply_password()).
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "kvtier/errc.hpp"

namespace kvtier::resp {

/// Where a server listens and how to log in.
struct endpoint {
  enum class transport : std::uint8_t { tcp, unix_socket };
  transport kind = transport::tcp;
  std::string host{};         ///< TCP: name or address (IPv6 without brackets)
  std::uint16_t port = 6379;  ///< TCP only
  std::string path{};         ///< Unix socket path
  std::string user{};         ///< empty: AUTH with password only (the "default" user)
  std::string password{};     ///< empty: no AUTH
  int db = 0;                 ///< SELECT db after connecting when non-zero
  bool tls = false;           ///< TCP with TLS (rediss://, resp+tls://)

  /// "host:port/db" or "unix:/path/db" without credentials, for messages and logs.
  std::string describe() const {
    std::string s;
    if (kind == transport::unix_socket) {
      s = "unix:" + path;
    } else {
      s = host.find(':') != std::string::npos ? "[" + host + "]" : host;
      s += ":" + std::to_string(port);
    }
    if (db != 0) s += "/" + std::to_string(db);
    return s;
  }
};

/// Result of parse_url: `value` when `ec` is empty, else `message` says what is wrong.
struct url_result {
  endpoint value;
  std::error_code ec;
  std::string message;
  explicit operator bool() const noexcept { return !ec; }
};

namespace detail {

inline std::string conn_redact(std::string_view url);

inline url_result conn_url_error(std::string_view url, std::string what) {
  url_result r;
  r.ec = make_error_code(errc::bad_url);
  r.message = "bad server URL '" + conn_redact(url) + "': " + std::move(what);
  return r;
}

// Decodes %XX escapes; nullopt on a malformed escape.
inline std::optional<std::string> conn_percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    unsigned v = 0;
    auto [p, e] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (e != std::errc{} || p != s.data() + i + 3) return std::nullopt;
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

// Parses a whole decimal string into [lo, hi]; nullopt otherwise.
inline std::optional<long long> conn_parse_int(std::string_view s, long long lo, long long hi) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  long long v = 0;
  auto [p, e] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (e != std::errc{} || p != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

// A database index: digits in [0, 2^30]; else the message that says what is wrong with it.
inline std::optional<std::string> conn_parse_db(std::string_view s, int& db) {
  constexpr long long max_db = 1 << 30;
  const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
  if (!digits) return "database '" + std::string(s) + "' is not a number >= 0";
  const auto v = conn_parse_int(s, 0, max_db);
  if (!v) return "database '" + std::string(s) + "' is out of range 0.." + std::to_string(max_db);
  db = static_cast<int>(*v);
  return std::nullopt;
}

// The URL with its password replaced by "***" (see redact_url).
inline std::string conn_redact(std::string_view url) {
  const std::size_t scheme = url.find("://");
  const std::size_t start = scheme == std::string_view::npos ? 0 : scheme + 3;
  const std::string_view rest = url.substr(start);
  // The userinfo ends at the last '@' (a TCP URL has none after its authority; a raw '/' in
  // a password would otherwise hide it), or at the "@/" before a Unix socket's path.
  const std::size_t at =
      url.substr(0, start).find("unix") != std::string_view::npos ? rest.find("@/") : rest.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  const std::string_view info = rest.substr(0, at);
  const std::size_t colon = info.find(':');
  std::string out(url.substr(0, start));
  // "user:password@" keeps the user; a lone word before '@' is a password (requirepass).
  out += colon == std::string_view::npos ? std::string("***") : std::string(info.substr(0, colon)) + ":***";
  out += rest.substr(at);
  return out;
}

}  // namespace detail

/// `url` with its password replaced by "***", for every message and log line that shows a URL:
///   redact_url("resp://app:s3cret@h:6379/2") == "resp://app:***@h:6379/2"
///   redact_url("resp://s3cret@h:6379")       == "resp://***@h:6379"     (a lone word is a password)
/// A URL without credentials is returned as it is. parse_url's own messages are redacted.
inline std::string redact_url(std::string_view url) { return detail::conn_redact(url); }

/// Replaces every "{rank}" in `tmpl` by `rank`; "{rank+N}" is left for parse_url's port.
inline std::string substitute_rank(std::string_view tmpl, int rank) {
  std::string out;
  constexpr std::string_view tok = "{rank}";
  std::size_t i = 0;
  while (i < tmpl.size()) {
    if (tmpl.substr(i, tok.size()) == tok) {
      out += std::to_string(rank);
      i += tok.size();
    } else {
      out.push_back(tmpl[i++]);
    }
  }
  return out;
}

/// Parses a server URL. `rank` (when given) is substituted for "{rank}" and
/// "{rank+N}"; a template with a placeholder and no rank is an error.
inline url_result parse_url(std::string_view url, std::optional<int> rank = std::nullopt) {
  using detail::conn_url_error;
  // The scheme first: "redis://h:{rank+1}" is a wrong scheme, whatever else it contains.
  // rediss:// and resp+tls:// are TCP endpoints with TLS: host, port, {rank+N} as for resp://.
  constexpr std::string_view tcp_scheme = "resp://", unix_scheme = "resp+unix://";
  constexpr std::string_view tls_schemes[] = {"rediss://", "resp+tls://"};
  std::size_t scheme_size = url.substr(0, tcp_scheme.size()) == tcp_scheme ? tcp_scheme.size() : 0;
  bool is_tls = false;
  for (const std::string_view t : tls_schemes) {
    if (url.substr(0, t.size()) == t) {
      scheme_size = t.size();
      is_tls = true;
    }
  }
  const bool is_tcp = scheme_size != 0;
  if (!is_tcp && url.substr(0, unix_scheme.size()) != unix_scheme) {
    const auto colon = url.find("://");
    return conn_url_error(url,
                          colon == std::string_view::npos
                              ? "missing scheme (expected resp://, resp+unix://, rediss:// or resp+tls://)"
                              : "unsupported scheme '" + std::string(url.substr(0, colon)) +
                                    "' (expected resp, resp+unix, rediss or resp+tls)");
  }
  // "{rank}" as the whole port would make the port the rank itself (0 for rank 0).
  for (std::size_t p = url.find(":{rank}"); is_tcp && p != std::string_view::npos;
       p = url.find(":{rank}", p + 1)) {
    const std::size_t after = p + 7;
    if (after == url.size() || url[after] == '/')
      return conn_url_error(url,
                            "{rank} as the whole port would make the port the rank (0 for rank 0); "
                            "write {rank+N} for port N + rank");
  }
  if (rank && *rank < 0) return conn_url_error(url, "rank " + std::to_string(*rank) + " is negative");
  const std::string text = rank ? substitute_rank(url, *rank) : std::string(url);
  std::string_view s = text;

  // Anything in braces left now is "{rank+N}" (allowed only as a TCP port: after
  // ':' and before '/' or the end) or a placeholder nobody can expand.
  for (std::size_t b = s.find('{'); b != std::string_view::npos; b = s.find('{', b + 1)) {
    const std::size_t e = s.find('}', b);
    if (e == std::string_view::npos)
      return conn_url_error(url, "unclosed '{' in '" + std::string(s.substr(b)) + "'");
    const std::string_view ph = s.substr(b, e - b + 1);
    if (ph.substr(0, 6) != "{rank+" && ph != "{rank}")
      return conn_url_error(
          url, "unknown placeholder " + std::string(ph) + " (only {rank} anywhere and {rank+N} as the port)");
    if (!rank)
      return conn_url_error(url, "contains the placeholder " + std::string(ph) + " but no rank was given");
    const bool port_position = b > 0 && s[b - 1] == ':' && (e + 1 == s.size() || s[e + 1] == '/') &&
                               s.substr(0, 12) != "resp+unix://";
    if (!port_position) return conn_url_error(url, std::string(ph) + " is only allowed as the port");
  }

  endpoint ep;
  std::string_view rest;
  if (is_tcp) {
    rest = s.substr(scheme_size);
    ep.tls = is_tls;
  } else {
    ep.kind = endpoint::transport::unix_socket;
    rest = s.substr(unix_scheme.size());
  }

  // userinfo@: TCP: before the last '@' of the authority (up to the first '/');
  // Unix: before the "@/" that starts the path.
  std::size_t at = std::string_view::npos;
  if (ep.kind == endpoint::transport::tcp) {
    at = rest.substr(0, rest.find('/')).rfind('@');
  } else if (!rest.empty() && rest.front() != '/') {
    at = rest.find("@/");
  }
  if (at != std::string_view::npos) {
    const std::string_view info = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    const std::size_t colon = info.find(':');
    auto user = detail::conn_percent_decode(info.substr(0, colon));
    auto pass = colon == std::string_view::npos ? std::optional<std::string>(std::string())
                                                : detail::conn_percent_decode(info.substr(colon + 1));
    if (!user || !pass) return conn_url_error(url, "malformed percent escape in user or password");
    if (colon == std::string_view::npos) {
      // "resp://secret@host": a lone word is the password of the default user (requirepass).
      ep.password = *user;
    } else {
      ep.user = *user;
      ep.password = *pass;
      if (ep.password.empty())
        return conn_url_error(url, "user '" + ep.user + "' given with an empty password");
    }
    if (ep.user.empty() && ep.password.empty())
      return conn_url_error(url, "empty user and password before '@'");
  }

  if (ep.kind == endpoint::transport::unix_socket) {
    std::string_view path = rest;
    const std::size_t q = rest.find('?');
    if (q != std::string_view::npos) {
      path = rest.substr(0, q);
      std::string_view query = rest.substr(q + 1);
      if (query.substr(0, 3) != "db=")
        return conn_url_error(url, "unsupported query '" + std::string(query) + "' (only ?db=N)");
      if (auto bad = detail::conn_parse_db(query.substr(3), ep.db)) return conn_url_error(url, *bad);
    }
    if (path.empty() || path.front() != '/')
      return conn_url_error(url, "Unix socket path must be absolute (resp+unix:///path/to.sock)");
    if (path.size() >= 108) return conn_url_error(url, "Unix socket path longer than 107 bytes");
    ep.path = std::string(path);
    return {std::move(ep), {}, {}};
  }

  // host[:port][/db]
  std::string_view hostport = rest, dbpart;
  const std::size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    dbpart = rest.substr(slash + 1);
    // An '@' after the first '/' means a raw '/' inside the user or password cut the
    // authority short (it must be written %2F).
    if (dbpart.find('@') != std::string_view::npos)
      return conn_url_error(url, "a '/' in the user or password must be percent-encoded as %2F");
    if (dbpart.find('?') != std::string_view::npos)
      return conn_url_error(url, "query parameters are not supported");
    if (!dbpart.empty()) {
      if (auto bad = detail::conn_parse_db(dbpart, ep.db)) return conn_url_error(url, *bad);
    }
  }
  std::string_view host = hostport, port;
  if (!hostport.empty() && hostport.front() == '[') {
    const std::size_t close = hostport.find(']');
    if (close == std::string_view::npos) return conn_url_error(url, "IPv6 address missing its closing ']'");
    host = hostport.substr(1, close - 1);
    std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':')
        return conn_url_error(url, "unexpected '" + std::string(after) + "' after the IPv6 address");
      port = after.substr(1);
      if (port.empty()) return conn_url_error(url, "empty port after ':'");
    }
  } else {
    const std::size_t colon = hostport.rfind(':');
    if (colon != std::string_view::npos) {
      host = hostport.substr(0, colon);
      port = hostport.substr(colon + 1);
      if (port.empty()) return conn_url_error(url, "empty port after ':'");
      if (host.find(':') != std::string_view::npos)
        return conn_url_error(url, "IPv6 addresses need brackets, e.g. resp://[::1]:6379");
    }
  }
  if (host.empty()) return conn_url_error(url, "missing host");
  // '%': host names are not percent-decoded (a literal name or address is expected).
  if (host.find_first_of("{}@ %[]") != std::string_view::npos)
    return conn_url_error(url, "host '" + std::string(host) + "' contains an invalid character");
  ep.host = std::string(host);

  if (!port.empty()) {
    if (port.substr(0, 6) == "{rank+") {
      if (port.back() != '}')
        return conn_url_error(url, "port placeholder '" + std::string(port) + "' must be exactly {rank+N}");
      auto base = detail::conn_parse_int(port.substr(6, port.size() - 7), 0, 65535);
      if (!base)
        return conn_url_error(url,
                              "port placeholder '" + std::string(port) + "': N must be a number in 0..65535");
      const long long p = *base + *rank;
      if (p < 1 || p > 65535)
        return conn_url_error(url, "port " + std::to_string(p) + " from '" + std::string(port) +
                                       "' with rank " + std::to_string(*rank) + " is outside 1..65535");
      ep.port = static_cast<std::uint16_t>(p);
    } else {
      auto p = detail::conn_parse_int(port, 1, 65535);
      if (!p) return conn_url_error(url, "port '" + std::string(port) + "' is not a number in 1..65535");
      ep.port = static_cast<std::uint16_t>(*p);
    }
  }
  return {std::move(ep), {}, {}};
}

/// Where a password kept out of the URL comes from, so it need not appear in argv (where `ps`
/// shows it) or in a config that is logged.
struct password_source {
  std::string file{};                   ///< non-empty: the password is this file's first line
  const char* env = "KVTIER_PASSWORD";  ///< else this environment variable, when set and non-empty
};

/// Gives `ep` (a parsed URL without a password, i.e. the default user) its password from
/// `src`. A URL with a password and a password file both is refused (keep it in one place);
/// the environment variable is used only when the URL has no password and no file is named.
/// Returns "" or a message saying what is wrong (never containing the password).
///
///   auto r = kvtier::resp::parse_url("resp://10.0.0.7:6379");    // no secret in argv
///   std::string err = kvtier::resp::apply_password(r.value, {.file = "/run/secrets/valkey"});
inline std::string apply_password(endpoint& ep, const password_source& src) {
  if (!src.file.empty()) {
    if (!ep.password.empty())
      return "the URL has a password and a password file was given too: keep it in one place";
    std::ifstream in(src.file, std::ios::binary);
    std::string line;
    if (!in || !std::getline(in, line))
      return "cannot read a password from '" + src.file + "'" +
             (in ? "" : ": " + std::string(std::strerror(errno)));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return "the password file '" + src.file + "' starts with an empty line";
    ep.password = std::move(line);
    return {};
  }
  if (ep.password.empty() && src.env != nullptr)
    if (const char* v = std::getenv(src.env); v != nullptr && *v != '\0') ep.password = v;
  return {};
}

}  // namespace kvtier::resp
