// kvtier/resp/encoder.hpp: sans-io RESP encoder with scatter-gather output.
//
// request_builder turns a pipelined batch of commands into an iovec-style list of byte spans.
// Every command is a RESP array of bulk strings (binary-safe; never an inline command). Small
// parts (array and bulk headers, keys, short arguments) are copied into one internal buffer; a
// payload passed to command_with_payload() is referenced, so a SET value goes from the caller's
// buffer to the socket without a copy.
//
//   kvtier::resp::request_builder b;
//   b.command({"EXISTS", key});
//   std::span<const std::byte> value = std::as_bytes(std::span(chunk));
//   b.command_with_payload({"SET", key}, value);        // value referenced, not copied
//   for (std::span<const std::byte> part : b.buffers()) { /* writev / asio buffer sequence */ }
//
// serialize() writes any `value` in RESP3 form (server side, tests, fuzz seeds).
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/resp/types.hpp"

namespace kvtier::resp {

namespace detail {
/// Writes "<type_byte><n>\r\n" into `tmp` and returns it.
inline std::string_view format_header(char (&tmp)[24], char type_byte, std::size_t n) noexcept {
  tmp[0] = type_byte;
  char* end = std::to_chars(tmp + 1, tmp + 22, n).ptr;  // 21 bytes always hold a size_t
  *end++ = '\r';
  *end++ = '\n';
  return {tmp, static_cast<std::size_t>(end - tmp)};
}
}  // namespace detail

/// Builds one pipelined batch of commands as a scatter-gather list.
class request_builder {
 public:
  /// Appends one command; every argument is copied.
  void command(std::initializer_list<std::string_view> args) {
    command(std::span<const std::string_view>(args.begin(), args.size()));
  }
  /// Same, for an argument count known only at run time (EXISTS k1 ... kN, MGET, ...).
  void command(std::span<const std::string_view> args) {
    begin_command(args, 0);
    ++commands_;
  }

  /// Like command(), but the last argument is the concatenation of `payload_parts`, which stay
  /// caller-owned and are referenced zero-copy until the batch is written (e.g. header + value).
  void command_with_payload(std::initializer_list<std::string_view> args,
                            std::span<const std::span<const std::byte>> payload_parts) {
    command_with_payload(std::span<const std::string_view>(args.begin(), args.size()), payload_parts);
  }
  void command_with_payload(std::initializer_list<std::string_view> args,
                            std::initializer_list<std::span<const std::byte>> payload_parts) {
    command_with_payload(
        std::span<const std::string_view>(args.begin(), args.size()),
        std::span<const std::span<const std::byte>>(payload_parts.begin(), payload_parts.size()));
  }
  void command_with_payload(std::initializer_list<std::string_view> args,
                            std::span<const std::byte> payload) {
    command_with_payload(std::span<const std::string_view>(args.begin(), args.size()),
                         std::span<const std::span<const std::byte>>(&payload, 1));
  }
  void command_with_payload(std::span<const std::string_view> args,
                            std::span<const std::span<const std::byte>> payload_parts) {
    std::size_t payload_bytes = 0;
    for (const auto& p : payload_parts) payload_bytes += p.size();
    begin_command(args, 1);
    append_bulk_header(payload_bytes);
    for (const auto& p : payload_parts) append_external(p);
    append_small("\r\n");
    ++commands_;
  }

  /// Number of commands in the batch.
  std::size_t commands() const noexcept { return commands_; }

  /// The whole batch, in order, as byte spans; valid until the next mutation or clear().
  std::span<const std::span<const std::byte>> buffers() {
    iov_.clear();
    for (const segment& s : segments_) {
      const std::byte* base =
          s.external ? s.external : reinterpret_cast<const std::byte*>(small_.data()) + s.offset;
      iov_.emplace_back(base, s.size);
    }
    return iov_;
  }

  /// Total bytes of the batch (sum of the sizes of buffers()).
  std::size_t total_bytes() const noexcept { return total_; }

  /// Empties the batch; keeps the allocated capacity for the next one.
  void clear() noexcept {
    small_.clear();
    segments_.clear();
    iov_.clear();
    commands_ = 0;
    total_ = 0;
  }

 private:
  // A run of bytes: either in small_ (external == nullptr, at `offset`) or caller-owned.
  struct segment {
    const std::byte* external = nullptr;
    std::size_t offset = 0;
    std::size_t size = 0;
  };

  void begin_command(std::span<const std::string_view> args, std::size_t extra) {
    append_header('*', args.size() + extra);
    for (std::string_view a : args) {
      append_bulk_header(a.size());
      append_small(a);
      append_small("\r\n");
    }
  }
  void append_bulk_header(std::size_t n) { append_header('$', n); }
  void append_header(char type_byte, std::size_t n) {
    char tmp[24];
    append_small(detail::format_header(tmp, type_byte, n));
  }
  void append_small(std::string_view s) {
    if (s.empty()) return;
    if (segments_.empty() || segments_.back().external != nullptr) {
      segments_.push_back(segment{nullptr, small_.size(), 0});
    }
    small_.append(s);
    segments_.back().size += s.size();
    total_ += s.size();
  }
  void append_external(std::span<const std::byte> p) {
    if (p.empty()) return;
    segments_.push_back(segment{p.data(), 0, p.size()});
    total_ += p.size();
  }

  std::string small_;
  std::vector<segment> segments_;
  std::vector<std::span<const std::byte>> iov_;
  std::size_t commands_ = 0;
  std::size_t total_ = 0;
};

/// Appends `v` in RESP3 form to `out`. Simple strings, simple errors and big numbers must not
/// contain CR or LF (RESP cannot carry them there); a type::attribute value is written as an
/// attribute map (its elements are the flat key/value list). A value with into_destination set
/// is written as a bulk string of its `str`.
inline void serialize(const value& v, std::string& out) {
  auto line = [&](char c, std::string_view s) {
    out.push_back(c);
    out.append(s);
    out.append("\r\n");
  };
  auto blob = [&](char c, std::string_view s) {
    char tmp[24];
    out.append(detail::format_header(tmp, c, s.size()));
    out.append(s);
    out.append("\r\n");
  };
  switch (v.kind) {
    case type::simple_string:
      line('+', v.str);
      return;
    case type::simple_error:
      line('-', v.str);
      return;
    case type::big_number:
      line('(', v.str);
      return;
    case type::integer: {
      char tmp[24];
      auto [end, ec] = std::to_chars(tmp, tmp + sizeof tmp, v.integer);
      (void)ec;
      line(':', std::string_view(tmp, static_cast<std::size_t>(end - tmp)));
      return;
    }
    case type::double_: {
      if (std::isnan(v.dbl)) return line(',', "nan");
      if (std::isinf(v.dbl)) return line(',', v.dbl > 0 ? "inf" : "-inf");
      char tmp[40];
      auto [end, ec] = std::to_chars(tmp, tmp + sizeof tmp, v.dbl);  // shortest round-trip form
      (void)ec;
      line(',', std::string_view(tmp, static_cast<std::size_t>(end - tmp)));
      return;
    }
    case type::boolean:
      line('#', v.boolean ? "t" : "f");
      return;
    case type::null:
      out.append("_\r\n");
      return;
    case type::bulk_string:
      blob('$', v.str);
      return;
    case type::bulk_error:
      blob('!', v.str);
      return;
    case type::verbatim_string:
      blob('=', v.str);
      return;
    case type::array:
    case type::set:
    case type::push:
    case type::map:
    case type::attribute: {
      const bool pairs = v.kind == type::map || v.kind == type::attribute;
      const char c = v.kind == type::array  ? '*'
                     : v.kind == type::set  ? '~'
                     : v.kind == type::push ? '>'
                     : v.kind == type::map  ? '%'
                                            : '|';
      char tmp[24];
      out.append(detail::format_header(tmp, c, pairs ? v.elements.size() / 2 : v.elements.size()));
      for (const value& e : v.elements) serialize(e, out);
      return;
    }
  }
}

/// serialize() into a new string.
inline std::string serialize(const value& v) {
  std::string out;
  serialize(v, out);
  return out;
}

}  // namespace kvtier::resp
