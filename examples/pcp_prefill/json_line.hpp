// examples/pcp_prefill/json_line.hpp: a small JSON reader for one line of a
// JSONL trace, and a writer for flat JSON objects. No dependencies.
//
// Reads the full JSON grammar (objects, arrays, strings with escapes, numbers,
// true/false/null) into a tree of json_value; errors carry the byte offset.
//
//   pcp::json_value v;
//   std::string err;
//   if (!pcp::parse_json(R"({"id": "r1", "t": 0.5})", v, err)) std::cerr << err;
//   const pcp::json_value* t = v.find("t");   // t->kind == json_value::number
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pcp {

struct json_value {
  enum kind_t { null, boolean, number, string, array, object } kind = null;
  bool b = false;
  double num = 0;
  std::string text;  ///< string contents; for numbers, the literal as written
  std::vector<json_value> items;
  std::vector<std::pair<std::string, json_value>> members;

  /// Member `key` of an object, or nullptr (also for non-objects).
  const json_value* find(std::string_view key) const {
    if (kind != object) return nullptr;
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
  /// True when this is a number with no fraction or exponent that fits in uint64.
  bool is_uint() const {
    if (kind != number || text.empty() || text[0] == '-') return false;
    for (char c : text)
      if (c < '0' || c > '9') return false;
    return text.size() < 20 || (text.size() == 20 && text <= "18446744073709551615");
  }
  std::uint64_t as_uint() const { return std::strtoull(text.c_str(), nullptr, 10); }
};

constexpr const char* kind_name(json_value::kind_t k) {
  switch (k) {
    case json_value::null:
      return "null";
    case json_value::boolean:
      return "boolean";
    case json_value::number:
      return "number";
    case json_value::string:
      return "string";
    case json_value::array:
      return "array";
    case json_value::object:
      return "object";
  }
  return "?";
}

namespace detail {

class json_reader {
 public:
  explicit json_reader(std::string_view s) : s_(s) {}

  bool parse(json_value& out, std::string& err) {
    skip_ws();
    if (!value(out, 0)) return fail(err);
    skip_ws();
    if (pos_ != s_.size()) {
      msg_ = "unexpected trailing characters";
      return fail(err);
    }
    return true;
  }

 private:
  static constexpr int max_depth = 64;

  bool fail(std::string& err) const {
    err = msg_ + " at column " + std::to_string(pos_ + 1);
    return false;
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r' || s_[pos_] == '\n'))
      ++pos_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) {
      msg_ = "invalid literal";
      return false;
    }
    pos_ += word.size();
    return true;
  }
  bool value(json_value& v, int depth) {
    if (depth > max_depth) {
      msg_ = "nesting too deep";
      return false;
    }
    if (pos_ >= s_.size()) {
      msg_ = "unexpected end of line";
      return false;
    }
    switch (s_[pos_]) {
      case '{':
        return object(v, depth);
      case '[':
        return array(v, depth);
      case '"':
        v.kind = json_value::string;
        return string(v.text);
      case 't':
        v.kind = json_value::boolean, v.b = true;
        return literal("true");
      case 'f':
        v.kind = json_value::boolean, v.b = false;
        return literal("false");
      case 'n':
        v.kind = json_value::null;
        return literal("null");
      default:
        return number(v);
    }
  }
  bool object(json_value& v, int depth) {
    v.kind = json_value::object;
    ++pos_;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
    for (;;) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') {
        msg_ = "expected a member name in quotes";
        return false;
      }
      std::string key;
      if (!string(key)) return false;
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') {
        msg_ = "expected ':' after member name \"" + key + "\"";
        return false;
      }
      ++pos_;
      skip_ws();
      json_value member;
      if (!value(member, depth + 1)) return false;
      v.members.emplace_back(std::move(key), std::move(member));
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
      msg_ = "expected ',' or '}' in object";
      return false;
    }
  }
  bool array(json_value& v, int depth) {
    v.kind = json_value::array;
    ++pos_;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
    for (;;) {
      skip_ws();
      json_value item;
      if (!value(item, depth + 1)) return false;
      v.items.push_back(std::move(item));
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
      msg_ = "expected ',' or ']' in array";
      return false;
    }
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static void put_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool hex4(std::uint32_t& cp) {
    if (pos_ + 4 > s_.size()) return false;
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex(s_[pos_ + i]);
      if (h < 0) return false;
      cp = cp * 16 + static_cast<std::uint32_t>(h);
    }
    pos_ += 4;
    return true;
  }
  bool string(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        msg_ = "control character in string";
        return false;
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = 0;
          if (!hex4(cp)) {
            msg_ = "bad \\u escape";
            return false;
          }
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            std::uint32_t lo = 0;
            if (!hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) {
              msg_ = "bad surrogate pair";
              return false;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default:
          msg_ = "bad escape in string";
          return false;
      }
    }
    msg_ = "unterminated string";
    return false;
  }
  bool number(json_value& v) {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > d;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (!digits()) {
      msg_ = "expected a value";
      pos_ = start;
      return false;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) {
        msg_ = "expected digits after '.'";
        return false;
      }
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) {
        msg_ = "expected digits in exponent";
        return false;
      }
    }
    v.kind = json_value::number;
    v.text = std::string(s_.substr(start, pos_ - start));
    v.num = std::strtod(v.text.c_str(), nullptr);
    return true;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  std::string msg_;
};

}  // namespace detail

/// Parses one JSON document; on failure returns false and sets `err`
/// ("<what> at column N").
inline bool parse_json(std::string_view text, json_value& out, std::string& err) {
  out = json_value{};
  return detail::json_reader(text).parse(out, err);
}

/// Appends `s` as a JSON string literal.
inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

/// Appends a number in the shortest form that reads back exactly; non-finite
/// values (not representable in JSON) become null.
inline void append_json_number(std::string& out, double x) {
  if (!std::isfinite(x)) {
    out += "null";
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  if (std::strtod(buf, nullptr) != x) std::snprintf(buf, sizeof buf, "%.17g", x);
  out += buf;
}

/// Builds a flat JSON object member by member: {"a": 1, "b": "x"}.
class json_object_writer {
 public:
  json_object_writer& field(std::string_view key, double x) {
    sep(key);
    append_json_number(out_, x);
    return *this;
  }
  json_object_writer& field(std::string_view key, std::uint64_t x) {
    sep(key);
    out_ += std::to_string(x);
    return *this;
  }
  json_object_writer& field(std::string_view key, std::string_view s) {
    sep(key);
    append_json_string(out_, s);
    return *this;
  }
  json_object_writer& field(std::string_view key, const char* s) { return field(key, std::string_view(s)); }
  /// A member whose value is already JSON text.
  json_object_writer& raw(std::string_view key, std::string_view json) {
    sep(key);
    out_ += json;
    return *this;
  }
  std::string str() const { return out_ + "}"; }

 private:
  void sep(std::string_view key) {
    out_ += out_.size() > 1 ? ", " : "";
    append_json_string(out_, key);
    out_ += ": ";
  }
  std::string out_ = "{";
};

}  // namespace pcp
