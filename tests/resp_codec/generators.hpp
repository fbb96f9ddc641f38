// tests/resp_codec/generators.hpp: rapidcheck generators of RESP values for the codec properties.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "kvtier/resp/encoder.hpp"
#include "kvtier/resp/types.hpp"

namespace kvtier::test {

/// Sets value::length the way the parser reports it, recursively.
inline void normalize(resp::value& v) {
  using resp::type;
  for (auto& e : v.elements) normalize(e);
  if (resp::is_aggregate(v.kind)) {
    v.length = v.elements.size();
  } else if (v.kind == type::integer || v.kind == type::double_ || v.kind == type::boolean ||
             v.kind == type::null) {
    v.length = 0;
  } else {
    v.length = v.str.size();
  }
}

inline resp::value make_value(resp::type kind, std::string str = {}) {
  resp::value v;
  v.kind = kind;
  v.str = std::move(str);
  normalize(v);
  return v;
}

/// Text without CR and LF (what simple strings and errors can carry), short enough for a header
/// line to fit the smallest parser buffer.
inline rc::Gen<std::string> gen_line_text() {
  return rc::gen::map(rc::gen::resize(24, rc::gen::string<std::string>()), [](std::string s) {
    for (char& c : s) {
      if (c == '\r' || c == '\n') c = ' ';
    }
    return s;
  });
}

/// Arbitrary bytes, often containing CR/LF and RESP type bytes.
inline rc::Gen<std::string> gen_binary() {
  return rc::gen::oneOf(rc::gen::string<std::string>(),
                        rc::gen::container<std::string>(rc::gen::element('\r', '\n', '$', '*', 'a', '\0')));
}

inline rc::Gen<resp::value> gen_scalar() {
  using resp::type;
  auto with = [](type t) { return [t](std::string s) { return make_value(t, std::move(s)); }; };
  return rc::gen::oneOf(
      rc::gen::map(gen_line_text(), with(type::simple_string)),
      rc::gen::map(gen_line_text(), with(type::simple_error)),
      rc::gen::map(gen_binary(), with(type::bulk_string)), rc::gen::map(gen_binary(), with(type::bulk_error)),
      rc::gen::map(
          rc::gen::pair(rc::gen::container<std::string>(3, rc::gen::inRange<char>('a', '{')), gen_binary()),
          [](std::pair<std::string, std::string> p) {
            return make_value(type::verbatim_string, p.first + ":" + p.second);
          }),
      rc::gen::map(rc::gen::pair(rc::gen::element(std::string(), std::string("-"), std::string("+")),
                                 rc::gen::resize(24, rc::gen::nonEmpty(rc::gen::container<std::string>(
                                                         rc::gen::inRange<char>('0', ':'))))),
                   [](std::pair<std::string, std::string> p) {
                     return make_value(type::big_number, p.first + p.second);
                   }),
      rc::gen::map(rc::gen::arbitrary<std::int64_t>(),
                   [](std::int64_t i) {
                     auto v = make_value(type::integer);
                     v.integer = i;
                     return v;
                   }),
      rc::gen::map(rc::gen::oneOf(
                       rc::gen::map(rc::gen::arbitrary<std::uint64_t>(),
                                    [](std::uint64_t bits) { return std::bit_cast<double>(bits); }),
                       rc::gen::element(
                           0.0, -0.0, 1.5, std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::max())),
                   [](double d) {
                     auto v = make_value(type::double_);
                     v.dbl = d;
                     return v;
                   }),
      rc::gen::map(rc::gen::arbitrary<bool>(),
                   [](bool b) {
                     auto v = make_value(type::boolean);
                     v.boolean = b;
                     return v;
                   }),
      rc::gen::just(make_value(type::null)));
}

/// A value tree at most `depth` aggregates deep (never an attribute).
inline rc::Gen<resp::value> gen_value(int depth = 3) {
  using resp::type;
  if (depth <= 0) return gen_scalar();
  auto elements = rc::gen::resize(6, rc::gen::container<std::vector<resp::value>>(gen_value(depth - 1)));
  auto aggregate =
      rc::gen::map(rc::gen::pair(rc::gen::element(type::array, type::map, type::set, type::push), elements),
                   [](std::pair<type, std::vector<resp::value>> p) {
                     resp::value v;
                     v.kind = p.first;
                     v.elements = std::move(p.second);
                     if (v.kind == type::map && v.elements.size() % 2 != 0) v.elements.pop_back();
                     normalize(v);
                     return v;
                   });
  return rc::gen::weightedOneOf<resp::value>({{3, gen_scalar()}, {1, aggregate}});
}

}  // namespace kvtier::test

namespace kvtier::resp {
/// How rapidcheck prints a value in a counterexample: its RESP3 bytes, escaped.
inline void showValue(const value& v, std::ostream& os) {
  for (char c : serialize(v)) {
    if (c == '\r') {
      os << "\\r";
    } else if (c == '\n') {
      os << "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
      os << "\\x"
         << "0123456789abcdef"[(c >> 4) & 0xf] << "0123456789abcdef"[c & 0xf];
    } else {
      os << c;
    }
  }
}
}  // namespace kvtier::resp
