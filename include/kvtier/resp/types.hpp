// kvtier/resp/types.hpp: the value types of the RESP2/RESP3 codec.
//
// A `value` is one parsed reply, as an owning tree. Every RESP2 and RESP3 type maps to one
// `type`; attributes (`|`) are parsed and dropped by the parser, so a `value` never has
// kind == type::attribute. Maps keep their entries flat: k0, v0, k1, v1, ...
//
//   kvtier::resp::value v = ...;                      // from kvtier::resp::parser::next()
//   if (v.kind == kvtier::resp::type::bulk_string && v.into_destination) {
//     // v.length bytes already sit in the caller's destination buffer
//   } else if (v.is_error()) {
//     std::cerr << "server said: " << v.str << "\n";
//   }
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::resp {

/// Limits a parser enforces before it allocates anything for a reply.
struct parser_limits {
  std::size_t max_bulk = 512u << 20;          ///< longest bulk/verbatim/blob-error payload, bytes
  std::size_t max_aggregate = 1u << 20;       ///< largest element count in one aggregate header (map: pairs)
  std::size_t max_depth = 32;                 ///< deepest nesting of aggregates (a top-level array is 1)
  std::size_t buffer_bytes = 64u << 10;       ///< fixed internal read buffer; also the longest header line
  std::size_t max_reply_elements = 1u << 20;  ///< most elements in one reply, all levels together
};

/// Decides, once the first part of a destination is completely filled, whether the rest of the
/// payload may go into the destination's later parts (true) or is discarded (false). Called by
/// the parser with `context` and the filled first part, before any byte reaches a later part.
/// Must not throw (noexcept: a captureless lambda declared noexcept converts to it).
using destination_gate_fn = bool (*)(void* context, std::span<const std::byte> first_part) noexcept;

/// Sees each piece of a gated destination's later parts as it lands there, in order (after the
/// gate said yes), while the bytes are still hot in cache: e.g. a running checksum, so that no
/// second pass over the payload is needed. Must not throw.
using destination_landed_fn = void (*)(void* context, std::span<const std::byte> piece) noexcept;

/// An optional gate for one destination: plain function pointers plus a caller-owned context,
/// so registering one allocates nothing. fn == nullptr: no gate. landed != nullptr: the parser
/// hands it every payload byte after the first part, in pieces of at most
/// parser::landed_slice_bytes (a transport's direct read is capped to that, so each piece is
/// still in cache when the observer runs).
struct destination_gate {
  destination_gate_fn fn = nullptr;
  void* context = nullptr;
  destination_landed_fn landed = nullptr;
  explicit operator bool() const noexcept { return fn != nullptr; }
};

/// The RESP type of a value.
enum class type : std::uint8_t {
  simple_string,    // +
  simple_error,     // -
  integer,          // :
  bulk_string,      // $
  array,            // *
  null,             // _  and RESP2's $-1 / *-1
  boolean,          // #
  double_,          // ,
  big_number,       // (
  bulk_error,       // !
  verbatim_string,  // =   (str holds "fmt:payload", as sent)
  map,              // %
  set,              // ~
  push,             // >
  attribute,        // |   (never in a value: the parser drops attributes)
};

/// Name of a type, for messages.
constexpr std::string_view to_string(type t) noexcept {
  switch (t) {
    case type::simple_string:
      return "simple_string";
    case type::simple_error:
      return "simple_error";
    case type::integer:
      return "integer";
    case type::bulk_string:
      return "bulk_string";
    case type::array:
      return "array";
    case type::null:
      return "null";
    case type::boolean:
      return "boolean";
    case type::double_:
      return "double";
    case type::big_number:
      return "big_number";
    case type::bulk_error:
      return "bulk_error";
    case type::verbatim_string:
      return "verbatim_string";
    case type::map:
      return "map";
    case type::set:
      return "set";
    case type::push:
      return "push";
    case type::attribute:
      return "attribute";
  }
  return "unknown";
}

/// True for the types whose payload lives in value::elements.
constexpr bool is_aggregate(type t) noexcept {
  return t == type::array || t == type::map || t == type::set || t == type::push || t == type::attribute;
}

/// One parsed reply (owning tree).
struct value {
  type kind = type::null;
  std::string str;  ///< simple/bulk/verbatim strings, errors, big numbers (digits as sent)
  std::int64_t integer = 0;
  double dbl = 0;
  bool boolean = false;
  std::vector<value> elements;    ///< array/set/push; map: k0,v0,k1,v1...; attribute stripped
  bool into_destination = false;  ///< bulk payload was written into the caller's destination
  /// The destination's gate refused the payload after the first part was filled: the rest was
  /// discarded (later parts untouched) and into_destination is false.
  bool refused_by_gate = false;
  /// Strings: payload length in bytes (also when it went to a destination, or was discarded
  /// because the destination had another length). Aggregates: elements.size(). Others: 0.
  std::size_t length = 0;

  bool is_error() const noexcept { return kind == type::simple_error || kind == type::bulk_error; }
  bool is_null() const noexcept { return kind == type::null; }

  /// Structural equality; two NaN doubles compare equal (so a round trip of NaN is equal).
  friend bool operator==(const value& a, const value& b) {
    const bool dbl_eq = a.dbl == b.dbl || (std::isnan(a.dbl) && std::isnan(b.dbl));
    return a.kind == b.kind && a.str == b.str && a.integer == b.integer && dbl_eq && a.boolean == b.boolean &&
           a.into_destination == b.into_destination && a.refused_by_gate == b.refused_by_gate &&
           a.length == b.length && a.elements == b.elements;
  }
};

}  // namespace kvtier::resp
