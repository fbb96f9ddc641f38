// python/src/common.hpp: what every binding file of the kvtier module shares: kvtier's errors
// as Python exceptions, deadlines from Python values, and byte regions and token ids taken
// from Python objects by pointer (the buffer protocol, or a CPU torch tensor's data_ptr()),
// with a clear exception for every input that cannot be used.
//
// Torch is never linked: a tensor is recognised by its Python attributes (data_ptr, numel,
// element_size, is_contiguous, device, dtype), so the module does not depend on torch's C++ ABI.
//
//   kvtier_py::buffer_hold hold;                            // releases the views, GIL held
//   kvtier_py::byte_region r = kvtier_py::bytes_of(obj, true, "destination 0", hold);
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/errc.hpp"

namespace kvtier_py {

namespace py = pybind11;

/// The exception types of the module (set once by register_errors).
struct error_types {
  py::object errc, base, timeout, invalid_argument, connection, closed, bad_url, corrupt, server, protocol;
};
error_types& errors();

/// `ec` as an exception's `.code` (kvtier.Errc, None outside kvtier's category or for no error)
/// and `.code_name` ("timeout", "system:111", "" for no error).
py::object code_of(std::error_code ec);
std::string code_name_of(std::error_code ec);

/// Creates kvtier.Error and its subclasses in `m` and the translator of C++ exceptions.
void register_errors(py::module_& m);

/// Raises the exception type for `ec` with `message`; `.code` (kvtier.Errc), `.code_name`
/// and `.status` (a list of kvtier.Status, or None) are set on it.
[[noreturn]] void raise_error(std::error_code ec, const std::string& message, py::object status = py::none());

/// Raises kvtier.InvalidArgument (a ValueError too) with `message`.
[[noreturn]] void raise_invalid(const std::string& message);

/// A deadline from a kvtier.Deadline or a number of seconds from now (>= 0; math.inf: none).
kvtier::deadline deadline_of(py::handle h);

/// A Python deadline: an instant on kvtier's steady clock, shared by every call of a request.
struct py_deadline {
  kvtier::deadline at = kvtier::no_deadline;
};

/// Buffer views taken for one call; released (PyBuffer_Release) when it goes, with the GIL
/// held. Keeps an alias (tensor.detach(): the same storage) of every tensor whose data_ptr() was
/// taken, so that storage stays allocated while the hold lives even if the caller's tensor is
/// moved onto other memory meanwhile (tensor.set_ on another thread).
class buffer_hold {
 public:
  buffer_hold() = default;
  buffer_hold(const buffer_hold&) = delete;
  buffer_hold& operator=(const buffer_hold&) = delete;
  ~buffer_hold();
  Py_buffer& add_view();
  void pop_view();
  /// The view taken last (null when none was).
  const Py_buffer* last_view() const { return views_.empty() ? nullptr : views_.back(); }
  void keep(py::handle obj) { objects_.push_back(py::reinterpret_borrow<py::object>(obj)); }

 private:
  std::vector<Py_buffer*> views_;
  std::vector<py::object> objects_;
};

struct byte_region {
  std::byte* data = nullptr;
  std::size_t size = 0;
};

/// The bytes of `obj` (buffer protocol or a contiguous CPU torch tensor), by pointer. `what`
/// names the argument in the exception ("destination 2").
byte_region bytes_of(py::handle obj, bool writable, const std::string& what, buffer_hold& hold);

/// bytes_of for a store's values (a get's destination, a put's source): a buffer or tensor whose
/// items are bytes (uint8, int8, unformatted) or a KV page's 8/16-bit floats (float16, bfloat16,
/// float8). Any other dtype (float32, int64, float64, bool ...) raises kvtier.InvalidArgument
/// naming it and what is accepted: its byte size is seldom the value size meant.
byte_region value_bytes_of(py::handle obj, bool writable, const std::string& what, buffer_hold& hold);

/// True when `obj` looks like a torch.Tensor (checked by attributes, torch not imported).
bool is_tensor(py::handle obj);

/// Token ids from a list/tuple of ints, a 1-D integer buffer (numpy) or an integer CPU tensor:
/// a span over the caller's memory when it already holds uint32, else converted into `storage`
/// with every id checked to be in 0..2^32-1.
std::span<const kvtier::token_id> tokens_of(py::handle obj, std::vector<kvtier::token_id>& storage,
                                            buffer_hold& hold);

/// The chunk keys of a list/tuple of kvtier.ChunkKey.
std::vector<kvtier::chunk_key> keys_of(py::handle obj);

/// Python-facing type name of `obj` ("numpy.ndarray", "NoneType").
std::string type_name(py::handle obj);

void bind_keys(py::module_& m);
void bind_cost(py::module_& m);
void bind_url(py::module_& m);
void bind_stores(py::module_& m);
void bind_pages(py::module_& m);
void bind_connector(py::module_& m);
#if defined(KVTIER_PY_HAS_MPI)
void bind_mpi(py::module_& m);
#endif

}  // namespace kvtier_py
