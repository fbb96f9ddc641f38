// python/src/bind_pages.cpp: kvtier.KvLayout (the named engine layouts and the generic strides
// form), kvtier.KvCacheView (page bases taken from CPU torch tensors or buffers by pointer,
// their storages kept alive by the view) and the in-process communicator (kvtier.InprocWorld).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "connector_impl.hpp"

namespace kvtier_py {

namespace {

kvtier::kv_layout checked(kvtier::kv_layout l) {
  if (auto e = l.validate()) raise_invalid(e.message);
  return l;
}

kvtier::kv_order order_of(const std::string& s) {
  if (s == "nhd") return kvtier::kv_order::nhd;
  if (s == "hnd") return kvtier::kv_order::hnd;
  raise_invalid("order must be 'nhd' or 'hnd', not '" + s + "'");
}

// The base of one page: a contiguous CPU tensor (dtype of the layout's element size, or uint8)
// or a writable buffer, spanning at least `need` bytes.
std::byte* page_base(py::handle page, const kvtier::kv_layout& lay, std::uint64_t need,
                     const std::string& what, buffer_hold& hold) {
  if (page.is_none()) raise_invalid(what + " is None");
  if (is_tensor(page)) {
    const auto esize = page.attr("element_size")().cast<std::uint32_t>();
    const std::string dtype = py::str(page.attr("dtype"));
    if (esize != lay.elem_bytes && dtype != "torch.uint8")
      raise_invalid(what + " has dtype " + dtype + " (" + std::to_string(esize) +
                    "-byte elements); layout '" + lay.name + "' has " + std::to_string(lay.elem_bytes) +
                    "-byte elements (or pass a torch.uint8 view)");
  }
  const byte_region r = bytes_of(page, true, what, hold);
  if (r.size < need)
    raise_invalid(what + " holds " + std::to_string(r.size) + " bytes; layout '" + lay.name + "' needs " +
                  std::to_string(need));
  hold.keep(page);
  return r.data;
}

std::shared_ptr<py_view> view_of_list(const kvtier::kv_layout& lay, py::handle pages, std::size_t want,
                                      std::uint64_t need, bool per_plane) {
  checked(lay);
  if (pages.is_none() || !(PyList_Check(pages.ptr()) || PyTuple_Check(pages.ptr())))
    raise_invalid("pages must be a list of tensors or buffers, not " + type_name(pages));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(pages);
  if (seq.size() != want)
    raise_invalid(std::to_string(seq.size()) + " pages given; layout '" + lay.name + "' needs " +
                  std::to_string(want) + (per_plane ? " (num_layers * planes)" : " (num_layers)"));
  auto v = std::make_shared<py_view>();
  std::vector<std::byte*> bases;
  for (std::size_t i = 0; i < want; ++i)
    bases.push_back(page_base(seq[i], lay, need, "page " + std::to_string(i), v->hold));
  v->view =
      per_plane ? kvtier::kv_cache_view::per_plane(lay, bases) : kvtier::kv_cache_view::per_layer(lay, bases);
  if (auto e = v->view.validate()) raise_invalid(e.message);
  return v;
}

}  // namespace

void bind_pages(py::module_& m) {
  using L = kvtier::kv_layout;
  py::class_<L>(
      m, "KvLayout",
      "The shape and byte strides of a paged KV cache (kvtier/kv_layout.hpp). Entry of layer l, plane "
      "p, block b, token t, head h starts at plane_base(l, p) + b*block_stride + t*token_stride + "
      "h*head_stride. Built by a named constructor or from strides (validated either way).\n\n"
      "    lay = kvtier.KvLayout.vllm_mla(layers=4, num_blocks=1024, block_size=64)\n"
      "    lay.bytes_per_token   # 4 * 1152")
      .def(py::init([](std::uint32_t num_layers, std::uint64_t num_blocks, std::uint32_t block_size,
                       std::uint32_t planes, std::uint32_t heads, std::uint32_t head_bytes,
                       std::uint32_t elem_bytes, std::uint64_t block_stride, std::uint64_t token_stride,
                       std::uint64_t head_stride, std::uint64_t plane_stride, std::uint64_t layer_stride,
                       const std::string& name) {
             L l;
             l.name = name;
             l.num_layers = num_layers, l.num_blocks = num_blocks, l.block_size = block_size;
             l.planes = planes, l.heads = heads, l.head_bytes = head_bytes, l.elem_bytes = elem_bytes;
             l.block_stride = block_stride, l.token_stride = token_stride, l.head_stride = head_stride;
             l.plane_stride = plane_stride, l.layer_stride = layer_stride;
             return checked(std::move(l));
           }),
           py::kw_only(), py::arg("num_layers"), py::arg("num_blocks"), py::arg("block_size"),
           py::arg("planes"), py::arg("heads"), py::arg("head_bytes"), py::arg("elem_bytes"),
           py::arg("block_stride"), py::arg("token_stride"), py::arg("head_stride"),
           py::arg("plane_stride") = 0, py::arg("layer_stride") = 0, py::arg("name") = "custom",
           "The generic form: every stride in bytes; kvtier.InvalidArgument names a bad field.")
      .def_static(
          "vllm_mla",
          [](std::uint32_t layers, std::uint64_t blocks, std::uint32_t bs, std::uint32_t eb,
             std::uint32_t latent) { return checked(L::vllm_mla(layers, blocks, bs, eb, latent)); },
          py::arg("layers"), py::arg("num_blocks"), py::arg("block_size"), py::arg("elem_bytes") = 2,
          py::arg("latent") = 576, "vLLM MLA: per layer (num_blocks, block_size, latent) elements.")
      .def_static(
          "vllm_mla_fp8",
          [](std::uint32_t layers, std::uint64_t blocks, std::uint32_t bs) {
            return checked(L::vllm_mla_fp8(layers, blocks, bs));
          },
          py::arg("layers"), py::arg("num_blocks"), py::arg("block_size"),
          "vLLM MLA fp8 ('ds_mla'): per layer (num_blocks, block_size, 656) bytes.")
      .def_static(
          "vllm_flash_attn",
          [](std::uint32_t layers, std::uint64_t blocks, std::uint32_t bs, std::uint32_t heads,
             std::uint32_t hs, std::uint32_t eb, const std::string& order) {
            return checked(L::vllm_flash_attn(layers, blocks, bs, heads, hs, eb, order_of(order)));
          },
          py::arg("layers"), py::arg("num_blocks"), py::arg("block_size"), py::arg("heads"),
          py::arg("head_size"), py::arg("elem_bytes") = 2, py::arg("order") = "nhd",
          "vLLM FlashAttention: per layer (2, num_blocks, block_size, heads, head_size).")
      .def_static(
          "cross_layer",
          [](std::uint32_t layers, std::uint64_t blocks, std::uint32_t bs, std::uint32_t planes,
             std::uint32_t heads, std::uint32_t hs,
             std::uint32_t eb) { return checked(L::cross_layer(layers, blocks, bs, planes, heads, hs, eb)); },
          py::arg("layers"), py::arg("num_blocks"), py::arg("block_size"), py::arg("planes"),
          py::arg("heads"), py::arg("head_size"), py::arg("elem_bytes") = 2,
          "One tensor (num_blocks, layers, planes, block_size, heads, head_size): use KvCacheView.one_base.")
      .def_readonly("name", &L::name)
      .def_readonly("num_layers", &L::num_layers)
      .def_readonly("num_blocks", &L::num_blocks)
      .def_readonly("block_size", &L::block_size)
      .def_readonly("planes", &L::planes)
      .def_readonly("heads", &L::heads)
      .def_readonly("head_bytes", &L::head_bytes)
      .def_readonly("elem_bytes", &L::elem_bytes)
      .def_readonly("block_stride", &L::block_stride)
      .def_readonly("token_stride", &L::token_stride)
      .def_readonly("head_stride", &L::head_stride)
      .def_readonly("plane_stride", &L::plane_stride)
      .def_readonly("layer_stride", &L::layer_stride)
      .def_property_readonly("bytes_per_token", &L::bytes_per_token)
      .def_property_readonly("layer_bytes_per_token", &L::layer_bytes_per_token)
      .def_property_readonly("num_slots", &L::num_slots)
      .def_property_readonly("layer_extent", &L::layer_extent)
      .def_property_readonly("plane_extent", &L::plane_extent)
      .def_property_readonly("cache_extent", &L::cache_extent)
      .def("__repr__", [](const L& l) {
        return "KvLayout('" + l.name + "', layers=" + std::to_string(l.num_layers) +
               ", num_blocks=" + std::to_string(l.num_blocks) +
               ", block_size=" + std::to_string(l.block_size) +
               ", bytes_per_token=" + std::to_string(l.bytes_per_token()) + ")";
      });

  py::class_<py_view, std::shared_ptr<py_view>>(
      m, "KvCacheView",
      "A paged KV cache's memory: page bases taken from contiguous CPU torch tensors (or writable buffers) "
      "by pointer, no copy. The view keeps its pages' memory alive (also after a page tensor's set_); every "
      "page must span the layout's extent and have its element size (or be torch.uint8).\n\n"
      "    lay = kvtier.KvLayout.vllm_mla(2, num_blocks=64, block_size=16)\n"
      "    pages = [torch.zeros(64, 16, 576, dtype=torch.bfloat16) for _ in range(2)]\n"
      "    view = kvtier.KvCacheView.per_layer(lay, pages)")
      .def_static(
          "per_layer",
          [](const L& lay, py::handle pages) {
            return view_of_list(lay, pages, lay.num_layers, lay.layer_extent(), false);
          },
          py::arg("layout"), py::arg("pages"), "One page per layer (vLLM): layer l at pages[l].")
      .def_static(
          "per_plane",
          [](const L& lay, py::handle pages) {
            return view_of_list(lay, pages, std::size_t{lay.num_layers} * lay.planes, lay.plane_extent(),
                                true);
          },
          py::arg("layout"), py::arg("pages"),
          "One page per layer and plane (SGLang K/V pools): k0, v0, k1, ...")
      .def_static(
          "one_base",
          [](const L& lay, py::handle page) {
            checked(lay);
            auto v = std::make_shared<py_view>();
            v->view = kvtier::kv_cache_view::one_base(
                lay, page_base(page, lay, lay.cache_extent(), "page", v->hold));
            return v;
          },
          py::arg("layout"), py::arg("page"), "One allocation for the whole cache (cross-layer layouts).")
      .def_property_readonly("layout", [](const py_view& v) { return v.view.layout; })
      .def_property_readonly("num_planes", [](const py_view& v) { return v.view.planes.size(); });

  py::class_<kvtier::comm::inproc_world, std::shared_ptr<kvtier::comm::inproc_world>>(
      m, "InprocWorld",
      "W ranks on threads of this process; each rank thread takes communicator(rank). Collectives of the "
      "ranks meet in the world (the GIL is released while they wait).\n\n"
      "    world = kvtier.InprocWorld(2)\n"
      "    comms = [world.communicator(r) for r in range(2)]")
      .def(py::init([](std::uint32_t size) {
             if (size == 0) raise_invalid("InprocWorld size must be > 0");
             return std::make_shared<kvtier::comm::inproc_world>(size);
           }),
           py::arg("size"))
      .def_property_readonly("size", &kvtier::comm::inproc_world::size)
      .def(
          "communicator",
          [](std::shared_ptr<kvtier::comm::inproc_world> w, std::uint32_t rank) {
            if (rank >= w->size())
              raise_invalid("rank " + std::to_string(rank) + " is outside the world of " +
                            std::to_string(w->size()));
            auto c = std::make_shared<py_inproc_comm>();
            c->comm = std::make_unique<kvtier::comm::inproc_communicator>(*w, rank);
            c->world = std::move(w);
            return c;
          },
          py::arg("rank"), "Rank `rank`'s communicator (one per rank thread).");

  py::class_<py_inproc_comm, std::shared_ptr<py_inproc_comm>>(
      m, "InprocCommunicator",
      "One rank's handle on a kvtier.InprocWorld.\n\n    comm = kvtier.InprocWorld(2).communicator(0)")
      .def_property_readonly("rank", [](const py_inproc_comm& c) { return c.comm->rank(); })
      .def_property_readonly("size", [](const py_inproc_comm& c) { return c.comm->size(); })
      .def(
          "last_error", [](const py_inproc_comm& c) { return c.comm->last_error(); },
          "The last collective's error text ('' if none).");
}

}  // namespace kvtier_py
