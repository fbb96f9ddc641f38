// python/src/chunker_impl.hpp: kvtier.Chunker's C++ side (a chunker of either hash), shared by
// the chunker bindings and kvtier.Connector (which takes the xxh3 one).
//
//   const kvtier_py::py_chunker& c = obj.cast<const kvtier_py::py_chunker&>();
//   c.visit([&](auto& x) { return x.chunk_tokens(); });
#pragma once

#include <string>
#include <variant>

#include "kvtier/chunker.hpp"
#if defined(KVTIER_PY_HAS_SHA256)
#include "kvtier/chunk_hash_openssl.hpp"
#endif

namespace kvtier_py {

using xxh_chunker = kvtier::chunker<>;
#if defined(KVTIER_PY_HAS_SHA256)
using sha_chunker = kvtier::chunker<kvtier::sha256_128>;
using any_chunker = std::variant<xxh_chunker, sha_chunker>;
#else
using any_chunker = std::variant<xxh_chunker>;
#endif

/// A chunker of either hash, with the hash's name ("xxh3-128", "sha256-128").
struct py_chunker {
  any_chunker impl;
  std::string hash;

  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), impl);
  }
};

}  // namespace kvtier_py
