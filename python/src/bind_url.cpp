// python/src/bind_url.cpp: server URLs (kvtier/resp/url.hpp, cluster URLs), with redaction:
// no message or repr shows a password.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "common.hpp"
#include "kvtier/resp/cluster.hpp"
#include "kvtier/resp/url.hpp"

namespace kvtier_py {

void bind_url(py::module_& m) {
  using kvtier::resp::endpoint;
  py::class_<endpoint>(
      m, "Endpoint",
      "A parsed server URL. repr() and describe() never show the password.\n\n"
      "    ep = kvtier.parse_url('resp://app:pw@127.0.0.1:6379/2')\n"
      "    ep.host, ep.port, ep.db, ep.describe()  # ('127.0.0.1', 6379, 2, '127.0.0.1:6379/2')")
      .def_property_readonly(
          "transport", [](const endpoint& e) { return e.kind == endpoint::transport::tcp ? "tcp" : "unix"; })
      .def_readonly("host", &endpoint::host)
      .def_readonly("port", &endpoint::port)
      .def_readonly("path", &endpoint::path)
      .def_readonly("user", &endpoint::user)
      .def_readonly("password", &endpoint::password, "The password (kept out of repr and messages).")
      .def_readonly("db", &endpoint::db)
      .def_readonly("tls", &endpoint::tls)
      .def("describe", &endpoint::describe, "'host:port/db' or 'unix:/path/db', without credentials.")
      .def("__repr__", [](const endpoint& e) {
        return "kvtier.Endpoint('" + e.describe() + "'" + (e.user.empty() ? "" : ", user='" + e.user + "'") +
               (e.password.empty() ? "" : ", password=***") + (e.tls ? ", tls=True" : "") + ")";
      });

  m.def(
      "parse_url",
      [](const std::string& url, std::optional<int> rank) {
        kvtier::resp::url_result r = kvtier::resp::parse_url(url, rank);
        if (!r) raise_error(r.ec, r.message);
        return r.value;
      },
      py::arg("url"), py::arg("rank") = py::none(),
      "Parses resp://[user[:password]@]host:port[/db], resp+unix:///path, rediss://, resp+tls:// with "
      "{rank} / {rank+N} substituted; raises kvtier.BadUrl (message redacted).\n\n"
      "    kvtier.parse_url('resp://127.0.0.1:{rank+6400}', rank=2).port  # 6402");
  m.def("redact_url", &kvtier::resp::redact_url, py::arg("url"),
        "`url` with its password replaced by '***'.\n\n"
        "    kvtier.redact_url('resp://app:s3cret@h:6379/2')  # 'resp://app:***@h:6379/2'");
  m.def("substitute_rank", &kvtier::resp::substitute_rank, py::arg("template"), py::arg("rank"),
        "Replaces every '{rank}' by `rank`.");
  m.def("is_cluster_url", &kvtier::resp::is_cluster_url, py::arg("url"),
        "True for resp+cluster:// and resp+cluster+tls://.");

  py::class_<kvtier::resp::cluster_url>(m, "ClusterUrl",
                                        "A parsed resp+cluster:// URL: seed nodes and placement.")
      .def_readonly("seeds", &kvtier::resp::cluster_url::seeds)
      .def_property_readonly("placement", [](const kvtier::resp::cluster_url& u) {
        return u.placement == kvtier::resp::cluster_placement::pinned ? "pinned" : "spread";
      });
  m.def(
      "parse_cluster_url",
      [](const std::string& url) {
        kvtier::resp::cluster_url u = kvtier::resp::parse_cluster_url(url);
        if (!u) raise_error(u.ec, u.message);
        return u;
      },
      py::arg("url"),
      "Parses resp+cluster://host:port[,host:port...][?placement=spread|pinned]; raises kvtier.BadUrl.\n\n"
      "    kvtier.parse_cluster_url('resp+cluster://10.0.0.1:7000,10.0.0.2:7000').seeds");
}

}  // namespace kvtier_py
