// python/src/connector_args.hpp: what kvtier.Connector's arguments become in C++: the ownership
// policy chosen by a string (py_ownership, a variant of the three), the option strings and
// seconds, and slot / block integers from lists, buffers or tensors, each checked.
//
//   py_ownership own = ownership_of("block:4", world);   // kvtier.InvalidArgument when malformed
//   auto slots = ints_of(obj, "slots", layout.num_slots());
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/ownership.hpp"

namespace kvtier_py {

// The connector's ownership, chosen at run time: modulo (c mod W), block interleave (runs of
// `block` chunks per rank) or rendezvous hashing of the chunk index. One connector type for all
// three; owner() is a visit per chunk, nothing next to a store call.
class py_ownership {
 public:
  using policy = std::variant<kvtier::modulo_ownership, kvtier::block_interleave_ownership,
                              kvtier::rendezvous_ownership>;
  explicit py_ownership(policy p) : p_(std::move(p)) {}
  kvtier::rank_t world_size() const noexcept {
    return std::visit([](const auto& x) { return x.world_size(); }, p_);
  }
  kvtier::rank_t owner(std::size_t chunk) const noexcept {
    return std::visit([&](const auto& x) { return x.owner(chunk); }, p_);
  }
  std::string geometry() const {
    return std::visit([](const auto& x) { return x.geometry(); }, p_);
  }

 private:
  policy p_;
};

// "mod" | "block:I" | "rendezvous" | "rendezvous:SEED" for a world of `world` ranks.
inline py_ownership ownership_of(const std::string& s, kvtier::rank_t world) {
  const auto number = [&](const std::string& digits, const char* what) -> std::uint64_t {
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 19)
      raise_invalid("ownership '" + s + "': " + what + " must be a decimal number");
    return std::stoull(digits);
  };
  try {
    if (s == "mod") return py_ownership(kvtier::modulo_ownership(world));
    if (s.rfind("block:", 0) == 0)
      return py_ownership(kvtier::block_interleave_ownership(world, number(s.substr(6), "the block")));
    if (s == "rendezvous") return py_ownership(kvtier::rendezvous_ownership(world));
    if (s.rfind("rendezvous:", 0) == 0)
      return py_ownership(kvtier::rendezvous_ownership(world, number(s.substr(11), "the seed")));
  } catch (const std::invalid_argument& e) {
    raise_invalid(e.what());
  }
  raise_invalid("ownership must be 'mod', 'block:I' or 'rendezvous[:SEED]', not '" + s + "'");
}

inline std::chrono::milliseconds ms_of(double s, const char* what) {
  if (!(s >= 0) || !std::isfinite(s))
    raise_invalid(std::string(what) + " must be seconds >= 0, not " + std::to_string(s));
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(s * 1000)));
}

inline kvtier::load_policy policy_of(const std::string& s) {
  if (s == "always") return kvtier::load_policy::always;
  if (s == "cost") return kvtier::load_policy::cost;
  if (s == "split") return kvtier::load_policy::split;
  raise_invalid("policy must be 'always', 'cost' or 'split', not '" + s + "'");
}

inline kvtier::save_policy saves_of(const std::string& s) {
  if (s == "write_through") return kvtier::save_policy::write_through;
  if (s == "selective") return kvtier::save_policy::selective;
  raise_invalid("saves must be 'write_through' or 'selective', not '" + s + "'");
}

// Integers (slots int64, blocks int32) from a list/tuple, a 1-D integer buffer or tensor; each
// checked to be in [0, limit).
inline std::vector<std::int64_t> ints_of(py::handle obj, const std::string& what, std::int64_t limit) {
  if (obj.is_none()) raise_invalid(what + " is None");
  std::vector<std::int64_t> out;
  const auto put = [&](std::int64_t v, std::size_t i) {
    if (v < 0 || v >= limit)
      raise_invalid(what + "[" + std::to_string(i) + "] = " + std::to_string(v) + " is outside [0, " +
                    std::to_string(limit) + ")");
    out.push_back(v);
  };
  buffer_hold hold;
  if (is_tensor(obj)) {
    const std::string dtype = py::str(obj.attr("dtype"));
    if (dtype != "torch.int64" && dtype != "torch.int32")
      raise_invalid(what + " must be an int32 or int64 tensor, got dtype " + dtype);
    if (obj.attr("dim")().cast<int>() > 1) raise_invalid(what + " must be 1-D");
    const byte_region r = bytes_of(obj, false, what, hold);
    const bool wide = dtype == "torch.int64";
    const std::size_t n = r.size / (wide ? 8 : 4);
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      put(wide ? reinterpret_cast<const std::int64_t*>(r.data)[i]
               : reinterpret_cast<const std::int32_t*>(r.data)[i],
          i);
    return out;
  }
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr()) && PyObject_CheckBuffer(obj.ptr())) {
    py::buffer_info b = py::reinterpret_borrow<py::buffer>(obj).request();
    if (b.ndim != 1 || (b.format != "q" && b.format != "l" && b.format != "i") || b.strides[0] != b.itemsize)
      raise_invalid(what + " must be a contiguous 1-D int32/int64 buffer (format '" + b.format + "')");
    out.reserve(static_cast<std::size_t>(b.size));
    for (py::ssize_t i = 0; i < b.size; ++i)
      put(b.itemsize == 8 ? static_cast<const std::int64_t*>(b.ptr)[i]
                          : static_cast<const std::int32_t*>(b.ptr)[i],
          static_cast<std::size_t>(i));
    return out;
  }
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr()))
    raise_invalid(what + " is " + type_name(obj) + ": expected a list of ints, an int numpy array or tensor");
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  out.reserve(seq.size());
  for (std::size_t i = 0; i < seq.size(); ++i) {
    py::handle x = seq[i];
    if (PyBool_Check(x.ptr()) || !PyIndex_Check(x.ptr()))
      raise_invalid(what + "[" + std::to_string(i) + "] is " + type_name(x) + ", not an int");
    put(x.cast<std::int64_t>(), i);
  }
  return out;
}

}  // namespace kvtier_py
