// python/src/module.cpp: the kvtier._kvtier extension: errors, deadlines, buffers and token ids
// taken from Python objects (see common.hpp), and the module definition.
#include <pybind11/pybind11.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <type_traits>

#include "common.hpp"

namespace kvtier_py {

namespace {

const char* errc_name(int v) {
  switch (static_cast<kvtier::errc>(v)) {
    case kvtier::errc::timeout:
      return "timeout";
    case kvtier::errc::connection_lost:
      return "connection_lost";
    case kvtier::errc::connection_refused:
      return "connection_refused";
    case kvtier::errc::resolve_failed:
      return "resolve_failed";
    case kvtier::errc::not_connected:
      return "not_connected";
    case kvtier::errc::protocol_error:
      return "protocol_error";
    case kvtier::errc::server_error:
      return "server_error";
    case kvtier::errc::unexpected_reply:
      return "unexpected_reply";
    case kvtier::errc::too_large:
      return "too_large";
    case kvtier::errc::corrupt_value:
      return "corrupt_value";
    case kvtier::errc::wrong_length:
      return "wrong_length";
    case kvtier::errc::auth_failed:
      return "auth_failed";
    case kvtier::errc::cancelled:
      return "cancelled";
    case kvtier::errc::shutdown:
      return "shutdown";
    case kvtier::errc::queue_full:
      return "queue_full";
    case kvtier::errc::bad_url:
      return "bad_url";
    case kvtier::errc::invalid_argument:
      return "invalid_argument";
    case kvtier::errc::collective_mismatch:
      return "collective_mismatch";
    case kvtier::errc::backend_error:
      return "backend_error";
    case kvtier::errc::tls_failed:
      return "tls_failed";
    case kvtier::errc::resource_exhausted:
      return "resource_exhausted";
    case kvtier::errc::store_threw:
      return "store_threw";
  }
  return "unknown";
}

py::object new_exception(py::module_& m, const char* name, py::handle bases, const char* doc) {
  const std::string full = std::string("kvtier.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases.ptr(), nullptr);
  if (t == nullptr) throw py::error_already_set();
  py::object type = py::reinterpret_steal<py::object>(t);
  m.attr(name) = type;
  return type;
}

py::object type_for(std::error_code ec) {
  error_types& e = errors();
  if (ec.category() != kvtier::error_category()) return e.base;
  switch (static_cast<kvtier::errc>(ec.value())) {
    case kvtier::errc::timeout:
      return e.timeout;
    case kvtier::errc::invalid_argument:
      return e.invalid_argument;
    case kvtier::errc::bad_url:
      return e.bad_url;
    case kvtier::errc::shutdown:
      return e.closed;
    case kvtier::errc::corrupt_value:
    case kvtier::errc::wrong_length:
      return e.corrupt;
    case kvtier::errc::server_error:
    case kvtier::errc::auth_failed:
      return e.server;
    case kvtier::errc::protocol_error:
    case kvtier::errc::unexpected_reply:
    case kvtier::errc::too_large:
      return e.protocol;
    case kvtier::errc::connection_lost:
    case kvtier::errc::connection_refused:
    case kvtier::errc::resolve_failed:
    case kvtier::errc::not_connected:
    case kvtier::errc::tls_failed:
      return e.connection;
    default:
      return e.base;
  }
}

}  // namespace

error_types& errors() {
  static error_types* e = new error_types();  // never destroyed: Python owns the types at exit
  return *e;
}

py::object code_of(std::error_code ec) {
  if (!ec || ec.category() != kvtier::error_category()) return py::none();
  return errors().errc(ec.value());
}

std::string code_name_of(std::error_code ec) {
  if (!ec) return {};
  if (ec.category() == kvtier::error_category()) return errc_name(ec.value());
  return ec.category().name() + std::string(":") + std::to_string(ec.value());
}

namespace {

// Sets the Python error for `ec` (raise_error, and the translator of C++ exceptions).
void set_error(std::error_code ec, const std::string& message, py::object status) {
  py::object type = type_for(ec);
  py::object exc = type(py::str(message));
  exc.attr("code") = code_of(ec);
  exc.attr("code_name") = code_name_of(ec);
  exc.attr("status") = std::move(status);
  PyErr_SetObject(type.ptr(), exc.ptr());
}

}  // namespace

void raise_error(std::error_code ec, const std::string& message, py::object status) {
  set_error(ec, message, std::move(status));
  throw py::error_already_set();
}

void raise_invalid(const std::string& message) {
  raise_error(make_error_code(kvtier::errc::invalid_argument), message);
}

void register_errors(py::module_& m) {
  error_types& e = errors();
  e.base = new_exception(m, "Error", PyExc_Exception,
                         "Base of every kvtier error. Attributes: code (kvtier.Errc or None), code_name "
                         "(str), status (list[kvtier.Status] of the batch, or None).\n\n"
                         "    try:\n        store.get(keys, dst, 0.5)\n"
                         "    except kvtier.Error as e:\n        print(e.code_name, e.status)");
  auto sub = [&](const char* name, py::handle builtin, const char* doc) {
    py::tuple bases = builtin ? py::make_tuple(e.base, builtin) : py::make_tuple(e.base);
    return new_exception(m, name, bases, doc);
  };
  e.timeout = sub("TimeoutError", PyExc_TimeoutError,
                  "The deadline passed first (kvtier.Errc.timeout); also a builtins.TimeoutError.");
  e.invalid_argument = sub("InvalidArgument", PyExc_ValueError,
                           "An argument kvtier cannot use (None, a non-contiguous tensor, a buffer too "
                           "small, the wrong dtype, a negative deadline); also a ValueError.");
  e.bad_url = new_exception(m, "BadUrl", py::make_tuple(e.invalid_argument),
                            "A server URL that does not parse (kvtier.Errc.bad_url); the message "
                            "never shows the password.");
  e.connection = sub("ConnectionError", PyExc_ConnectionError,
                     "Connect, resolve, TLS or a lost connection; also a builtins.ConnectionError.");
  e.closed = sub("ClosedError", nullptr, "The store was closed (kvtier.Errc.shutdown).");
  e.corrupt = sub("CorruptValue", nullptr, "A stored value failed its integrity or length check.");
  e.server = sub("ServerError", nullptr, "The server answered with an error (or refused AUTH).");
  e.protocol = sub("ProtocolError", nullptr, "The server's reply was not what RESP or kvtier allows.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& x) {
      set_error(make_error_code(kvtier::errc::invalid_argument), x.what(), py::none());
    } catch (const std::length_error& x) {
      set_error(make_error_code(kvtier::errc::invalid_argument), x.what(), py::none());
    }
  });
}

kvtier::deadline deadline_of(py::handle h) {
  if (h.is_none())
    raise_invalid(
        "deadline is None: pass seconds from now (a float >= 0, math.inf for none) or a kvtier.Deadline");
  if (py::isinstance<py_deadline>(h)) return h.cast<const py_deadline&>().at;
  if (PyBool_Check(h.ptr()) || !(PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr())))
    raise_invalid("deadline must be seconds from now (float >= 0) or a kvtier.Deadline, not " + type_name(h));
  const double s = h.cast<double>();
  if (std::isnan(s)) raise_invalid("deadline is NaN seconds");
  if (s < 0) raise_invalid("deadline is " + std::to_string(s) + " s: it must be >= 0 seconds from now");
  if (std::isinf(s)) return kvtier::no_deadline;
  return kvtier::deadline_after(std::chrono::duration<double>(s));
}

buffer_hold::~buffer_hold() {
  for (Py_buffer* v : views_) {
    PyBuffer_Release(v);
    delete v;
  }
}

Py_buffer& buffer_hold::add_view() {
  views_.push_back(new Py_buffer{});
  return *views_.back();
}

void buffer_hold::pop_view() {
  delete views_.back();  // a view whose GetBuffer failed, or already released
  views_.pop_back();
}

std::string type_name(py::handle obj) {
  py::handle t = py::type::handle_of(obj);
  std::string mod = py::str(t.attr("__module__"));
  std::string name = py::str(t.attr("__qualname__"));
  return mod == "builtins" ? name : mod + "." + name;
}

bool is_tensor(py::handle obj) {
  return py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size") && py::hasattr(obj, "numel") &&
         py::hasattr(obj, "is_contiguous") && py::hasattr(obj, "device");
}

namespace {

// A tensor's bytes after the checks every use shares: CPU, strided, contiguous. What `hold` keeps
// is an alias of the tensor (t.detach(): a new tensor object over the same storage), and the
// pointer is read from that alias: its storage stays allocated for as long as `hold` lives, even
// when another thread moves the caller's tensor onto other memory meanwhile (t.set_(...), which
// frees a storage that only the tensor object referenced). Keeping `t` itself would not: set_
// changes what the object points at. (A resize_ that grows the storage in place reallocates it;
// torch has no way to lock a storage against that, so a tensor must not be resized during a call.)
byte_region tensor_bytes(py::handle t, const std::string& what, buffer_hold& hold) {
  const std::string device = py::str(t.attr("device").attr("type"));
  if (device != "cpu")
    raise_invalid(what + " is a tensor on device '" + std::string(py::str(t.attr("device"))) +
                  "': kvtier reads and writes CPU memory only (pass a CPU tensor, pinned if you copy "
                  "to the GPU)");
  if (py::hasattr(t, "layout") && std::string(py::str(t.attr("layout"))) != "torch.strided")
    raise_invalid(what + " is a " + std::string(py::str(t.attr("layout"))) + " tensor: pass a dense one");
  // From here on only the alias is read: the same storage, whatever happens to `t`.
  const py::object a = py::hasattr(t, "detach") ? t.attr("detach")() : py::reinterpret_borrow<py::object>(t);
  hold.keep(a);
  if (!a.attr("is_contiguous")().cast<bool>())
    raise_invalid(what + " is a non-contiguous tensor: pass a contiguous one (tensor.contiguous() copies)");
  const auto numel = a.attr("numel")().cast<std::size_t>();
  const auto esize = a.attr("element_size")().cast<std::size_t>();
  const auto ptr = a.attr("data_ptr")().cast<std::uintptr_t>();
  return {reinterpret_cast<std::byte*>(ptr), numel * esize};
}

bool integer_format(const char* fmt, bool& is_signed) {
  if (fmt == nullptr) return false;  // "B" is implied only for unformatted requests
  std::string_view f(fmt);
  if (!f.empty() && std::strchr("@=<>!", f.front()) != nullptr) f.remove_prefix(1);
  if (f.size() != 1) return false;
  if (std::strchr("bhilqn", f[0]) != nullptr) return is_signed = true;
  if (std::strchr("BHILQN", f[0]) != nullptr) return !(is_signed = false);
  return false;
}

kvtier::token_id checked_token(long long v, std::size_t i) {
  if (v < 0 || v > 0xFFFFFFFFll)
    raise_invalid("token " + std::to_string(i) + " is " + std::to_string(v) +
                  ": token ids are 0..4294967295");
  return static_cast<kvtier::token_id>(v);
}

template <class Int>
void convert_tokens(const void* data, std::size_t n, std::vector<kvtier::token_id>& out) {
  const Int* p = static_cast<const Int*>(data);
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_signed_v<Int>) {
      out[i] = checked_token(static_cast<long long>(p[i]), i);
    } else {
      if (static_cast<unsigned long long>(p[i]) > 0xFFFFFFFFull)
        raise_invalid("token " + std::to_string(i) + " is " + std::to_string(p[i]) +
                      ": token ids are 0..4294967295");
      out[i] = static_cast<kvtier::token_id>(p[i]);
    }
  }
}

void convert_any(const void* data, std::size_t n, std::size_t size, bool is_signed,
                 std::vector<kvtier::token_id>& out) {
  switch (size * 2 + (is_signed ? 1 : 0)) {
    case 2:
      return convert_tokens<std::uint8_t>(data, n, out);
    case 3:
      return convert_tokens<std::int8_t>(data, n, out);
    case 4:
      return convert_tokens<std::uint16_t>(data, n, out);
    case 5:
      return convert_tokens<std::int16_t>(data, n, out);
    case 8:
      return convert_tokens<std::uint32_t>(data, n, out);
    case 9:
      return convert_tokens<std::int32_t>(data, n, out);
    case 16:
      return convert_tokens<std::uint64_t>(data, n, out);
    case 17:
      return convert_tokens<std::int64_t>(data, n, out);
    default:
      raise_invalid("token ids of " + std::to_string(size) + "-byte integers are not supported");
  }
}

// The dtypes a store value may be seen as: bytes, or the 8/16-bit elements of a KV cache page.
bool value_dtype(const std::string& dtype) {
  static constexpr const char* ok[] = {"torch.uint8",           "torch.int8",           "torch.float16",
                                       "torch.bfloat16",        "torch.float8_e4m3fn",  "torch.float8_e5m2",
                                       "torch.float8_e4m3fnuz", "torch.float8_e5m2fnuz"};
  for (const char* x : ok)
    if (dtype == x) return true;
  return false;
}

// The same for a buffer's struct format: unformatted (bytes), B, b, c, or e (float16).
bool value_buffer_format(const char* fmt) {
  if (fmt == nullptr) return true;
  std::string_view f(fmt);
  if (!f.empty() && std::strchr("@=<>!", f.front()) != nullptr) f.remove_prefix(1);
  return f == "B" || f == "b" || f == "c" || f == "e";
}

const char* const value_kinds =
    "a store value is bytes: pass uint8 or int8 (or a KV page's float16, bfloat16 or float8)";

}  // namespace

byte_region value_bytes_of(py::handle obj, bool writable, const std::string& what, buffer_hold& hold) {
  if (is_tensor(obj) && !PyObject_CheckBuffer(obj.ptr())) {
    const std::string dtype = py::str(obj.attr("dtype"));
    if (!value_dtype(dtype))
      raise_invalid(what + " is a tensor of dtype " + dtype + ": " + value_kinds +
                    "; tensor.view(torch.uint8) is the same memory as bytes");
    return bytes_of(obj, writable, what, hold);
  }
  const byte_region r = bytes_of(obj, writable, what, hold);
  const Py_buffer* v = hold.last_view();
  if (v != nullptr && !value_buffer_format(v->format))
    raise_invalid(what + " (" + type_name(obj) + ") holds items of format '" + v->format + "' (" +
                  std::to_string(v->itemsize) + "-byte): " + value_kinds +
                  "; array.view(numpy.uint8) is the same memory as bytes");
  return r;
}

byte_region bytes_of(py::handle obj, bool writable, const std::string& what, buffer_hold& hold) {
  if (obj.is_none()) raise_invalid(what + " is None");
  if (PyObject_CheckBuffer(obj.ptr())) {
    Py_buffer& v = hold.add_view();
    if (PyObject_GetBuffer(obj.ptr(), &v, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0) {
      hold.pop_view();
      py::error_already_set first;  // fetches and clears Python's own error
      if (writable) {
        Py_buffer probe{};
        if (PyObject_GetBuffer(obj.ptr(), &probe, PyBUF_RECORDS_RO) == 0) {
          PyBuffer_Release(&probe);
          raise_invalid(what + " (" + type_name(obj) +
                        ") is read-only: get writes into it (pass a bytearray, a writable numpy array or "
                        "a tensor)");
        }
        PyErr_Clear();
      }
      raise_invalid(what + " (" + type_name(obj) + "): " + first.what());
    }
    if (!PyBuffer_IsContiguous(&v, 'C'))
      raise_invalid(what + " (" + type_name(obj) +
                    ") is not C-contiguous: pass a contiguous array (numpy.ascontiguousarray copies)");
    return {static_cast<std::byte*>(v.buf), static_cast<std::size_t>(v.len)};
  }
  if (is_tensor(obj)) {
    if (writable && py::hasattr(obj, "requires_grad") && obj.attr("requires_grad").cast<bool>())
      raise_invalid(what + " is a tensor that requires grad: pass tensor.detach() (the same memory)");
    return tensor_bytes(obj, what, hold);
  }
  raise_invalid(what + " is " + type_name(obj) +
                ": expected a buffer (bytearray, memoryview, numpy array) or a contiguous CPU torch tensor");
}

std::span<const kvtier::token_id> tokens_of(py::handle obj, std::vector<kvtier::token_id>& storage,
                                            buffer_hold& hold) {
  if (obj.is_none()) raise_invalid("tokens is None");
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    storage.resize(seq.size());
    for (std::size_t i = 0; i < storage.size(); ++i) {
      py::handle x = seq[i];
      if (PyBool_Check(x.ptr()) || !PyIndex_Check(x.ptr()))
        raise_invalid("token " + std::to_string(i) + " is " + type_name(x) + ", not an int");
      const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(x.ptr()));
      if (!index) throw py::error_already_set();
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (overflow != 0)
        raise_invalid("token " + std::to_string(i) + " does not fit: token ids are 0..4294967295");
      storage[i] = checked_token(v, i);
    }
    return storage;
  }
  if (PyObject_CheckBuffer(obj.ptr())) {
    Py_buffer& v = hold.add_view();
    if (PyObject_GetBuffer(obj.ptr(), &v, PyBUF_RECORDS_RO) != 0) {
      hold.pop_view();
      py::error_already_set e;
      raise_invalid("tokens (" + type_name(obj) + "): " + e.what());
    }
    bool is_signed = false;
    if (!integer_format(v.format, is_signed))
      raise_invalid("tokens must be integers, got a buffer of format '" +
                    std::string(v.format ? v.format : "?") + "' (" + type_name(obj) + ")");
    if (v.ndim > 1) raise_invalid("tokens must be 1-D, got " + std::to_string(v.ndim) + " dimensions");
    if (!PyBuffer_IsContiguous(&v, 'C')) raise_invalid("tokens (" + type_name(obj) + ") are not contiguous");
    const std::size_t n = static_cast<std::size_t>(v.len / v.itemsize);
    if (v.itemsize == 4 && !is_signed)
      return {static_cast<const kvtier::token_id*>(v.buf), n};  // already uint32: no copy
    convert_any(v.buf, n, static_cast<std::size_t>(v.itemsize), is_signed, storage);
    return storage;
  }
  if (is_tensor(obj)) {
    const std::string dtype = py::str(obj.attr("dtype"));
    bool is_signed = true;
    if (dtype == "torch.uint8")
      is_signed = false;
    else if (dtype != "torch.int8" && dtype != "torch.int16" && dtype != "torch.int32" &&
             dtype != "torch.int64")
      raise_invalid("tokens must be an integer tensor, got dtype " + dtype);
    if (obj.attr("dim")().cast<int>() > 1) raise_invalid("tokens must be a 1-D tensor");
    const byte_region r = tensor_bytes(obj, "tokens", hold);
    const auto esize = obj.attr("element_size")().cast<std::size_t>();
    convert_any(r.data, r.size / esize, esize, is_signed, storage);
    return storage;
  }
  raise_invalid("tokens is " + type_name(obj) +
                ": expected a list of ints, a 1-D integer numpy array or an integer CPU torch tensor");
}

}  // namespace kvtier_py

namespace py = pybind11;

PYBIND11_MODULE(_kvtier, m) {
  namespace kp = kvtier_py;
  m.doc() =
      "kvtier from Python: chunk keys, the cost model, server URLs and the chunk stores (memory, remote, "
      "cluster, rendezvous, tiered), batched exists/get/put on buffers and CPU torch tensors by pointer "
      "with the GIL released.\n\n"
      "    import kvtier\n"
      "    store = kvtier.MemoryStore(1 << 20)\n"
      "    store.put([kvtier.ChunkKey(1, 2)], [b'abc'], 1.0)  # -> [Status.stored]\n";
  m.attr("__version__") = "0.1.0";
  kp::register_errors(m);
  py::enum_<kvtier::errc>(m, "Errc", "kvtier's error codes (kvtier/errc.hpp); an exception's .code.")
      .value("timeout", kvtier::errc::timeout)
      .value("connection_lost", kvtier::errc::connection_lost)
      .value("connection_refused", kvtier::errc::connection_refused)
      .value("resolve_failed", kvtier::errc::resolve_failed)
      .value("not_connected", kvtier::errc::not_connected)
      .value("protocol_error", kvtier::errc::protocol_error)
      .value("server_error", kvtier::errc::server_error)
      .value("unexpected_reply", kvtier::errc::unexpected_reply)
      .value("too_large", kvtier::errc::too_large)
      .value("corrupt_value", kvtier::errc::corrupt_value)
      .value("wrong_length", kvtier::errc::wrong_length)
      .value("auth_failed", kvtier::errc::auth_failed)
      .value("cancelled", kvtier::errc::cancelled)
      .value("shutdown", kvtier::errc::shutdown)
      .value("queue_full", kvtier::errc::queue_full)
      .value("bad_url", kvtier::errc::bad_url)
      .value("invalid_argument", kvtier::errc::invalid_argument)
      .value("collective_mismatch", kvtier::errc::collective_mismatch)
      .value("backend_error", kvtier::errc::backend_error)
      .value("tls_failed", kvtier::errc::tls_failed)
      .value("resource_exhausted", kvtier::errc::resource_exhausted)
      .value("store_threw", kvtier::errc::store_threw);
  kp::errors().errc = m.attr("Errc");

  py::class_<kp::py_deadline>(m, "Deadline",
                              "An instant on kvtier's steady clock: take one per request and pass it to "
                              "every call of that request.\n\n"
                              "    dl = kvtier.Deadline.after(2.0)\n"
                              "    store.exists(keys, dl); store.get(keys, dst, dl)")
      .def_static(
          "after", [](py::handle seconds) { return kp::py_deadline{kp::deadline_of(seconds)}; },
          py::arg("seconds"), "The instant `seconds` (>= 0; math.inf: never) from now.")
      .def_static(
          "never", [] { return kp::py_deadline{}; }, "A deadline that never passes.")
      .def(
          "remaining",
          [](const kp::py_deadline& d) {
            if (d.at == kvtier::no_deadline) return std::numeric_limits<double>::infinity();
            return std::chrono::duration<double>(kvtier::time_left(d.at)).count();
          },
          "Seconds left (0 once passed; math.inf for never).")
      .def(
          "expired", [](const kp::py_deadline& d) { return kvtier::expired(d.at); }, "True once passed.")
      .def("__repr__", [](const kp::py_deadline& d) {
        if (d.at == kvtier::no_deadline) return std::string("kvtier.Deadline.never()");
        return "kvtier.Deadline(remaining=" +
               std::to_string(std::chrono::duration<double>(kvtier::time_left(d.at)).count()) + ")";
      });
  m.def(
      "deadline_after", [](py::handle seconds) { return kp::py_deadline{kp::deadline_of(seconds)}; },
      py::arg("seconds"), "kvtier.Deadline.after(seconds).\n\n    dl = kvtier.deadline_after(0.5)");

  kp::bind_keys(m);
  kp::bind_cost(m);
  kp::bind_url(m);
  kp::bind_stores(m);
  kp::bind_pages(m);
#if defined(KVTIER_PY_HAS_MPI)
  kp::bind_mpi(m);
#endif
  kp::bind_connector(m);
}
