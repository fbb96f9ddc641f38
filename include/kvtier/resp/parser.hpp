// kvtier/resp/parser.hpp: sans-io, incremental RESP2/RESP3 reply parser.
//
// The parser owns one fixed-size read buffer (parser_limits::buffer_bytes) and never grows it.
// The caller asks prepare() where to read the next bytes, reads into that span, and reports the
// count with commit(); next() then returns every complete top-level reply. Any split of the
// input gives the same replies.
//
// Large bulk strings never pass through a growing buffer:
//  - a reply registered with expect_destination() whose bulk length equals the destination's size
//    has its payload read straight into the caller's span (prepare() returns a slice of it);
//  - a destination may carry a gate (destination_gate): once its first part (e.g. a value
//    header) is completely filled, the gate decides whether the rest of the payload goes into
//    the later parts or is discarded; no byte reaches a later part before the gate said yes;
//  - otherwise the payload goes into value::str, allocated once at its known length after the
//    limits are checked (prepare() returns a slice of that string once the buffer is drained).
// Limits (bulk length, aggregate count, nesting depth, header-line length) are checked before
// anything is allocated. A violation or malformed input is a sticky error (errc::too_large or
// errc::protocol_error): the connection must be closed; the parser never resyncs. A reply whose
// first byte starts no RESP type (an HTTP server's answer, say) fails as soon as that byte is in. RESP3
// streamed strings and aggregates (`$?`, `*?`), which Redis and Valkey never send, are a
// protocol error. RESP3 pushes (`>`) come back as top-level values of type::push; they are not
// replies to a command and take no destination.
//
//   kvtier::resp::parser p;
//   p.expect_destination(std::span(&chunk_span, 1));   // GET reply lands in chunk_span
//   for (;;) {
//     std::span<std::byte> into = p.prepare();
//     std::size_t n = read(fd, into.data(), into.size());
//     p.commit(n);
//     std::error_code ec;
//     while (auto v = p.next(ec)) handle(*v);          // v->into_destination == true
//     if (ec) { close(fd); break; }
//   }
#pragma once

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/errc.hpp"
#include "kvtier/resp/types.hpp"

namespace kvtier::resp {

namespace detail {

/// True for the bytes that start a RESP2/RESP3 value.
constexpr bool resp_type_byte(char c) noexcept {
  return std::string_view("+-:$*_,#!=(%~>|").find(c) != std::string_view::npos;
}

/// Strict RESP integer: [+|-]digits, no spaces, no overflow.
inline bool parse_int64(std::string_view s, std::int64_t& out) noexcept {
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty()) return false;
  std::uint64_t magnitude = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (magnitude > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
    magnitude = magnitude * 10 + d;
  }
  constexpr auto max_pos = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (negative) {
    if (magnitude > max_pos + 1) return false;
    out = magnitude == max_pos + 1 ? std::numeric_limits<std::int64_t>::min()
                                   : -static_cast<std::int64_t>(magnitude);
  } else {
    if (magnitude > max_pos) return false;
    out = static_cast<std::int64_t>(magnitude);
  }
  return true;
}

/// RESP3 double: [+|-]digits[.digits][e[+|-]digits], inf, -inf, nan.
inline bool parse_double(std::string_view s, double& out) noexcept {
  if (s == "inf" || s == "+inf") return out = std::numeric_limits<double>::infinity(), true;
  if (s == "-inf") return out = -std::numeric_limits<double>::infinity(), true;
  if (s == "nan" || s == "-nan") return out = std::numeric_limits<double>::quiet_NaN(), true;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  // Only the decimal grammar: from_chars alone would also take "infinity" and "nan(...)".
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')) return false;
  }
  if (s.empty() || s[0] == '+') return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, std::chars_format::general);
  return ec == std::errc{} && ptr == s.data() + s.size();
}

/// RESP3 big number: [+|-]digits.
inline bool valid_big_number(std::string_view s) noexcept {
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) s.remove_prefix(1);
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace detail

/// Incremental RESP2/RESP3 parser with a fixed internal buffer and zero-copy destinations.
class parser {
 public:
  explicit parser(parser_limits limits = {})
      : limits_(limits),
        cap_(std::max<std::size_t>(limits.buffer_bytes, min_buffer_bytes)),
        buf_(std::make_unique<std::byte[]>(cap_)) {}

  parser(parser&&) noexcept = default;
  parser& operator=(parser&&) noexcept = default;

  /// Smallest internal buffer the parser accepts (a length header must fit).
  static constexpr std::size_t min_buffer_bytes = 32;
  /// A destination at least this large is read to, at the start of its reply, only as far as
  /// its length line and its first part (prepare()), so none of its payload passes through the
  /// internal buffer (a second copy).
  static constexpr std::size_t short_head_read_min = 32u << 10;
  /// Largest piece a destination's `landed` observer sees at once, and so the largest direct
  /// read into such a destination: small enough to stay in a core's L2 cache until observed.
  static constexpr std::size_t landed_slice_bytes = 256u << 10;

  const parser_limits& limits() const noexcept { return limits_; }

  /// Registers where the payload of the next top-level reply goes when that reply is a bulk
  /// string (a GET reply). One destination per reply, consumed in order by every top-level reply
  /// except RESP3 pushes; register before that reply begins to arrive (one registered later is
  /// for the reply after it). Total size = sum of the parts (the list is copied; the memory stays
  /// the caller's). A bulk of exactly that length is written into the parts and comes back with
  /// into_destination = true, length = bytes, str empty. A bulk of another length is read
  /// through the internal buffer and discarded (the stream stays in sync) and comes back with
  /// into_destination = false, length = its real length, str empty. Any other reply (null for a
  /// missing key, an error, an array, ...) consumes the destination untouched; a bulk string
  /// nested in an aggregate never goes to a destination.
  ///
  /// With a `gate`, a bulk of exactly the total length is written into the first part; as soon
  /// as that part is completely filled (at once if it is empty) and before any byte goes to a
  /// later part (bytes already buffered included), gate.fn(gate.context, first part) runs once.
  /// true: the payload continues into the later parts as above. false: the rest of the payload
  /// is read through the internal buffer and discarded (later parts untouched, stream in sync)
  /// and the reply comes back with into_destination = false, refused_by_gate = true,
  /// length = its real length, str empty. The first part then holds the bytes the gate saw.
  /// With gate.landed set, every byte of the later parts is handed to it as it lands, in order,
  /// in pieces of at most landed_slice_bytes (a refused payload is never shown to it).
  void expect_destination(std::span<const std::span<std::byte>> parts, destination_gate gate = {}) {
    destination d;
    d.parts.assign(parts.begin(), parts.end());
    for (const auto& p : parts) d.total += p.size();
    d.active = true;
    d.gate = gate;
    dests_.push_back(std::move(d));
  }
  /// Single-span form of expect_destination().
  void expect_destination(std::span<std::byte> dst, destination_gate gate = {}) {
    expect_destination(std::span<const std::span<std::byte>>(&dst, 1), gate);
  }
  /// The next reply has no destination (keeps the destination queue aligned with the requests).
  void expect_no_destination() { dests_.push_back(destination{}); }

  /// Destinations (and expect_no_destination() slots) registered and not yet consumed.
  std::size_t pending_destinations() const noexcept { return dests_.size(); }

  /// Where to read the next bytes: a slice of the current destination (or of the reply string
  /// being assembled) while the parser is inside such a payload and has no buffered bytes left,
  /// else the internal buffer's free tail; when the next reply's destination is large
  /// (short_head_read_min), only as much of that tail as its length line and first part need,
  /// so its payload is then read straight into the destination. Valid until the next call on
  /// the parser. Empty only if the buffer is full of bytes next() has not looked at yet: call
  /// next() first.
  std::span<std::byte> prepare() {
    direct_ = false;
    if (!err_ && mode_ == mode::payload && sink_ != sink::discard && remaining_ > 0 && begin_ == end_) {
      direct_ = true;
      return sink_span();
    }
    if (begin_ == end_) {
      begin_ = end_ = 0;
    } else if (begin_ > 0 && cap_ - end_ < cap_ / 4) {
      std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    return {buf_.get() + end_, std::min(cap_ - end_, head_read_limit())};
  }

  /// True when the span the last prepare() returned is a payload slice (a destination or the
  /// reply string): it holds only bytes still to come of one bulk string (all of them, or the
  /// next slice), so a transport may fill it completely in one go (e.g. MSG_WAITALL) without
  /// reading past the reply.
  bool prepared_payload() const noexcept { return direct_; }

  /// `n` bytes were written at the start of the span the last prepare() returned.
  void commit(std::size_t n) {
    if (direct_) {
      assert(n <= sink_span().size());
      advance_sink(std::min(n, sink_span().size()));
    } else {
      assert(n <= cap_ - end_);
      end_ += std::min(n, cap_ - end_);
    }
    direct_ = false;
  }

  /// The next complete top-level reply, if any. On a protocol or limit violation returns nullopt
  /// with `ec` set, now and on every later call (sticky): close the connection, then reset().
  std::optional<value> next(std::error_code& ec) {
    direct_ = false;
    ec = err_;
    if (err_) return std::nullopt;
    auto out = parse();
    ec = err_;
    return out;
  }

  /// The sticky error, if any.
  std::error_code error() const noexcept { return err_; }

  /// Bytes received and not parsed yet (in the internal buffer).
  std::size_t buffered() const noexcept { return end_ - begin_; }

  /// After a reconnect: drops buffered bytes, the reply in progress, destinations and the error.
  void reset() {
    begin_ = end_ = scanned_ = 0;
    dests_.clear();
    stack_.clear();
    cur_ = value{};
    mode_ = mode::header;
    sink_ = sink::str;
    remaining_ = filled_ = part_ = part_off_ = 0;
    direct_ = false;
    gated_ = false;
    slot_ = false;
    reply_elements_ = 0;
    err_.clear();
  }

 private:
  enum class mode : std::uint8_t { header, payload, payload_crlf };
  enum class sink : std::uint8_t { str, dest, discard };
  struct destination {
    std::vector<std::span<std::byte>> parts;
    std::size_t total = 0;
    bool active = false;  // false: expect_no_destination()
    destination_gate gate;
  };
  struct frame {
    value agg;
    std::size_t remaining = 0;
  };

  std::optional<value> fail(errc e) {
    err_ = make_error_code(e);
    return std::nullopt;
  }

  // How many bytes the internal buffer may take in now: before a top-level reply whose
  // destination is large, just what precedes its payload (the CRLF ending the reply before, its
  // length line "$<total>\r\n" and its first part, the value header) minus what is buffered
  // already; otherwise no limit. Only a read size: a reply of another kind or length is parsed
  // as ever, over more reads.
  std::size_t head_read_limit() const noexcept {
    constexpr std::size_t none = static_cast<std::size_t>(-1);
    if (!stack_.empty() || (mode_ != mode::header && mode_ != mode::payload_crlf)) return none;
    const std::size_t before = mode_ == mode::payload_crlf ? 2 : 0;         // the last reply's CRLF
    const std::size_t next = mode_ == mode::payload_crlf && slot_ ? 1 : 0;  // it holds dests_[0]
    if (next >= dests_.size()) return none;
    const destination& d = dests_[next];
    if (!d.active || d.total < short_head_read_min) return none;
    std::size_t digits = 1;
    for (std::size_t t = d.total; t >= 10; t /= 10) ++digits;
    const std::size_t head = before + 3 + digits + (d.parts.empty() ? 0 : d.parts[0].size());
    const std::size_t have = end_ - begin_;
    return have < head ? head - have : none;
  }

  // Contiguous span the next payload bytes go to (never longer than remaining_). A reply string
  // grows with the bytes that arrive (doubling, from str_step), not to its announced length: a
  // header that announces 512 MB costs 64 KiB until the bytes come.
  std::span<std::byte> sink_span() {
    if (sink_ == sink::str) {
      if (filled_ == cur_.str.size())
        cur_.str.resize(filled_ + std::min(remaining_, std::max(filled_, str_step)));
      return {reinterpret_cast<std::byte*>(cur_.str.data()) + filled_, cur_.str.size() - filled_};
    }
    if (sink_ == sink::dest) {
      const destination& d = dests_.front();
      // advance_sink() skips exhausted and empty parts, so parts[part_] has room.
      std::size_t n = std::min(d.parts[part_].size() - part_off_, remaining_);
      if (d.gate.landed != nullptr && gated_) n = std::min(n, landed_slice_bytes);
      return {d.parts[part_].data() + part_off_, n};
    }
    return {};
  }

  void advance_sink(std::size_t n) {
    filled_ += n;
    remaining_ -= n;
    if (sink_ != sink::dest) return;
    // Past the gate, every byte belongs to a later part; the observer sees it now, hot.
    const destination& d = dests_.front();
    if (gated_ && d.gate.landed != nullptr && n > 0)
      d.gate.landed(d.gate.context, std::span<const std::byte>(d.parts[part_].data() + part_off_, n));
    part_off_ += n;
    skip_full_parts();
    run_gate();
  }
  void skip_full_parts() {
    auto& parts = dests_.front().parts;
    while (part_ < parts.size() && part_off_ == parts[part_].size()) {
      ++part_;
      part_off_ = 0;
    }
  }

  // Once the destination's first part is full, asks its gate (once per reply) whether the rest
  // may follow; a refusal turns the sink into discard before any byte reaches a later part.
  // sink_span() never extends past the first part, so neither a direct read nor a copy from
  // the buffer can get ahead of this check.
  void run_gate() {
    if (gated_ || sink_ != sink::dest) return;
    const destination& d = dests_.front();
    const std::size_t first = d.parts.empty() ? 0 : d.parts[0].size();
    if (filled_ < first) return;
    gated_ = true;
    if (!d.gate) return;
    const std::span<const std::byte> head = d.parts.empty() ? std::span<const std::byte>() : d.parts[0];
    if (d.gate.fn(d.gate.context, head)) return;
    sink_ = sink::discard;
    cur_.into_destination = false;
    cur_.refused_by_gate = true;
  }

  // Copies buffered payload bytes into the sink.
  void fill_from_buffer() {
    while (remaining_ > 0 && begin_ < end_) {
      const std::size_t n = std::min(end_ - begin_, remaining_);
      if (sink_ == sink::discard) {
        begin_ += n;
        advance_sink(n);
        continue;
      }
      std::span<std::byte> to = sink_span();
      const std::size_t k = std::min(n, to.size());
      std::memcpy(to.data(), buf_.get() + begin_, k);
      begin_ += k;
      advance_sink(k);
    }
  }

  // Next header line [type byte .. CR) if complete; sets err_ on a malformed or too long line.
  std::optional<std::string_view> take_line() {
    const char* base = reinterpret_cast<const char*>(buf_.get());
    const std::size_t from = begin_ + scanned_;
    const void* cr = from < end_ ? std::memchr(base + from, '\r', end_ - from) : nullptr;
    if (cr == nullptr) {
      scanned_ = end_ - begin_;
      if (end_ - begin_ >= cap_) fail(errc::too_large);  // a header line longer than the buffer
      return std::nullopt;
    }
    const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(cr) - base);
    if (at + 1 >= end_) {
      scanned_ = at - begin_;
      if (end_ - begin_ >= cap_) fail(errc::too_large);
      return std::nullopt;
    }
    if (base[at + 1] != '\n') return fail(errc::protocol_error), std::nullopt;
    std::string_view line(base + begin_, at - begin_);
    if (line.empty() || line.find('\n') != std::string_view::npos)
      return fail(errc::protocol_error), std::nullopt;
    begin_ = at + 2;
    scanned_ = 0;
    return line;
  }

  // Bulk/aggregate length: "-1" (null, where allowed) or decimal digits.
  bool parse_length(std::string_view s, bool allow_null, std::int64_t& out) {
    if (s == "-1" && allow_null) return out = -1, true;
    if (s.empty()) return fail(errc::protocol_error), false;
    std::uint64_t n = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return fail(errc::protocol_error), false;
      if (n >= (std::uint64_t{1} << 58)) return fail(errc::too_large), false;  // far above any limit
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    out = static_cast<std::int64_t>(n);
    return true;
  }

  // Hands a finished value to its parent aggregate; returns it when it completes a top-level reply.
  std::optional<value> deliver(value v) {
    for (;;) {
      if (stack_.empty()) {
        if (slot_) dests_.pop_front();
        slot_ = false;
        reply_elements_ = 0;
        return v;
      }
      // Each aggregate is capped by max_aggregate; this caps a whole reply, so many small
      // nested aggregates cannot turn a few bytes each into ~100 bytes of value each.
      if (++reply_elements_ > limits_.max_reply_elements) return fail(errc::too_large);
      frame& f = stack_.back();
      f.agg.elements.push_back(std::move(v));
      if (--f.remaining > 0) return std::nullopt;
      v = std::move(f.agg);
      stack_.pop_back();
      if (v.kind == type::attribute) return std::nullopt;  // parsed, reported to nobody
      v.length = v.elements.size();
    }
  }

  std::optional<value> begin_aggregate(type kind, std::int64_t count) {
    const auto n = static_cast<std::uint64_t>(count);
    if (n > limits_.max_aggregate || stack_.size() + 1 > limits_.max_depth) return fail(errc::too_large);
    const bool pairs = kind == type::map || kind == type::attribute;
    const std::size_t elements = static_cast<std::size_t>(pairs ? 2 * n : n);
    value agg;
    agg.kind = kind;
    if (elements == 0) {
      if (kind == type::attribute) return std::nullopt;
      return deliver(std::move(agg));
    }
    // The count is the peer's word: reserve a little, grow as elements really arrive.
    agg.elements.reserve(std::min<std::size_t>(elements, 16));
    stack_.push_back(frame{std::move(agg), elements});
    return std::nullopt;
  }

  std::optional<value> begin_blob(type kind, std::int64_t len) {
    const auto n = static_cast<std::size_t>(len);
    if (n > limits_.max_bulk) return fail(errc::too_large);
    cur_ = value{};
    cur_.kind = kind;
    cur_.length = n;
    sink_ = sink::str;
    if (kind == type::bulk_string && stack_.empty() && slot_ && dests_.front().active) {
      sink_ = dests_.front().total == n ? sink::dest : sink::discard;
    }
    if (sink_ == sink::dest) {
      cur_.into_destination = true;
      part_ = part_off_ = 0;
      gated_ = false;
      skip_full_parts();
    }
    remaining_ = n;
    filled_ = 0;
    run_gate();  // an empty first part: the gate decides before any byte arrives
    mode_ = mode::payload;
    return std::nullopt;
  }

  std::optional<value> scalar(type kind) {
    value v;
    v.kind = kind;
    return v;
  }

  std::optional<value> parse() {
    for (;;) {
      if (mode_ == mode::payload) {
        fill_from_buffer();
        if (remaining_ > 0) return std::nullopt;
        mode_ = mode::payload_crlf;
      }
      if (mode_ == mode::payload_crlf) {
        if (end_ - begin_ < 2) return std::nullopt;
        if (buf_[begin_] != std::byte{'\r'} || buf_[begin_ + 1] != std::byte{'\n'})
          return fail(errc::protocol_error);
        begin_ += 2;
        mode_ = mode::header;
        if (cur_.kind == type::verbatim_string && (cur_.str.size() < 4 || cur_.str[3] != ':')) {
          return fail(errc::protocol_error);
        }
        value v = std::move(cur_);
        cur_ = value{};
        if (auto done = deliver(std::move(v))) return done;
        continue;
      }

      // A first byte that starts no RESP type fails at once, without waiting for a CRLF that
      // may never come (an HTTP server's "<html>\n..." has none, then it closes).
      if (scanned_ == 0 && begin_ < end_ && !detail::resp_type_byte(static_cast<char>(buf_[begin_])))
        return fail(errc::protocol_error);
      const auto line = take_line();
      if (!line) return std::nullopt;
      const char t = (*line)[0];
      const std::string_view body = line->substr(1);
      // The first header of a top-level reply (attributes before it do not count) takes the
      // next destination slot; a push is not a reply and takes none.
      if (stack_.empty() && t != '|') slot_ = t != '>' && !dests_.empty();
      std::optional<value> v;  // a finished scalar, if the header is one
      std::int64_t n = 0;
      switch (t) {
        case '+':
        case '-':
        case '(':
          v = scalar(t == '+' ? type::simple_string : t == '-' ? type::simple_error : type::big_number);
          if (t == '(' && !detail::valid_big_number(body)) return fail(errc::protocol_error);
          v->str.assign(body);
          v->length = body.size();
          break;
        case ':':
          v = scalar(type::integer);
          if (!detail::parse_int64(body, v->integer)) return fail(errc::protocol_error);
          break;
        case ',':
          v = scalar(type::double_);
          if (!detail::parse_double(body, v->dbl)) return fail(errc::protocol_error);
          break;
        case '#':
          if (body != "t" && body != "f") return fail(errc::protocol_error);
          v = scalar(type::boolean);
          v->boolean = body == "t";
          break;
        case '_':
          if (!body.empty()) return fail(errc::protocol_error);
          v = scalar(type::null);
          break;
        case '$':
        case '!':
        case '=':
          if (!parse_length(body, t == '$', n)) return std::nullopt;
          if (n < 0) {
            v = scalar(type::null);
            break;
          }
          begin_blob(t == '$' ? type::bulk_string : t == '!' ? type::bulk_error : type::verbatim_string, n);
          if (err_) return std::nullopt;
          continue;
        case '*':
        case '%':
        case '~':
        case '>':
        case '|': {
          if (!parse_length(body, t == '*', n)) return std::nullopt;
          if (n < 0) {
            v = scalar(type::null);
            break;
          }
          const type kind = t == '*'   ? type::array
                            : t == '%' ? type::map
                            : t == '~' ? type::set
                            : t == '>' ? type::push
                                       : type::attribute;
          auto done = begin_aggregate(kind, n);
          if (err_ || done) return done;
          continue;
        }
        default:
          return fail(errc::protocol_error);
      }
      if (auto done = deliver(std::move(*v))) return done;
    }
  }

  parser_limits limits_;
  std::size_t cap_;
  std::unique_ptr<std::byte[]> buf_;
  std::size_t begin_ = 0;    // first unparsed byte
  std::size_t end_ = 0;      // one past the last received byte
  std::size_t scanned_ = 0;  // bytes after begin_ already searched for CR
  std::deque<destination> dests_;
  std::vector<frame> stack_;
  value cur_;  // blob in progress
  mode mode_ = mode::header;
  static constexpr std::size_t str_step = 64u << 10;  // first allocation of a reply string
  sink sink_ = sink::str;
  std::size_t remaining_ = 0;       // payload bytes still to come
  std::size_t filled_ = 0;          // payload bytes written into the sink
  std::size_t part_ = 0;            // destination part being filled
  std::size_t part_off_ = 0;        // offset in that part
  bool direct_ = false;             // the last prepare() returned a sink slice
  bool gated_ = false;              // the destination's gate has run for the reply in progress
  std::size_t reply_elements_ = 0;  // elements of the reply in progress, all levels
  bool slot_ = false;               // the top-level reply in progress owns dests_.front()
  std::error_code err_;
};

}  // namespace kvtier::resp
