// python/src/bind_keys.cpp: chunk keys, key namespaces, key material and the chunker.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <variant>

#include "chunker_impl.hpp"
#include "common.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/detail/xxhash.hpp"

namespace kvtier_py {

namespace {

kvtier::tail_policy tail_of(const std::string& s) {
  if (s == "drop") return kvtier::tail_policy::drop;
  if (s == "hash_partial") return kvtier::tail_policy::hash_partial;
  raise_invalid("tail must be 'drop' or 'hash_partial', not '" + s + "'");
}

py_chunker make_chunker(const kvtier::key_namespace& ns, const std::string& tail, const std::string& hash) {
  const kvtier::tail_policy t = tail_of(tail);
  if (ns.chunk_tokens == 0) raise_invalid("KeyNamespace.chunk_tokens must be > 0");
  if (hash == "xxh3-128") return {xxh_chunker(ns, t), hash};
#if defined(KVTIER_PY_HAS_SHA256)
  if (hash == "sha256-128") return {sha_chunker(ns, t), hash};
  raise_invalid("hash must be 'xxh3-128' or 'sha256-128', not '" + hash + "'");
#else
  raise_invalid("hash must be 'xxh3-128' ('sha256-128' needs kvtier built with OpenSSL), not '" + hash + "'");
#endif
}

std::vector<kvtier::media_item> media_of(py::handle obj) {
  std::vector<kvtier::media_item> out;
  if (obj.is_none()) return out;
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj))
    raise_invalid("media must be a list of kvtier.MediaItem, not " + type_name(obj));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  for (std::size_t i = 0; i < seq.size(); ++i) {
    py::handle x = seq[i];
    if (!py::isinstance<kvtier::media_item>(x))
      raise_invalid("media[" + std::to_string(i) + "] is " + type_name(x) + ", not kvtier.MediaItem");
    out.push_back(x.cast<kvtier::media_item>());
  }
  return out;
}

std::string key_repr(const kvtier::chunk_key& k) { return "kvtier.ChunkKey.from_hex('" + k.to_hex() + "')"; }

kvtier::chunk_key key_from_hex(const std::string& s) {
  if (s.size() != 32)
    raise_invalid("a chunk key is 32 hex digits, got " + std::to_string(s.size()) + " characters");
  kvtier::chunk_key k;
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = s[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) raise_invalid("'" + s + "' is not hex (character " + std::to_string(i) + ")");
    std::uint64_t& w = i < 16 ? k.hi : k.lo;
    w = (w << 4) | static_cast<std::uint64_t>(d);
  }
  return k;
}

}  // namespace

std::vector<kvtier::chunk_key> keys_of(py::handle obj) {
  if (obj.is_none()) raise_invalid("keys is None");
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr()))
    raise_invalid("keys must be a list or tuple of kvtier.ChunkKey, not " + type_name(obj));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<kvtier::chunk_key> out;
  out.reserve(seq.size());
  for (std::size_t i = 0; i < seq.size(); ++i) {
    py::handle x = seq[i];
    if (!py::isinstance<kvtier::chunk_key>(x))
      raise_invalid("keys[" + std::to_string(i) + "] is " + type_name(x) + ", not kvtier.ChunkKey");
    out.push_back(x.cast<const kvtier::chunk_key&>());
  }
  return out;
}

void bind_keys(py::module_& m) {
  py::class_<kvtier::chunk_key>(m, "ChunkKey",
                                "A 128-bit chunk key (hi, lo).\n\n"
                                "    k = kvtier.ChunkKey(1, 2)\n"
                                "    assert kvtier.ChunkKey.from_hex(k.hex()) == k")
      .def(py::init([](std::uint64_t hi, std::uint64_t lo) {
             return kvtier::chunk_key{hi, lo};
           }),
           py::arg("hi") = 0, py::arg("lo") = 0)
      .def_static("from_hex", &key_from_hex, py::arg("text"), "The key of 32 hex digits (hi then lo).")
      .def_readwrite("hi", &kvtier::chunk_key::hi)
      .def_readwrite("lo", &kvtier::chunk_key::lo)
      .def(
          "hex", [](const kvtier::chunk_key& k) { return k.to_hex(); }, "32 hex digits, hi first.")
      .def("__repr__", &key_repr)
      .def("__eq__", [](const kvtier::chunk_key& a, const kvtier::chunk_key& b) { return a == b; })
      .def("__lt__", [](const kvtier::chunk_key& a, const kvtier::chunk_key& b) { return a < b; })
      .def("__hash__", [](const kvtier::chunk_key& k) { return kvtier::chunk_key_hash{}(k); })
      .def(py::pickle([](const kvtier::chunk_key& k) { return py::make_tuple(k.hi, k.lo); },
                      [](py::tuple t) {
                        return kvtier::chunk_key{t[0].cast<std::uint64_t>(), t[1].cast<std::uint64_t>()};
                      }));

  m.def(
      "content_hash",
      [](py::handle data) {
        buffer_hold hold;
        const byte_region r = bytes_of(data, false, "data", hold);
        XXH128_hash_t h;
        {
          py::gil_scoped_release nogil;
          h = XXH3_128bits(r.data, r.size);
        }
        return kvtier::chunk_key{h.high64, h.low64};
      },
      py::arg("data"),
      "XXH3-128 of a buffer's bytes, e.g. a media item's content hash.\n\n"
      "    kvtier.MediaItem(offset=10, length=64, content_hash=kvtier.content_hash(image_bytes))");

  py::class_<kvtier::key_namespace>(m, "KeyNamespace",
                                    "What makes KV bytes interchangeable: model, KV format, chunk size, "
                                    "layout version, ownership geometry.\n\n"
                                    "    ns = kvtier.KeyNamespace('my-model', 'fp8', chunk_tokens=256)")
      .def(py::init([](std::string model, std::string kv_format, std::uint32_t chunk_tokens,
                       std::uint32_t layout_version, std::string ownership) {
             if (chunk_tokens == 0) raise_invalid("chunk_tokens must be > 0");
             return kvtier::key_namespace{std::move(model), std::move(kv_format), chunk_tokens,
                                          layout_version, std::move(ownership)};
           }),
           py::arg("model"), py::arg("kv_format"), py::arg("chunk_tokens") = 256,
           py::arg("layout_version") = 1, py::arg("ownership") = "mod:1")
      .def_readonly("model", &kvtier::key_namespace::model)
      .def_readonly("kv_format", &kvtier::key_namespace::kv_format)
      .def_readonly("chunk_tokens", &kvtier::key_namespace::chunk_tokens)
      .def_readonly("layout_version", &kvtier::key_namespace::layout_version)
      .def_readonly("ownership", &kvtier::key_namespace::ownership)
      .def("canonical", &kvtier::key_namespace::canonical, "The canonical text the root key hashes.")
      .def("root", &kvtier::key_namespace::root, "The chain's root key.")
      .def("fingerprint", &kvtier::key_namespace::fingerprint, "64 bits naming the namespace.")
      .def("text", &kvtier::key_namespace::text, "16 hex digits of the fingerprint (in server key names).")
      .def(
          "remote_key_prefix", [](const kvtier::key_namespace& ns) { return kvtier::remote_key_prefix(ns); },
          "'kvtier:<text>:', the prefix of every server key name.")
      .def(
          "remote_key",
          [](const kvtier::key_namespace& ns, const kvtier::chunk_key& k) {
            return kvtier::remote_key_text(ns, k);
          },
          py::arg("key"), "The server key name of `key` (what RemoteStore GETs and SETs).")
      .def("__repr__", [](const kvtier::key_namespace& ns) {
        return "kvtier.KeyNamespace(model='" + ns.model + "', kv_format='" + ns.kv_format +
               "', chunk_tokens=" + std::to_string(ns.chunk_tokens) +
               ", layout_version=" + std::to_string(ns.layout_version) + ", ownership='" + ns.ownership +
               "')";
      });

  py::class_<kvtier::media_item>(
      m, "MediaItem",
      "A media item's placeholder token range and content hash, folded into every "
      "chunk the range overlaps.\n\n"
      "    kvtier.MediaItem(offset=10, length=64, content_hash=kvtier.ChunkKey(7, 9))")
      .def(py::init([](std::uint64_t offset, std::uint64_t length, const kvtier::chunk_key& h) {
             if (length == 0) raise_invalid("MediaItem.length must be > 0");
             return kvtier::media_item{offset, length, h};
           }),
           py::arg("offset"), py::arg("length"), py::arg("content_hash"))
      .def_readonly("offset", &kvtier::media_item::offset)
      .def_readonly("length", &kvtier::media_item::length)
      .def_readonly("content_hash", &kvtier::media_item::content_hash);

  py::class_<py_chunker>(m, "Chunker",
                         "Prefix-chained chunk keys of a prompt under a namespace.\n\n"
                         "    ch = kvtier.Chunker(kvtier.KeyNamespace('m', 'fp8', chunk_tokens=4))\n"
                         "    keys = ch.keys([1, 2, 3, 4, 5, 6, 7, 8], adapter='lora-7')  # 2 keys")
      .def(py::init(&make_chunker), py::arg("namespace"), py::arg("tail") = "drop",
           py::arg("hash") = "xxh3-128",
           "tail: 'drop' (no key for a partial chunk) or 'hash_partial'; hash: 'xxh3-128' or 'sha256-128'.")
      .def_property_readonly("namespace",
                             [](const py_chunker& c) { return c.visit([](auto& x) { return x.ns(); }); })
      .def_property_readonly(
          "chunk_tokens",
          [](const py_chunker& c) { return c.visit([](auto& x) { return x.chunk_tokens(); }); })
      .def_readonly("hash", &py_chunker::hash)
      .def(
          "key_count",
          [](const py_chunker& c, std::size_t n) { return c.visit([&](auto& x) { return x.key_count(n); }); },
          py::arg("n_tokens"), "Keys a prompt of n_tokens gets.")
      .def(
          "root",
          [](const py_chunker& c, const std::string& adapter, const std::string& tenant_salt) {
            const kvtier::key_material km{adapter, tenant_salt, {}};
            return c.visit([&](auto& x) { return x.root(km); });
          },
          py::arg("adapter") = "", py::arg("tenant_salt") = "", "The chain's root under this key material.")
      .def(
          "keys",
          [](const py_chunker& c, py::handle tokens, const std::string& adapter,
             const std::string& tenant_salt, py::handle media) {
            buffer_hold hold;
            std::vector<kvtier::token_id> storage;
            const std::span<const kvtier::token_id> t = tokens_of(tokens, storage, hold);
            const std::vector<kvtier::media_item> items = media_of(media);
            const kvtier::key_material km{adapter, tenant_salt, items};
            std::vector<kvtier::chunk_key> out;
            {
              py::gil_scoped_release nogil;  // the tokens stay held by `hold`
              c.visit([&](auto& x) { x.keys(t, km, out); });
            }
            return out;
          },
          py::arg("tokens"), py::kw_only(), py::arg("adapter") = "", py::arg("tenant_salt") = "",
          py::arg("media") = py::none(),
          "One key per full chunk of `tokens` (a list of ints, a 1-D integer numpy array or an integer CPU "
          "tensor), under the key material.\n\n    keys = ch.keys(torch.tensor(ids), tenant_salt='acme')")
      .def(
          "extend",
          [](const py_chunker& c, const kvtier::chunk_key& prev, py::handle tokens, py::handle media) {
            buffer_hold hold;
            std::vector<kvtier::token_id> storage;
            const std::span<const kvtier::token_id> t = tokens_of(tokens, storage, hold);
            const std::vector<kvtier::media_item> items = media_of(media);
            std::vector<kvtier::chunk_key> out;
            c.visit([&](auto& x) { x.extend(prev, t, items, out); });
            return out;
          },
          py::arg("prev"), py::arg("tokens"), py::arg("media") = py::none(),
          "Keys continuing the chain after `prev` (the last key of an earlier part).")
      .def(
          "remote_key",
          [](const py_chunker& c, const kvtier::chunk_key& k) {
            return c.visit([&](auto& x) { return kvtier::remote_key_text(x.ns(), k); });
          },
          py::arg("key"), "The server key name of `key`.");
}

}  // namespace kvtier_py
