// python/src/bind_connector.cpp: kvtier.Connector, kvtier::connector over a kvtier.Store (the
// type-erased store_ref), an ownership policy (modulo, block interleave or rendezvous), a KvCacheView and an
// in-process or MPI communicator.
//
// Every call releases the GIL: step, wait_for_layer, check_deployment and close block (each by
// its deadline; close waits for the calls in flight), and the others wait for the engine lock
// that serialises the connector's engine-side calls (the C++ connector is driven by one thread).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <mutex>
#include <shared_mutex>
#include <variant>

#include "chunker_impl.hpp"
#include "connector_args.hpp"
#include "connector_impl.hpp"
#include "kvtier/connector.hpp"
#include "store_impl.hpp"

namespace kvtier_py {

namespace {

template <class Comm>
using conn_t = kvtier::connector<store_ref, Comm, Comm, py_ownership>;
using inproc_conn = conn_t<kvtier::comm::inproc_communicator>;
#if defined(KVTIER_PY_HAS_MPI)
using mpi_conn = conn_t<kvtier::comm::mpi_communicator>;
using any_conn = std::variant<std::monostate, std::unique_ptr<inproc_conn>, std::unique_ptr<mpi_conn>>;
#else
using any_conn = std::variant<std::monostate, std::unique_ptr<inproc_conn>>;
#endif

// A local wait's failure (wait_local, wait_for_save) as a Python exception: InvalidArgument for an
// id the call does not know here, else the error (TimeoutError) with what did not end in time.
void raise_wait_error(std::error_code ec, const char* call, kvtier::request_id id, const char* unknown,
                      const char* not_ended) {
  const std::string what = std::string("Connector.") + call + "(request " + std::to_string(id) + "): ";
  if (ec == kvtier::errc::invalid_argument) raise_invalid(what + unknown);
  if (ec) raise_error(ec, what + not_ended);
}

struct py_connector {
  store_ref store;
  std::shared_ptr<py_view> pages;
  py::object ctrl_obj, data_obj;  // the communicators' Python objects, kept alive
  std::function<std::string()> ctrl_error;
  any_conn c;
  mutable std::shared_mutex life;  // shared by every call, exclusive by close()
  mutable std::mutex engine;       // the engine-side calls, one at a time
  bool closed = false;

  py_connector() = default;
  py_connector(const py_connector&) = delete;
  ~py_connector() {
    py::gil_scoped_release nogil;  // the connector's threads end without the GIL
    close();
  }
  void close() {
    std::unique_lock lock(life);
    closed = true;
    c = std::monostate{};
  }

  // Runs f(connector&) under the shared lock (and the engine lock when `engine_side`), GIL released.
  template <class F>
  decltype(auto) with(F&& f, bool engine_side = true) {
    py::gil_scoped_release nogil;
    std::shared_lock lock(life);
    if (closed) {
      py::gil_scoped_acquire gil;
      raise_error(make_error_code(kvtier::errc::shutdown), "Connector is closed");
    }
    std::unique_lock eng(engine, std::defer_lock);
    if (engine_side) eng.lock();
    return std::visit(
        [&](auto& p) -> decltype(f(*std::get<1>(c))) {
          if constexpr (std::is_same_v<std::decay_t<decltype(p)>, std::monostate>)
            throw std::logic_error("kvtier.Connector: no connector");
          else
            return f(*p);
        },
        c);
  }
};

template <class Comm>
std::unique_ptr<conn_t<Comm>> make(py_connector& pc, const py_chunker& ch, Comm& ctrl, Comm& data,
                                   kvtier::connector_options opt, const std::string& ownership) {
  const auto* x = std::get_if<xxh_chunker>(&ch.impl);
  if (!x) raise_invalid("Connector needs an xxh3-128 Chunker, not " + ch.hash);
  if constexpr (requires { ctrl.last_error(); })
    pc.ctrl_error = [&ctrl] { return std::string(ctrl.last_error()); };
  py_ownership own = ownership_of(ownership, ctrl.size());
  if (std::string why = kvtier::detail::connector_namespace_problem(own, x->ns()); !why.empty())
    raise_invalid("Connector(ownership='" + ownership + "'): " + why);
  try {
    return std::make_unique<conn_t<Comm>>(*x, std::move(own), pc.store, ctrl, data, pc.pages->view,
                                          std::move(opt));
  } catch (const std::invalid_argument& e) {
    raise_invalid(e.what());
  }
}

std::shared_ptr<py_connector> make_connector(py::handle chunker, py::handle store, py::handle comm,
                                             py::handle pages, py::handle data, const std::string& policy,
                                             std::optional<kvtier::prefill_node> node,
                                             std::optional<kvtier::load_path> prior, double lookup_timeout,
                                             double save_timeout,
                                             std::tuple<double, double, double> load_timeout,
                                             const std::string& saves, std::uint32_t save_after_lookups,
                                             std::uint32_t layers_per_group, std::size_t max_bytes_in_flight,
                                             std::size_t fetch_workers, std::size_t fetch_batch_chunks,
                                             const std::string& ownership, bool wall_clock_samples) {
  if (chunker.is_none() || !py::isinstance<py_chunker>(chunker))
    raise_invalid("chunker must be a kvtier.Chunker, not " + type_name(chunker));
  if (store.is_none() || !py::isinstance<store_impl>(store))
    raise_invalid("store must be a kvtier.Store, not " + type_name(store));
  if (pages.is_none() || !py::isinstance<py_view>(pages))
    raise_invalid("pages must be a kvtier.KvCacheView, not " + type_name(pages));
  auto s = store.cast<std::shared_ptr<store_impl>>();
  if (s->is_closed())
    raise_error(make_error_code(kvtier::errc::shutdown), "store (" + s->kind() + ") is closed");
  if (fetch_workers == 0) raise_invalid("fetch_workers must be > 0");
  kvtier::connector_options o;
  o.policy = policy_of(policy);
  if (node) o.node = *node;
  if (prior) o.prior = *prior;
  o.lookup_timeout = ms_of(lookup_timeout, "lookup_timeout");
  o.save_timeout = ms_of(save_timeout, "save_timeout");
  o.load_deadline = {ms_of(std::get<0>(load_timeout), "load_timeout[0] (base)"),
                     ms_of(std::get<1>(load_timeout), "load_timeout[1] (per 1000 tokens)"),
                     ms_of(std::get<2>(load_timeout), "load_timeout[2] (cap)")};
  o.saves = saves_of(saves);
  o.save_after_lookups = save_after_lookups;
  o.layers_per_group = layers_per_group;
  o.max_bytes_in_flight = max_bytes_in_flight;
  o.fetch_workers = fetch_workers;
  o.fetch_batch_chunks = fetch_batch_chunks;
  o.wall_clock_samples = wall_clock_samples;

  auto pc = std::make_shared<py_connector>();
  pc->store = store_ref{std::move(s)};
  pc->pages = pages.cast<std::shared_ptr<py_view>>();
  pc->ctrl_obj = py::reinterpret_borrow<py::object>(comm);
  pc->data_obj = py::reinterpret_borrow<py::object>(data.is_none() ? comm : data);
  const py_chunker& ch = chunker.cast<const py_chunker&>();
  if (py::isinstance<py_inproc_comm>(comm)) {
    if (!data.is_none() && !py::isinstance<py_inproc_comm>(data))
      raise_invalid("data must be a kvtier.InprocCommunicator like comm, not " + type_name(data));
    auto& c = *comm.cast<py_inproc_comm&>().comm;
    auto& d = *pc->data_obj.cast<py_inproc_comm&>().comm;
    pc->c = make(*pc, ch, c, d, std::move(o), ownership);
#if defined(KVTIER_PY_HAS_MPI)
  } else if (py::isinstance<py_mpi_comm>(comm)) {
    if (!data.is_none() && !py::isinstance<py_mpi_comm>(data))
      raise_invalid("data must be a kvtier.MpiCommunicator like comm, not " + type_name(data));
    auto& c = comm.cast<py_mpi_comm&>().comm;
    auto& d = pc->data_obj.cast<py_mpi_comm&>().comm;
    pc->c = make(*pc, ch, c, d, std::move(o), ownership);
#endif
  } else {
    raise_invalid("comm must be a kvtier.InprocCommunicator or kvtier.MpiCommunicator, not " +
                  type_name(comm));
  }
  return pc;
}

[[noreturn]] void raise_with(std::error_code ec, const std::string& what) {
  raise_error(ec, what + ": " + ec.message());
}

std::string load_problem(const std::optional<kvtier::load_plan>& plan, std::size_t slots,
                         std::optional<std::uint64_t> range_end, kvtier::request_id id) {
  const std::string r = "Connector.load(request " + std::to_string(id) + "): ";
  if (!plan) return r + "no agreed plan (lookup() is None: unknown request or lookup not yet agreed)";
  if (plan->tokens_to_load() == 0) return r + "the plan loads nothing (tokens_to_load == 0)";
  const std::uint64_t end = range_end.value_or(plan->load_end_token);
  if (slots < end)
    return r + std::to_string(slots) + " slots, the load needs " +
           (range_end ? "end_token" : "load_end_token") + " = " + std::to_string(end) +
           " (this rank takes part, loading nothing)";
  return r +
         "already loading, or its staging is over max_bytes_in_flight (this rank takes part, loading "
         "nothing)";
}

}  // namespace

void bind_connector(py::module_& m) {
  py::class_<kvtier::load_plan>(m, "LoadPlan",
                                "A request's agreed lookup: load [load_first_token, load_end_token), compute "
                                "the rest.\n\n    plan = conn.lookup(7)   # None until agreed")
      .def_readonly("cached_tokens", &kvtier::load_plan::cached_tokens)
      .def_readonly("prompt_tokens", &kvtier::load_plan::prompt_tokens)
      .def_readonly("load_first_token", &kvtier::load_plan::load_first_token)
      .def_readonly("load_end_token", &kvtier::load_plan::load_end_token)
      .def_property_readonly("tokens_to_load", &kvtier::load_plan::tokens_to_load)
      .def("__repr__", [](const kvtier::load_plan& p) {
        return "LoadPlan(cached_tokens=" + std::to_string(p.cached_tokens) + ", load=[" +
               std::to_string(p.load_first_token) + ", " + std::to_string(p.load_end_token) + "))";
      });
  py::class_<kvtier::load_outcome>(
      m, "LoadOutcome",
      "A load's agreed outcome: pages hold [load_first_token, loaded_end_token) on "
      "every rank; recompute from loaded_end_token.\n\n"
      "    out = conn.load_result(7); start = out.loaded_end_token")
      .def_readonly("load_first_token", &kvtier::load_outcome::load_first_token)
      .def_readonly("loaded_end_token", &kvtier::load_outcome::loaded_end_token)
      .def_readonly("requested_end_token", &kvtier::load_outcome::requested_end_token)
      .def_property_readonly("complete", &kvtier::load_outcome::complete)
      .def("__repr__", [](const kvtier::load_outcome& o) {
        return "LoadOutcome(loaded=[" + std::to_string(o.load_first_token) + ", " +
               std::to_string(o.loaded_end_token) +
               "), requested_end_token=" + std::to_string(o.requested_end_token) + ")";
      });
  py::class_<kvtier::request_error>(
      m, "RequestError",
      "This rank's own reason for a request's lookup, load or save ending short "
      "(never agreed).\n\n"
      "    for e in conn.errors(7): print(e.stage, e.chunk, e.message)")
      .def_readonly("id", &kvtier::request_error::id)
      .def_property_readonly("stage",
                             [](const kvtier::request_error& e) { return std::string(to_string(e.what)); })
      .def_readonly("chunk", &kvtier::request_error::chunk)
      .def_property_readonly("code", [](const kvtier::request_error& e) { return code_of(e.ec); })
      .def_property_readonly("code_name", [](const kvtier::request_error& e) { return code_name_of(e.ec); })
      .def_readonly("message", &kvtier::request_error::message)
      .def("__repr__", [](const kvtier::request_error& e) { return "RequestError(" + e.message + ")"; });
  py::class_<kvtier::finished_requests>(m, "FinishedRequests",
                                        "Requests whose work ended since the last finished() call, and this "
                                        "rank's save failures of the requests finished since then.\n\n"
                                        "    done = conn.finished(); free(done.saves)")
      .def_readonly("loads", &kvtier::finished_requests::loads)
      .def_readonly("saves", &kvtier::finished_requests::saves)
      .def_readonly("save_errors", &kvtier::finished_requests::save_errors);
  py::class_<kvtier::kv_event>(m, "KvEvent",
                               "A router event: chunks this rank stored, or found evicted.\n\n"
                               "    for e in conn.drain_events(): print(e.kind, e.rank, len(e.keys))")
      .def_property_readonly("kind",
                             [](const kvtier::kv_event& e) {
                               return e.what == kvtier::kv_event::kind::stored ? "stored" : "evicted";
                             })
      .def_readonly("rank", &kvtier::kv_event::rank)
      .def_readonly("keys", &kvtier::kv_event::keys);

  py::class_<py_connector, std::shared_ptr<py_connector>>(
      m, "Connector",
      "One rank's kvtier::connector: the request lifecycle over `store` (the chunks this rank owns under "
      "`ownership`), `pages` (a KvCacheView) and `comm` (InprocCommunicator or MpiCommunicator; `data`, a "
      "second "
      "one of the same kind, moves layers on a mover thread). Every rank calls the same methods for the same "
      "requests in the same order, and step() once per engine step. The GIL is released in every call. The "
      "chunker's namespace must carry the policy's geometry as its ownership ('mod' at W ranks: 'mod:W'; "
      "'block:I': 'block:I:W'; 'rendezvous:S': 'rendezvous:W:S'), else kvtier.InvalidArgument names both.\n\n"
      "    conn = kvtier.Connector(chunker, store, comm, view)\n"
      "    conn.begin_lookup(7, tokens)\n"
      "    while (plan := conn.lookup(7)) is None: conn.step(0.05)\n"
      "    if plan.tokens_to_load: conn.load(7, slots)\n"
      "    while (out := conn.load_result(7)) is None: conn.step(0.05)\n"
      "    conn.save(7, slots, out.loaded_end_token, len(tokens)); conn.finish(7)")
      .def(py::init(&make_connector), py::arg("chunker"), py::arg("store"), py::arg("comm"), py::arg("pages"),
           py::kw_only(), py::arg("data") = py::none(), py::arg("policy") = "always",
           py::arg("node") = py::none(), py::arg("prior") = py::none(), py::arg("lookup_timeout") = 0.05,
           py::arg("save_timeout") = 2.0, py::arg("load_timeout") = std::make_tuple(0.2, 0.02, 5.0),
           py::arg("saves") = "write_through", py::arg("save_after_lookups") = 2,
           py::arg("layers_per_group") = 0, py::arg("max_bytes_in_flight") = std::size_t{1} << 30,
           py::arg("fetch_workers") = 2, py::arg("fetch_batch_chunks") = 1, py::arg("ownership") = "mod",
           py::arg("wall_clock_samples") = true,
           "policy: 'always', 'cost' or 'split' (the last two need node: kvtier.PrefillNode); load_timeout: "
           "(base s, s per 1000 tokens, cap s); saves: 'write_through' or 'selective'; ownership: which rank "
           "owns chunk c, 'mod' (c mod W), 'block:I' ((c // I) mod W) or 'rendezvous[:SEED]' (hashing c), "
           "the same on every rank (check_deployment compares it); wall_clock_samples: False keeps each "
           "load's "
           "wall time out of the estimator (record_load_sample's are then the only samples).")
      .def_property_readonly("rank",
                             [](py_connector& p) { return p.with([](auto& c) { return c.rank(); }, false); })
      .def_property_readonly(
          "chunk_bytes",
          [](py_connector& p) { return p.with([](auto& c) { return c.chunk_bytes(); }, false); })
      .def_property_readonly("closed", [](const py_connector& p) { return p.closed; })
      .def(
          "check_deployment",
          [](py_connector& p, py::handle deadline) {
            const kvtier::deadline dl = deadline_of(deadline);
            auto r = p.with([&](auto& c) { return c.check_deployment(dl); });
            if (r.ec)
              raise_error(r.ec,
                          "Connector.check_deployment: " + (r.message.empty() ? r.ec.message() : r.message));
          },
          py::arg("deadline"),
          "Once at setup on every rank (a collective): raises kvtier.InvalidArgument naming the field and "
          "rank "
          "when ranks are configured differently.\n\n    conn.check_deployment(5.0)")
      .def(
          "begin_lookup",
          [](py_connector& p, kvtier::request_id id, py::handle tokens, const std::string& adapter,
             const std::string& tenant_salt, std::optional<std::uint64_t> prompt_tokens) {
            buffer_hold hold;
            std::vector<kvtier::token_id> storage;
            const std::span<const kvtier::token_id> t = tokens_of(tokens, storage, hold);
            const kvtier::key_material km{adapter, tenant_salt, {}};
            std::optional<std::string> bad;
            const std::error_code ec = p.with([&](auto& c) {
              if (!prompt_tokens) return c.begin_lookup(id, t, km);
              try {
                return c.begin_lookup(id, t, *prompt_tokens, km);
              } catch (const std::invalid_argument& e) {  // fewer prompt tokens than keyed ones
                bad = e.what();
                return std::error_code{};
              }
            });
            if (bad) raise_invalid("Connector.begin_lookup(request " + std::to_string(id) + "): " + *bad);
            if (ec)
              raise_error(ec, "Connector.begin_lookup: request " + std::to_string(id) + " is already known");
          },
          py::arg("id"), py::arg("tokens"), py::kw_only(), py::arg("adapter") = "",
          py::arg("tenant_salt") = "", py::arg("prompt_tokens") = py::none(),
          "Starts a request's lookup (this rank asks its store about the chunks it owns). Never blocks. "
          "prompt_tokens: the whole prompt's length when only `tokens` (a prefix) is keyed.\n\n"
          "    conn.begin_lookup(7, torch.tensor(ids))")
      .def(
          "step",
          [](py_connector& p, py::handle deadline,
             std::optional<std::vector<std::uint64_t>> words) -> py::object {
            const kvtier::deadline dl = deadline_of(deadline);
            const std::error_code ec = p.with(
                [&](auto& c) { return words ? c.step(dl, std::span<std::uint64_t>(*words)) : c.step(dl); });
            if (ec) {
              const std::string e = p.ctrl_error ? p.ctrl_error() : std::string();
              raise_error(ec,
                          "Connector.step: the agreement failed (its lookups plan nothing, its loads load "
                          "nothing, on every rank): " +
                              (e.empty() ? ec.message() : e));
            }
            if (!words) return py::none();
            return py::cast(*words);
          },
          py::arg("deadline"), py::arg("words") = py::none(),
          "Once per engine step on every rank: one all-reduce agrees on every waiting lookup and load and "
          "starts "
          "the moves. Raises kvtier.Error (TimeoutError for a deadline) when the agreement failed; the "
          "requests "
          "are settled then (nothing cached / nothing loaded, on every rank). words: the engine's own 64-bit "
          "values in the same all-reduce (the same count on every rank); returns their min over ranks "
          "(for a max pass complements).\n\n    conn.step(0.05)\n    low, = conn.step(0.05, "
          "words=[my_free_blocks])")
      .def(
          "lookup",
          [](py_connector& p, kvtier::request_id id) {
            return p.with([&](auto& c) { return c.lookup(id); });
          },
          py::arg("id"),
          "The agreed LoadPlan, or None while not agreed (or an unknown id).\n\n    plan = conn.lookup(7)")
      .def(
          "load",
          [](py_connector& p, kvtier::request_id id, py::handle slots, py::handle block_table,
             std::optional<std::uint64_t> first_token, std::optional<std::uint64_t> end_token) {
            if (slots.is_none() == block_table.is_none())
              raise_invalid("Connector.load: pass slots or block_table, one of them");
            if (first_token.has_value() != end_token.has_value())
              raise_invalid(
                  "Connector.load: pass first_token and end_token together (a range), or neither "
                  "(the plan's range)");
            const kvtier::kv_layout& lay = p.pages->view.layout;
            std::vector<std::int64_t> s;
            std::optional<std::string> bad;
            try {  // a bad argument still takes part in the load (loading nothing)
              if (!slots.is_none()) {
                s = ints_of(slots, "slots", static_cast<std::int64_t>(lay.num_slots()));
              } else {
                const auto blocks =
                    ints_of(block_table, "block_table", static_cast<std::int64_t>(lay.num_blocks));
                const std::uint64_t T = lay.block_size;
                for (std::int64_t b : blocks)
                  for (std::uint64_t t = 0; t < T; ++t)
                    s.push_back(b * static_cast<std::int64_t>(T) + static_cast<std::int64_t>(t));
              }
            } catch (py::error_already_set& e) {
              bad = e.what();
              s.clear();
            }
            std::optional<kvtier::load_plan> plan;
            std::optional<std::string> bad_range;
            const std::error_code ec = p.with([&](auto& c) {
              plan = c.lookup(id);
              if (!first_token) return c.load(id, std::span<const std::int64_t>(s));
              try {
                return c.load(id, std::span<const std::int64_t>(s), *first_token, *end_token);
              } catch (const std::invalid_argument& e) {  // not whole chunks inside the plan
                bad_range = e.what();
                return std::error_code{};
              }
            });
            if (bad_range)
              raise_invalid("Connector.load(request " + std::to_string(id) + "): " + *bad_range +
                            " (this rank does not take part: pass the same range on every rank)");
            if (bad)
              raise_invalid("Connector.load(request " + std::to_string(id) + "): " + *bad +
                            " (this rank takes part, loading nothing)");
            if (ec) raise_error(ec, load_problem(plan, s.size(), end_token, id));
          },
          py::arg("id"), py::arg("slots") = py::none(), py::kw_only(), py::arg("block_table") = py::none(),
          py::arg("first_token") = py::none(), py::arg("end_token") = py::none(),
          "Starts the load of a planned request into the pages: slots[i] is prompt position i's slot (block "
          "* "
          "block_size + offset), or block_table[b] the block of positions [b*block_size, ...). Call it on "
          "every rank; a bad argument raises, and this rank still takes part (loading nothing). first_token, "
          "end_token: load only that range of the plan, whole chunks (the same on every rank; a range "
          "outside the plan raises kvtier.InvalidArgument and this rank does not take part).\n\n"
          "    conn.load(7, block_table=torch.tensor([3, 9], dtype=torch.int32))\n"
          "    conn.load(7, slots, first_token=0, end_token=64)   # a load capped below the hit")
      .def(
          "wait_local",
          [](py_connector& p, kvtier::request_id id, py::handle deadline) {
            const kvtier::deadline dl = deadline_of(deadline);
            raise_wait_error(p.with([&](auto& c) { return c.wait_local(id, dl); }), "wait_local", id,
                             "no load started for it on this rank",
                             "this rank's fetch did not end before the deadline");
          },
          py::arg("id"), py::arg("deadline"),
          "Returns once this rank's own part of load `id` has ended (its fetch done, or nothing of its "
          "own to fetch); kvtier.TimeoutError when the deadline passes first. Local: no collective. "
          "Called on every rank before step(), the next step agrees the whole load.\n\n"
          "    conn.load(7, slots); conn.wait_local(7, 1.0); conn.step(1.0)")
      .def(
          "wait_for_save",
          [](py_connector& p, kvtier::request_id id, py::handle deadline) {
            const kvtier::deadline dl = deadline_of(deadline);
            raise_wait_error(p.with([&](auto& c) { return c.wait_for_save(id, dl); }), "wait_for_save", id,
                             "neither known nor finishing on this rank",
                             "its saves did not end before the deadline");
          },
          py::arg("id"), py::arg("deadline"),
          "Returns once every save of the request queued so far has ended (stored or failed: errors(id) "
          "says why one failed); kvtier.TimeoutError when the deadline passes first. Local. vLLM's "
          "wait_for_save.\n\n"
          "    conn.save(7, slots, 0, n); conn.wait_for_save(7, 2.0)")
      .def(
          "limit_load",
          [](py_connector& p, kvtier::request_id id, std::size_t chunks) {
            const std::error_code ec = p.with([&](auto& c) { return c.limit_load(id, chunks); });
            if (ec)
              raise_invalid("Connector.limit_load(request " + std::to_string(id) +
                            "): no load running for it on this rank (unknown, not started, or agreed)");
          },
          py::arg("id"), py::arg("chunks"),
          "Caps this rank's part of a running load at its first `chunks` chunks; the agreed prefix is at "
          "most the least cap over ranks. Only lowers; local, never blocks.\n\n    conn.limit_load(7, 3)")
      .def(
          "cancel_load",
          [](py_connector& p, kvtier::request_id id) {
            const std::error_code ec = p.with([&](auto& c) { return c.cancel_load(id); });
            if (ec)
              raise_invalid("Connector.cancel_load(request " + std::to_string(id) +
                            "): no load running for it on this rank (unknown, not started, or agreed)");
          },
          py::arg("id"),
          "limit_load(id, 0) and this rank's fetch cancelled: every rank's outcome is nothing loaded.\n\n"
          "    conn.cancel_load(7)")
      .def(
          "record_load_sample",
          [](py_connector& p, std::uint64_t bytes, double seconds) {
            const std::error_code ec = p.with([&](auto& c) { return c.record_load_sample(bytes, seconds); });
            if (ec)
              raise_invalid("Connector.record_load_sample: needs bytes > 0 and seconds > 0 and finite, got " +
                            std::to_string(bytes) + " and " + std::to_string(seconds));
          },
          py::arg("bytes"), py::arg("seconds"),
          "Feeds the cost/split policies' estimator one load in the engine's own time (the same samples in "
          "the same order on every rank).\n\n    conn.record_load_sample(64 << 20, 0.031)")
      .def(
          "wait_for_layer",
          [](py_connector& p, std::uint32_t layer, py::handle deadline) {
            const kvtier::deadline dl = deadline_of(deadline);
            if (layer >= p.pages->view.layout.num_layers)
              raise_invalid("layer " + std::to_string(layer) + " is outside the cache's " +
                            std::to_string(p.pages->view.layout.num_layers) + " layers");
            const kvtier::layer_wait w = p.with([&](auto& c) { return c.wait_for_layer(layer, dl); });
            if (w.ec)
              raise_error(w.ec, "Connector.wait_for_layer(" + std::to_string(layer) + "): " +
                                    (w.ec == kvtier::errc::timeout ? std::string("the deadline passed")
                                                                   : w.ec.message()) +
                                    "; recompute from each load's agreed outcome (load_result)");
            py::dict ready;
            for (const kvtier::layer_ready& x : w.loads) ready[py::int_(x.id)] = py::int_(x.ready_end_token);
            return ready;
          },
          py::arg("layer"), py::arg("deadline"),
          "Waits until layer `layer` of every chunk every rank agreed to load is in this rank's pages and "
          "returns {request id: ready end token} for every load started and not finished: layer `layer` of "
          "tokens [load first token, ready end) is in the pages, agreed on every rank. A load cut short (its "
          "deadline, a gone chunk, a failed store) lists a ready end below its range: compute that layer of "
          "the rest yourself, or recompute from load_result's end afterwards. kvtier.TimeoutError when the "
          "deadline passes first (kvtier.Error for a failed agreement or move). While a running load has not "
          "agreed that layer's group it runs the step's agreement itself: call it for the same layers on "
          "every rank, like step().\n\n"
          "    ready = conn.wait_for_layer(0, 1.0)   # {7: 4096}: layer 0 of [0, 4096) of request 7")
      .def(
          "load_result",
          [](py_connector& p, kvtier::request_id id) {
            return p.with([&](auto& c) { return c.load_result(id); });
          },
          py::arg("id"),
          "The agreed LoadOutcome, or None while the load runs.\n\n    out = conn.load_result(7)")
      .def(
          "load_errors",
          [](py_connector& p, kvtier::request_id id) {
            return p.with([&](auto& c) { return c.load_errors(id); });
          },
          py::arg("id"),
          "The chunk indices of the load that failed (agreed on every rank).\n\n    conn.load_errors(7)")
      .def(
          "save",
          [](py_connector& p, kvtier::request_id id, py::handle slots, std::uint64_t first_token,
             std::uint64_t end_token, py::handle tokens) {
            const auto s =
                ints_of(slots, "slots", static_cast<std::int64_t>(p.pages->view.layout.num_slots()));
            if (end_token > s.size())
              raise_invalid("Connector.save(request " + std::to_string(id) + "): " +
                            std::to_string(s.size()) + " slots, end_token is " + std::to_string(end_token));
            buffer_hold hold;
            std::vector<kvtier::token_id> storage;
            const bool keyed_here = !tokens.is_none();
            const std::span<const kvtier::token_id> t =
                keyed_here ? tokens_of(tokens, storage, hold) : std::span<const kvtier::token_id>{};
            const std::error_code ec = p.with([&](auto& c) {
              return keyed_here ? c.save(id, t, s, first_token, end_token)
                                : c.save(id, s, first_token, end_token);
            });
            if (ec)
              raise_error(ec, "Connector.save: request " + std::to_string(id) +
                                  (keyed_here ? " is already known" : " is unknown"));
          },
          py::arg("id"), py::arg("slots"), py::arg("first_token"), py::arg("end_token"), py::kw_only(),
          py::arg("tokens") = py::none(),
          "Writes the request's full chunks in [first_token, end_token) this rank owns from the pages at "
          "`slots`, off the step. Keep the pages until finished() lists the request's saves (or "
          "wait_for_save). tokens: the prompt of a request never looked up, keyed here.\n\n"
          "    conn.save(7, slots, 0, len(tokens))")
      .def(
          "begin_save",
          [](py_connector& p, kvtier::request_id id, py::handle slots, std::uint64_t first_token,
             std::uint64_t end_token) {
            const auto s =
                ints_of(slots, "slots", static_cast<std::int64_t>(p.pages->view.layout.num_slots()));
            if (end_token > s.size())
              raise_invalid("Connector.begin_save(request " + std::to_string(id) + "): " +
                            std::to_string(s.size()) + " slots, end_token is " + std::to_string(end_token));
            const std::error_code ec =
                p.with([&](auto& c) { return c.begin_save(id, s, first_token, end_token); });
            if (ec)
              raise_error(ec, "Connector.begin_save: request " + std::to_string(id) +
                                  " is unknown or its save by layer is still being reported");
          },
          py::arg("id"), py::arg("slots"), py::arg("first_token"), py::arg("end_token"),
          "save() layer by layer (vLLM's save_kv_layer): the same chunks, each layer group gathered from "
          "the pages on the saver thread once save_layer() reported its layers final, put after the last. "
          "finish() before every layer was reported stores nothing (a save error names the group).\n\n"
          "    conn.begin_save(7, slots, 0, len(tokens))\n"
          "    for l in range(layers): compute(l); conn.save_layer(7, l)")
      .def(
          "save_layer",
          [](py_connector& p, kvtier::request_id id, std::uint32_t layer) {
            const std::error_code ec = p.with([&](auto& c) { return c.save_layer(id, layer); });
            if (ec)
              raise_error(ec, "Connector.save_layer(" + std::to_string(id) + ", " + std::to_string(layer) +
                                  "): no save by layer begun, a layer outside the cache's " +
                                  std::to_string(p.pages->view.layout.num_layers) + ", or reported already");
          },
          py::arg("id"), py::arg("layer"),
          "Layer `layer` of the pages of the request's save by layer (begin_save) is final. Never blocks.")
      .def(
          "errors",
          [](py_connector& p, kvtier::request_id id) {
            return p.with([&](auto& c) { return c.errors(id); });
          },
          py::arg("id"),
          "This rank's own reasons (RequestError) for the request so far: its lookup, load or save, each "
          "naming the chunk, with the store's words. Local; until finish(), then in finished().save_errors."
          "\n\n    conn.wait_for_save(7, 2.0); print([e.message for e in conn.errors(7)])")
      .def(
          "finish",
          [](py_connector& p, kvtier::request_id id) {
            return p.with([&](auto& c) { return c.finish(id).free_pages_now; });
          },
          py::arg("id"),
          "Ends a request on this rank (same point on every rank). True: its pages are free now; False: "
          "saves "
          "still read them, wait for finished().saves.\n\n    if not conn.finish(7): ...")
      .def(
          "finished", [](py_connector& p) { return p.with([&](auto& c) { return c.finished(); }); },
          "Requests whose loads were agreed, or whose saves ended after finish(), since the last call.\n\n"
          "    done = conn.finished()")
      .def(
          "drain_events", [](py_connector& p) { return p.with([&](auto& c) { return c.drain_events(); }); },
          "The router events (KvEvent) since the last call.\n\n    events = conn.drain_events()")
      .def(
          "counters",
          [](py_connector& p) {
            std::vector<std::pair<std::string, std::uint64_t>> v;
            p.with(
                [&](auto& c) {
                  const kvtier::connector_counters& k = c.counters();
                  v = {{"lookups", k.lookups.value()},
                       {"loads", k.loads.value()},
                       {"loads_cut_short", k.loads_cut_short.value()},
                       {"tokens_loaded", k.tokens_loaded.value()},
                       {"tokens_to_recompute", k.tokens_to_recompute.value()},
                       {"agreement_failures", k.agreement_failures.value()},
                       {"local_load_failures", k.local_load_failures.value()},
                       {"chunks_saved", k.chunks_saved.value()},
                       {"save_failures", k.save_failures.value()},
                       {"saves_skipped", k.saves_skipped.value()},
                       {"lookups_skipped", k.lookups_skipped.value()},
                       {"quarantined_blocks", k.quarantined_blocks.value()}};
                  return 0;
                },
                false);
            py::dict d;
            for (auto& [k, x] : v) d[py::str(k)] = x;
            return d;
          },
          "The lifecycle counts as a dict.\n\n    conn.counters()['tokens_loaded']")
      .def(
          "prometheus",
          [](py_connector& p, const std::string& prefix, const std::string& labels) {
            std::string out;
            p.with([&](auto& c) { return kvtier::write_prometheus(out, c.counters(), prefix, labels), 0; },
                   false);
            return out;
          },
          py::arg("prefix") = "kvtier_connector", py::arg("labels") = "",
          "The counters in the Prometheus text format.\n\n    text = conn.prometheus(labels='rank=\"0\"')")
      .def(
          "close",
          [](py_connector& p) {
            py::gil_scoped_release nogil;
            p.close();
          },
          "Waits for calls in flight, then stops the connector's threads. Later calls raise "
          "kvtier.ClosedError. "
          "Idempotent.\n\n    with kvtier.Connector(...) as conn: ...")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_connector& p, py::handle, py::handle, py::handle) {
        py::gil_scoped_release nogil;
        p.close();
      });
}

}  // namespace kvtier_py
