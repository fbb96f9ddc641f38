// python/src/bind_stores.cpp: kvtier.Store and its kinds (MemoryStore, RemoteStore, ClusterStore,
// RendezvousStore, TieredStore). exists/get/put take the batch from Python objects by pointer
// (common.hpp), then release the GIL for the whole store call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>

#include "common.hpp"
#include "kvtier/resp/asio_connection.hpp"
#if defined(KVTIER_PY_HAS_TLS)
#include "kvtier/resp/asio_tls_connection.hpp"
#endif
#include "kvtier/resp/cluster.hpp"
#include "kvtier/resp/url.hpp"
#include "kvtier/store/cluster_store.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/remote_store.hpp"
#include "kvtier/store/rendezvous_store.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "store_impl.hpp"

namespace kvtier_py {

namespace {

using remote = kvtier::remote_store<kvtier::resp::asio_connection>;
using cluster = kvtier::cluster_store<kvtier::resp::asio_connection>;
using memory_impl = owned_store<kvtier::memory_store>;
#if defined(KVTIER_PY_HAS_TLS)
using remote_tls = kvtier::remote_store<kvtier::resp::asio_tls_connection>;
using cluster_tls = kvtier::cluster_store<kvtier::resp::asio_tls_connection>;
#endif

// One store over plain TCP / Unix sockets, or over TLS where kvtier::tls is built: `plain` or
// `tls` is set (RemoteStore: rediss://, resp+tls://; ClusterStore: resp+cluster+tls://).
template <template <kvtier::resp::connection> class Store>
struct transport_parts {
  std::unique_ptr<Store<kvtier::resp::asio_connection>> plain;
#if defined(KVTIER_PY_HAS_TLS)
  std::unique_ptr<Store<kvtier::resp::asio_tls_connection>> tls;
#endif
  template <class F>
  decltype(auto) visit(F&& f) const {
#if defined(KVTIER_PY_HAS_TLS)
    if (!plain) return f(*tls);
#endif
    return f(*plain);
  }
  template <class... A>
  std::error_code exists(A&&... a) {
    return visit([&](auto& s) { return s.exists(std::forward<A>(a)...); });
  }
  template <class... A>
  std::error_code get(A&&... a) {
    return visit([&](auto& s) { return s.get(std::forward<A>(a)...); });
  }
  template <class... A>
  std::error_code put(A&&... a) {
    return visit([&](auto& s) { return s.put(std::forward<A>(a)...); });
  }
  std::string last_error() const {
    return visit([](auto& s) { return s.last_error(); });
  }
  kvtier::remote_store_stats stats() const {
    return visit([](auto& s) { return s.stats(); });
  }
  std::string identity() const {  // a single server's: a cluster has none
    return visit([](auto& s) {
      if constexpr (requires { s.pool(); })
        return std::string(s.pool().options().server.describe());
      else
        return std::string();
    });
  }
};
using remote_parts = transport_parts<kvtier::remote_store>;
using remote_impl = owned_store<remote_parts>;
using cluster_parts = transport_parts<kvtier::cluster_store>;
using cluster_impl = owned_store<cluster_parts>;

}  // namespace

// Their get() says the stored length of a key whose destination has another size (store_impl.hpp).
template <>
inline constexpr bool reports_stored_bytes<kvtier::memory_store> = true;
template <>
inline constexpr bool reports_stored_bytes<remote_parts> = true;
template <>
inline constexpr bool reports_stored_bytes<cluster_parts> = true;

namespace {

// A tiered_store over two Python stores; the refs outlive the tiered_store that points at them.
struct tiered_parts {
  store_ref l1, l2;
  kvtier::tiered_store<store_ref, store_ref> tiers;
  tiered_parts(std::shared_ptr<store_impl> a, std::shared_ptr<store_impl> b, kvtier::tiered_options o)
      : l1{std::move(a)}, l2{std::move(b)}, tiers(l1, l2, o) {}
  template <class... A>
  std::error_code exists(A&&... a) {
    return tiers.exists(std::forward<A>(a)...);
  }
  template <class... A>
  std::error_code get(A&&... a) {
    return tiers.get(std::forward<A>(a)...);
  }
  template <class... A>
  std::error_code put(A&&... a) {
    return tiers.put(std::forward<A>(a)...);
  }
  std::string last_error() const {
    std::string e = l2.s->last_error();
    return e.empty() ? l1.s->last_error() : e;
  }
};
using tiered_impl = owned_store<tiered_parts>;

struct rendezvous_parts {
  std::vector<store_ref> refs;
  std::vector<store_ref*> ptrs;
  std::optional<kvtier::rendezvous_store<store_ref>> r;
  // names[i]: instance i's lasting identity (its server, or the caller's name), so that a key
  // keeps its instance when the list is reordered or another instance leaves.
  rendezvous_parts(std::vector<std::shared_ptr<store_impl>> parts, std::vector<std::string> names,
                   std::uint64_t seed) {
    for (auto& p : parts) refs.push_back({std::move(p)});
    for (auto& x : refs) ptrs.push_back(&x);
    r.emplace(ptrs, std::move(names), seed);
  }
  template <class... A>
  std::error_code exists(A&&... a) {
    return r->exists(std::forward<A>(a)...);
  }
  template <class... A>
  std::error_code get(A&&... a) {
    return r->get(std::forward<A>(a)...);
  }
  template <class... A>
  std::error_code put(A&&... a) {
    return r->put(std::forward<A>(a)...);
  }
  std::string last_error() const {
    for (const store_ref& x : refs)
      if (std::string e = x.s->last_error(); !e.empty()) return e;
    return {};
  }
};
using rendezvous_impl = owned_store<rendezvous_parts>;

py::list status_list(std::span<const kvtier::chunk_status> st) {
  py::list out(st.size());
  for (std::size_t i = 0; i < st.size(); ++i) out[i] = py::cast(st[i]);
  return out;
}

[[noreturn]] void raise_call(store_impl& s, const char* op, std::error_code ec,
                             std::span<const kvtier::chunk_status> st) {
  std::string detail;
  if (ec != kvtier::errc::shutdown || !s.is_closed()) detail = s.last_error();
  std::string msg = s.kind() + "." + op + ": " + ec.message();
  if (s.is_closed())
    msg = s.kind() + "." + op + ": the store is closed";
  else if (!detail.empty())
    msg += ": " + detail;
  raise_error(ec, msg, status_list(st));
}

void check_open(store_impl& s, const char* op) {
  if (s.is_closed())
    raise_error(make_error_code(kvtier::errc::shutdown), s.kind() + "." + op + ": the store is closed");
}

// One batch's byte regions: a list/tuple with one buffer per key, or one buffer cut into
// len(keys) values of value_bytes each (default: its size / len(keys), which must divide).
template <class Span>
std::vector<Span> regions_of(py::handle obj, std::size_t n, std::optional<std::size_t> value_bytes,
                             bool writable, buffer_hold& hold) {
  const char* role = writable ? "destination" : "source";
  std::vector<Span> out;
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    if (value_bytes) raise_invalid("value_bytes applies to a single buffer, not a list of them");
    if (seq.size() != n)
      raise_invalid(std::to_string(n) + " keys but " + std::to_string(seq.size()) + " " + role + "s");
    for (std::size_t i = 0; i < n; ++i) {
      const byte_region r =
          value_bytes_of(seq[i], writable, std::string(role) + " " + std::to_string(i), hold);
      out.push_back(Span(r.data, r.size));
    }
    return out;
  }
  const byte_region r = value_bytes_of(obj, writable, role, hold);
  if (n == 0) return out;
  std::size_t vb = 0;
  if (value_bytes) {
    vb = *value_bytes;
    if (vb != 0 && r.size / vb < n)
      raise_invalid(std::string(role) + " holds " + std::to_string(r.size) + " bytes: too small for " +
                    std::to_string(n) + " values of " + std::to_string(vb) + " bytes");
  } else {
    if (r.size % n != 0)
      raise_invalid(std::string(role) + " holds " + std::to_string(r.size) +
                    " bytes, not a multiple of the " + std::to_string(n) +
                    " keys: pass value_bytes or one buffer per key");
    vb = r.size / n;
  }
  for (std::size_t i = 0; i < n; ++i) out.push_back(Span(r.data + i * vb, vb));
  return out;
}

std::optional<std::size_t> value_bytes_of(py::handle h) {
  if (h.is_none()) return std::nullopt;
  if (PyBool_Check(h.ptr()) || !PyLong_Check(h.ptr()))
    raise_invalid("value_bytes must be an int, not " + type_name(h));
  const long long v = h.cast<long long>();
  if (v < 0) raise_invalid("value_bytes is " + std::to_string(v) + ": it must be >= 0");
  return static_cast<std::size_t>(v);
}

py::list call_exists(store_impl& s, py::handle keys, py::handle deadline) {
  check_open(s, "exists");
  const std::vector<kvtier::chunk_key> k = keys_of(keys);
  const kvtier::deadline dl = deadline_of(deadline);
  std::vector<kvtier::chunk_status> st(k.size());
  std::error_code ec;
  {
    py::gil_scoped_release nogil;
    ec = s.exists(k, st, dl);
  }
  if (ec) raise_call(s, "exists", ec, st);
  return status_list(st);
}

constexpr std::size_t unknown_bytes = SIZE_MAX;

// A get whose destination for some key has another size than the value stored under it (where the
// store can tell: stored_bytes set, store_impl::get): the caller's error, kvtier.InvalidArgument
// naming the first such key and both sizes, with the batch's statuses on it.
void check_sizes(store_impl& s, std::span<const std::span<std::byte>> dst,
                 std::span<const std::size_t> stored, std::span<const kvtier::chunk_status> st) {
  std::size_t first = stored.size(), count = 0;
  for (std::size_t i = 0; i < stored.size(); ++i)
    if (st[i] == kvtier::chunk_status::corrupt && stored[i] != unknown_bytes && stored[i] != dst[i].size()) {
      if (count++ == 0) first = i;
    }
  if (count == 0) return;
  std::string msg = s.kind() + ".get: key " + std::to_string(first) + "'s stored value is " +
                    std::to_string(stored[first]) + " bytes, the destination gives " +
                    std::to_string(dst[first].size());
  if (count > 1) msg += " (" + std::to_string(count - 1) + " more key" + (count > 2 ? "s" : "") + " like it)";
  msg += ": give each key a destination of its value's size (value_bytes, or one buffer per key)";
  raise_error(make_error_code(kvtier::errc::invalid_argument), msg, status_list(st));
}

// get and put: the batch's byte regions taken under the GIL, the store call without it.
template <class Span, class Call>
py::list call_values(store_impl& s, const char* op, py::handle keys, py::handle values, py::handle deadline,
                     py::handle value_bytes, Call&& call) {
  check_open(s, op);
  const std::vector<kvtier::chunk_key> k = keys_of(keys);
  const kvtier::deadline dl = deadline_of(deadline);
  constexpr bool writable = !std::is_const_v<typename Span::element_type>;
  buffer_hold hold;
  const std::vector<Span> v = regions_of<Span>(values, k.size(), value_bytes_of(value_bytes), writable, hold);
  std::vector<kvtier::chunk_status> st(k.size());
  std::vector<std::size_t> stored(writable ? k.size() : 0, unknown_bytes);
  std::error_code ec;
  {
    py::gil_scoped_release nogil;  // the buffers stay exported by `hold` until it goes, GIL held
    ec = call(k, v, st, dl, stored);
  }
  if constexpr (writable) check_sizes(s, v, stored, st);
  if (ec) raise_call(s, op, ec, st);
  return status_list(st);
}

py::list call_get(store_impl& s, py::handle keys, py::handle dst, py::handle deadline,
                  py::handle value_bytes) {
  return call_values<std::span<std::byte>>(
      s, "get", keys, dst, deadline, value_bytes,
      [&](auto& k, auto& v, auto& st, auto dl, std::vector<std::size_t>& n) {
        return s.get(k, v, st, dl, n);
      });
}

py::list call_put(store_impl& s, py::handle keys, py::handle src, py::handle deadline,
                  py::handle value_bytes) {
  return call_values<std::span<const std::byte>>(
      s, "put", keys, src, deadline, value_bytes,
      [&](auto& k, auto& v, auto& st, auto dl, std::vector<std::size_t>&) { return s.put(k, v, st, dl); });
}

py::dict remote_stats(const kvtier::remote_store_stats& x) {
  py::dict d;
  d["hits"] = x.hits, d["misses"] = x.misses, d["corrupt"] = x.corrupt, d["wrong_length"] = x.wrong_length;
  d["bad_header"] = x.bad_header, d["bad_checksum"] = x.bad_checksum, d["other_format"] = x.other_format;
  d["timeouts"] = x.timeouts, d["errors"] = x.errors, d["bytes_fetched"] = x.bytes_fetched;
  d["bytes_stored"] = x.bytes_stored, d["redirects"] = x.redirects, d["retries"] = x.retries;
  d["map_refreshes"] = x.map_refreshes, d["down_refusals"] = x.down_refusals;
  d["breaker_trips"] = x.breaker_trips;
  return d;
}

// Runs `f(store)` on an open store with the shared lock, or raises ClosedError.
template <class Impl, class F>
auto on_open(Impl& s, const char* op, F&& f) {
  using R = decltype(f(s.store()));
  std::optional<R> out;
  if (!s.with_open([&] { out.emplace(f(s.store())); }))
    raise_error(make_error_code(kvtier::errc::shutdown), s.kind() + "." + op + ": the store is closed");
  return std::move(*out);
}

kvtier::resp::connection_options connection_of(double connect_timeout, int protocol,
                                               const std::string& client_name) {
  if (!(connect_timeout > 0)) raise_invalid("connect_timeout must be > 0 seconds");
  if (protocol != 2 && protocol != 3) raise_invalid("protocol must be 2 or 3");
  kvtier::resp::connection_options o;
  o.connect_timeout = std::chrono::milliseconds(static_cast<long long>(connect_timeout * 1e3 + 0.5));
  o.protocol = protocol;
  o.client_name = client_name;
  return o;
}

kvtier::value_format format_of(int version, std::uint64_t group_bytes) {
  if (version == 1) {
    if (group_bytes != 0) raise_invalid("group_bytes needs value_format=2");
    return kvtier::value_format::v1();
  }
  if (version == 2) return kvtier::value_format::v2(group_bytes);
  raise_invalid("value_format must be 1 or 2, not " + std::to_string(version));
}

kvtier::resp::pool_options pool_of(std::size_t connections, std::size_t reserved_small) {
  if (connections == 0) raise_invalid("connections must be >= 1");
  return {.connections = connections, .reserved_small = reserved_small};
}

std::shared_ptr<remote_impl> make_remote(const std::string& url, const kvtier::key_namespace& ns,
                                         std::optional<int> rank, std::size_t connections,
                                         std::size_t reserved_small, double connect_timeout, int protocol,
                                         int value_format, std::uint64_t group_bytes,
                                         const std::string& password_file, const std::string& client_name,
                                         std::optional<kvtier::resp::tls_options> tls) {
  kvtier::resp::url_result r = kvtier::resp::parse_url(url, rank);
  if (!r) raise_error(r.ec, r.message);
  if (std::string e = kvtier::resp::apply_password(r.value, {.file = password_file}); !e.empty())
    raise_invalid(e);
  if (tls && !r.value.tls)
    raise_invalid("RemoteStore: tls options given for " + kvtier::resp::redact_url(url) +
                  ", which is not a TLS URL (rediss:// or resp+tls://)");
  kvtier::resp::connection_options o = connection_of(connect_timeout, protocol, client_name);
  if (tls) o.tls = std::move(*tls);
  const bool use_tls = r.value.tls;
  o.server = std::move(r.value);
  auto impl = std::make_shared<remote_impl>("RemoteStore");
  const kvtier::resp::pool_options pool = pool_of(connections, reserved_small);
  const kvtier::value_format format = format_of(value_format, group_bytes);
  remote_parts& p = impl->store();
  if (!use_tls) {
    p.plain = std::make_unique<remote>(ns, std::move(o), pool, format);
  } else {
#if defined(KVTIER_PY_HAS_TLS)
    p.tls = std::make_unique<remote_tls>(ns, std::move(o), pool, format);
#else
    raise_invalid("RemoteStore: " + kvtier::resp::redact_url(url) +
                  " needs TLS, and this module was built without kvtier::tls (OpenSSL)");
#endif
  }
  return impl;
}

std::shared_ptr<cluster_impl> make_cluster(const std::string& url, const kvtier::key_namespace& ns, int rank,
                                           std::size_t connections, std::size_t reserved_small,
                                           double connect_timeout, int protocol, int value_format,
                                           std::uint64_t group_bytes, int max_rounds,
                                           std::optional<kvtier::resp::tls_options> tls) {
  kvtier::resp::cluster_url u = kvtier::resp::parse_cluster_url(url);
  if (!u) raise_error(u.ec, u.message);
  const bool use_tls = !u.seeds.empty() && u.seeds.front().tls;
  if (tls && !use_tls)
    raise_invalid("ClusterStore: tls options given for " + kvtier::resp::redact_url(url) +
                  ", which is not a TLS URL (resp+cluster+tls://)");
  if (max_rounds < 1) raise_invalid("max_rounds must be >= 1");
  kvtier::resp::connection_options c = connection_of(connect_timeout, protocol, "");
  if (tls) c.tls = std::move(*tls);
  kvtier::cluster_options o = kvtier::cluster_options_for(u, rank, std::move(c));
  o.pool = pool_of(connections, reserved_small);
  o.format = format_of(value_format, group_bytes);
  o.max_rounds = max_rounds;
  auto impl = std::make_shared<cluster_impl>("ClusterStore");
  cluster_parts& p = impl->store();
  if (!use_tls) {
    p.plain = std::make_unique<cluster>(ns, std::move(o));
  } else {
#if defined(KVTIER_PY_HAS_TLS)
    p.tls = std::make_unique<cluster_tls>(ns, std::move(o));
#else
    raise_invalid("ClusterStore: " + kvtier::resp::redact_url(url) +
                  " needs TLS, and this module was built without kvtier::tls (OpenSSL)");
#endif
  }
  return impl;
}

kvtier::write_policy writes_of(const std::string& s) {
  if (s == "write_through") return kvtier::write_policy::write_through;
  if (s == "l1_only") return kvtier::write_policy::l1_only;
  if (s == "l2_only") return kvtier::write_policy::l2_only;
  raise_invalid("writes must be 'write_through', 'l1_only' or 'l2_only', not '" + s + "'");
}

std::shared_ptr<store_impl> store_arg(py::handle h, const std::string& what) {
  if (h.is_none() || !py::isinstance<store_impl>(h))
    raise_invalid(what + " must be a kvtier.Store, not " + type_name(h));
  auto s = h.cast<std::shared_ptr<store_impl>>();
  if (s->is_closed())
    raise_error(make_error_code(kvtier::errc::shutdown), what + " (" + s->kind() + ") is closed");
  return s;
}

}  // namespace

void bind_stores(py::module_& m) {
  py::enum_<kvtier::chunk_status>(m, "Status", "Per-key outcome of exists/get/put.")
      .value("hit", kvtier::chunk_status::hit)
      .value("miss", kvtier::chunk_status::miss)
      .value("corrupt", kvtier::chunk_status::corrupt)
      .value("timeout", kvtier::chunk_status::timeout)
      .value("error", kvtier::chunk_status::error)
      .value("cancelled", kvtier::chunk_status::cancelled)
      .value("stored", kvtier::chunk_status::stored);

  py::class_<store_impl, std::shared_ptr<store_impl>>(
      m, "Store",
      "A chunk store. exists/get/put are batched, take a deadline (seconds from now or a kvtier.Deadline) "
      "and "
      "return one kvtier.Status per key; the GIL is released for the whole call. A call-level error "
      "(deadline, "
      "connection, closed) raises a kvtier.Error whose .status holds the per-key statuses.\n\n"
      "    dst = torch.empty(len(keys), 4096, dtype=torch.uint8)\n"
      "    status = store.get(keys, dst, 0.5)   # dst's own memory is written")
      .def("exists", &call_exists, py::arg("keys"), py::arg("deadline"),
           "Presence of each key: Status.hit or Status.miss.\n\n    store.exists(keys, 0.2)")
      .def(
          "get", &call_get, py::arg("keys"), py::arg("dst"), py::arg("deadline"), py::kw_only(),
          py::arg("value_bytes") = py::none(),
          "Reads each key's value into its destination: a list of writable buffers or contiguous CPU tensors "
          "(one per key, each exactly the value's size), or one buffer cut into len(keys) values of "
          "value_bytes "
          "(default: its size / len(keys)). No copy on the way: bytes land in the caller's memory. Items "
          "are bytes (uint8, int8) or a KV page's float16, bfloat16 or float8; another dtype raises "
          "kvtier.InvalidArgument, and so does a destination of another size than the value stored "
          "(MemoryStore, RemoteStore, ClusterStore: the message names both sizes).\n\n"
          "    store.get(keys, dst_tensor, kvtier.deadline_after(0.5), value_bytes=4096)")
      .def(
          "put", &call_put, py::arg("keys"), py::arg("src"), py::arg("deadline"), py::kw_only(),
          py::arg("value_bytes") = py::none(),
          "Writes each key's value from its source (as get's destinations, read-only allowed): Status.stored "
          "per key written.\n\n    store.put(keys, [b'abc', bytearray(3)], 1.0)")
      .def(
          "close",
          [](store_impl& s) {
            py::gil_scoped_release nogil;  // waits for calls in flight, which need no GIL
            s.close();
          },
          "Waits for calls in flight, then releases the store (connections closed). Later calls raise "
          "kvtier.ClosedError. Idempotent.\n\n    with kvtier.MemoryStore(1 << 20) as s: ...  # closed on "
          "exit")
      .def_property_readonly("closed", &store_impl::is_closed)
      .def_property_readonly("kind", &store_impl::kind)
      .def_property_readonly("identity", &store_impl::identity,
                             "The server this store talks to, 'host:port/db' without credentials (how "
                             "RendezvousStore names it); '' for memory, cluster and composed stores.")
      .def("last_error", &store_impl::last_error, "The store's last error text ('' if none).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](store_impl& s, py::handle, py::handle, py::handle) {
             py::gil_scoped_release nogil;
             s.close();
           })
      .def("__repr__",
           [](const store_impl& s) { return "<kvtier." + s.kind() + (s.is_closed() ? " (closed)>" : ">"); });

  py::class_<memory_impl, store_impl, std::shared_ptr<memory_impl>>(
      m, "MemoryStore",
      "L1: an LRU of at most capacity_bytes payload bytes in this process.\n\n"
      "    l1 = kvtier.MemoryStore(8 << 30)")
      .def(py::init(
               [](std::size_t capacity) { return std::make_shared<memory_impl>("MemoryStore", capacity); }),
           py::arg("capacity_bytes"))
      .def(
          "contains",
          [](memory_impl& s, const kvtier::chunk_key& k) {
            return on_open(s, "contains", [&](kvtier::memory_store& x) { return x.contains(k); });
          },
          py::arg("key"))
      .def(
          "erase",
          [](memory_impl& s, const kvtier::chunk_key& k) {
            return on_open(s, "erase", [&](kvtier::memory_store& x) { return x.erase(k); });
          },
          py::arg("key"))
      .def(
          "clear",
          [](memory_impl& s) { on_open(s, "clear", [](kvtier::memory_store& x) { return (x.clear(), 0); }); })
      .def_property_readonly("size_bytes",
                             [](memory_impl& s) {
                               return on_open(s, "size_bytes",
                                              [](kvtier::memory_store& x) { return x.size_bytes(); });
                             })
      .def_property_readonly("entry_count",
                             [](memory_impl& s) {
                               return on_open(s, "entry_count",
                                              [](kvtier::memory_store& x) { return x.entry_count(); });
                             })
      .def("stats", [](memory_impl& s) {
        const auto x = on_open(s, "stats", [](kvtier::memory_store& x) { return x.stats(); });
        py::dict d;
        d["hits"] = x.hits, d["misses"] = x.misses, d["corrupt"] = x.corrupt, d["stores"] = x.stores;
        d["evictions"] = x.evictions, d["rejected"] = x.rejected;
        return d;
      });

  py::class_<kvtier::resp::tls_options>(
      m, "TlsOptions",
      "TLS settings of a rediss:// or resp+tls:// RemoteStore: trusted CAs, "
      "client certificate and key (PEM files), the name to verify.\n\n"
      "    kvtier.RemoteStore('rediss://10.0.0.7:6380', ns,\n"
      "                       tls=kvtier.TlsOptions(ca_file='/etc/kvtier/ca.pem'))")
      .def(py::init([](std::string ca, std::string cert, std::string key, std::string name, bool verify) {
             return kvtier::resp::tls_options{std::move(ca), std::move(cert), std::move(key), std::move(name),
                                              verify};
           }),
           py::kw_only(), py::arg("ca_file") = "", py::arg("cert_file") = "", py::arg("key_file") = "",
           py::arg("server_name") = "", py::arg("verify_peer") = true)
      .def_readonly("ca_file", &kvtier::resp::tls_options::ca_file)
      .def_readonly("cert_file", &kvtier::resp::tls_options::cert_file)
      .def_readonly("key_file", &kvtier::resp::tls_options::key_file)
      .def_readonly("server_name", &kvtier::resp::tls_options::server_name)
      .def_readonly("verify_peer", &kvtier::resp::tls_options::verify_peer);

  py::class_<remote_impl, store_impl, std::shared_ptr<remote_impl>>(
      m, "RemoteStore",
      "L2 on one Redis-protocol server over Asio (TLS for rediss:// and resp+tls://, see TlsOptions): "
      "framed, "
      "checksummed values, a pool of connections, one pipelined round trip per batch, GET payloads read "
      "straight into the caller's buffer. The password comes from the URL, password_file or "
      "$KVTIER_PASSWORD.\n\n"
      "    l2 = kvtier.RemoteStore('resp://127.0.0.1:{rank+6400}', ns, rank=0)")
      .def(py::init(&make_remote), py::arg("url"), py::arg("namespace"), py::kw_only(),
           py::arg("rank") = py::none(), py::arg("connections") = 4, py::arg("reserved_small") = 1,
           py::arg("connect_timeout") = 2.0, py::arg("protocol") = 2, py::arg("value_format") = 1,
           py::arg("group_bytes") = 0, py::arg("password_file") = "", py::arg("client_name") = "",
           py::arg("tls") = py::none())
      .def("stats", [](remote_impl& s) {
        return remote_stats(on_open(s, "stats", [](remote_parts& x) { return x.stats(); }));
      });

  py::class_<cluster_impl, store_impl, std::shared_ptr<cluster_impl>>(
      m, "ClusterStore",
      "L2 on a Redis/Valkey Cluster: keys routed by hash slot, redirects followed inside the deadline.\n\n"
      "    l2 = kvtier.ClusterStore('resp+cluster://127.0.0.1:7000?placement=pinned', ns, rank=0)")
      .def(py::init(&make_cluster), py::arg("url"), py::arg("namespace"), py::kw_only(), py::arg("rank") = 0,
           py::arg("connections") = 4, py::arg("reserved_small") = 1, py::arg("connect_timeout") = 2.0,
           py::arg("protocol") = 2, py::arg("value_format") = 1, py::arg("group_bytes") = 0,
           py::arg("max_rounds") = 6, py::arg("tls") = py::none(),
           "tls: kvtier.TlsOptions for resp+cluster+tls:// (every node, and the MOVED targets, over TLS).")
      .def("stats", [](cluster_impl& s) {
        return remote_stats(on_open(s, "stats", [](cluster_parts& x) { return x.stats(); }));
      });

  py::class_<rendezvous_impl, store_impl, std::shared_ptr<rendezvous_impl>>(
      m, "RendezvousStore",
      "A rank's partition over K stores by rendezvous hashing of the key; batches split per instance and run "
      "in parallel.\n\n    s = kvtier.RendezvousStore([kvtier.RemoteStore(u, ns) for u in urls])")
      .def(py::init([](py::handle instances, std::uint64_t seed,
                       std::optional<std::vector<std::string>> names) {
             if (instances.is_none() || !py::isinstance<py::sequence>(instances))
               raise_invalid("instances must be a list of kvtier.Store, not " + type_name(instances));
             std::vector<std::shared_ptr<store_impl>> parts;
             py::sequence seq = py::reinterpret_borrow<py::sequence>(instances);
             for (std::size_t i = 0; i < seq.size(); ++i)
               parts.push_back(store_arg(seq[i], "instances[" + std::to_string(i) + "]"));
             if (parts.empty()) raise_invalid("RendezvousStore needs at least one instance");
             if (!names) {  // each instance named by its server, as the C++ rendezvous_store does
               names.emplace();
               for (std::size_t i = 0; i < parts.size(); ++i) {
                 names->push_back(parts[i]->identity());
                 if (names->back().empty())
                   raise_invalid("instances[" + std::to_string(i) + "] is a " + parts[i]->kind() +
                                 ", which has no server identity: pass names=[...] (each instance's lasting "
                                 "name)");
               }
             }
             try {
               return std::make_shared<rendezvous_impl>("RendezvousStore", std::move(parts),
                                                        std::move(*names), seed);
             } catch (const std::invalid_argument& e) {  // a count of names that differs, a name twice
               raise_invalid(e.what());
             }
           }),
           py::arg("instances"), py::arg("seed") = 0, py::kw_only(), py::arg("names") = py::none(),
           "Each instance is named by its server (RemoteStore: 'host:port/db') or by names[i]: a key "
           "keeps its instance when the list is reordered or another instance leaves.")
      .def(
          "instance_of",
          [](rendezvous_impl& s, const kvtier::chunk_key& k) {
            return on_open(s, "instance_of", [&](rendezvous_parts& x) { return x.r->instance_of(k); });
          },
          py::arg("key"), "The instance (0..size-1) that holds `key`.")
      .def_property_readonly("size",
                             [](rendezvous_impl& s) {
                               return on_open(s, "size", [](rendezvous_parts& x) { return x.r->size(); });
                             })
      .def_property_readonly(
          "names",
          [](rendezvous_impl& s) {
            return on_open(s, "names", [](rendezvous_parts& x) {
              std::vector<std::string> n;
              for (std::size_t i = 0; i < x.r->size(); ++i) n.push_back(x.r->name(i));
              return n;
            });
          },
          "Each instance's identity, in the list's order.\n\n    s.names  # ['127.0.0.1:6379/0', ...]");

  py::class_<tiered_impl, store_impl, std::shared_ptr<tiered_impl>>(
      m, "TieredStore",
      "L1 then L2: L2 hits promoted into L1, writes through both by default.\n\n"
      "    tiers = kvtier.TieredStore(kvtier.MemoryStore(1 << 30), l2)")
      .def(py::init([](py::handle l1, py::handle l2, const std::string& writes, bool promote) {
             kvtier::tiered_options o{.writes = writes_of(writes), .promote = promote};
             return std::make_shared<tiered_impl>("TieredStore", store_arg(l1, "l1"), store_arg(l2, "l2"), o);
           }),
           py::arg("l1"), py::arg("l2"), py::kw_only(), py::arg("writes") = "write_through",
           py::arg("promote") = true)
      .def("stats", [](tiered_impl& s) {
        const auto x = on_open(s, "stats", [](tiered_parts& p) { return p.tiers.stats(); });
        py::dict d;
        d["l1_hits"] = x.l1_hits, d["l2_hits"] = x.l2_hits, d["misses"] = x.misses,
        d["promoted"] = x.promoted;
        return d;
      });
}

}  // namespace kvtier_py
