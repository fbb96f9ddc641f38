// tests/connector/connector_model_gen.hpp: rapidcheck generators of connector_model.hpp's cases
// (model_case): a few prompts that share prefixes, what the stores hold, scripted adversaries, and
// the engine's calls as the flows of its requests interleaved. gen_options fixes the world and
// leaves out what ranks that are MPI processes cannot survive.
//
//   const model_case c = *gen_shrinking_case({.world = 2, .mpi = true});  // inside a property
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "connector/connector_model.hpp"

namespace kvtier::test::model {

/// What gen_case() makes. world: the number of ranks (0: 1 to 4). mpi: every rank a process over
/// MPI communicators (test_connector_model_mpi). MPI pairs collectives by position and a call that
/// times out poisons the communicator on the rank that timed out while its peers' may complete
/// (communicator.hpp); the connector cannot replace a poisoned communicator, so an MPI case leaves
/// out what would time out a collective on one rank only:
///  - no communicator fault that stalls or fails a round (comm_fault without slow_ms), no step_ms;
///  - no short deadline (command ms) on step or wait_for_layer (collectives): theirs is generous;
///  - short load deadlines only with two communicators: a move (a data broadcast, by the load's
///    deadline) that times out poisons only the data communicator, and the move's failure is
///    agreed on the control one at the next step (with one communicator it would poison the
///    step's).
struct gen_options {
  std::uint8_t world = 0;
  bool mpi = false;

  /// Whether case c keeps these rules (the shrinks of gen_shrinking_case keep to them).
  bool allows(const model_case& c) const {
    if (world && c.world != world) return false;
    if (!mpi) return true;
    if (c.step_ms || (c.load_ms && !c.two_comms)) return false;
    for (const comm_fault& f : c.comm)
      if (!f.slow_ms) return false;
    for (const command& k : c.commands)
      if (k.ms && (k.what == op::step || k.what == op::wait_for_layer)) return false;
    return true;
  }
};

// KVTIER_MODEL_WITHOUT=a,b,...: features the generator leaves out, to look past a known bug:
// negative_slots (minus_one, short_table), get_throws, late_hits, or any get_fault / slots_kind name.
inline bool without(const char* feature) {
  static const std::string list = [] {
    const char* e = std::getenv("KVTIER_MODEL_WITHOUT");
    return "," + std::string(e ? e : "") + ",";
  }();
  return list.find("," + std::string(feature) + ",") != std::string::npos;
}
inline int unless(const char* feature, int weight) { return without(feature) ? 0 : weight; }

inline rc::Gen<command> gen_command_of(std::optional<op> what, const gen_options& g);
inline rc::Gen<command> gen_command(const gen_options& g) { return gen_command_of(std::nullopt, g); }

inline rc::Gen<command> gen_command_of(std::optional<op> what, const gen_options& g) {
  return rc::gen::exec([what, g] {
    using rc::gen::inRange;
    using rc::gen::weightedElement;
    command c;
    c.what = what ? *what
                  : *weightedElement<op>({{6, op::begin_lookup},
                                          {3, op::step},
                                          {7, op::settle},
                                          {8, op::load},
                                          {5, op::wait_for_layer},
                                          {2, op::wait_local},
                                          {1, op::limit_load},
                                          {1, op::cancel_load},
                                          {5, op::compute},
                                          {4, op::save},
                                          {2, op::save_by_layer},
                                          {1, op::wait_for_save},
                                          {3, op::finish},
                                          {1, op::finished},
                                          {1, op::drain_events}});
    c.req = *weightedElement<std::uint8_t>({{5, 0}, {4, 1}, {2, 2}, {1, 3}});
    const auto some_rank = [] {
      return *weightedElement<std::uint8_t>({{2, 255}, {2, 0}, {1, 1}, {1, 2}, {1, 3}});
    };
    switch (c.what) {
      case op::step:
      case op::wait_for_layer:
      case op::wait_local:
      case op::wait_for_save:
        if (c.what == op::wait_for_layer) c.layer = *inRange<std::uint8_t>(0, 4), c.req = 0;
        if (c.what == op::step) c.req = 0;
        if (*weightedElement<int>({{3, 0}, {1, 1}})) c.ms = *rc::gen::element<std::uint8_t>(1, 5, 20);
        if (g.mpi && (c.what == op::step || c.what == op::wait_for_layer)) c.ms = 0;  // see gen_options
        break;
      case op::settle:
      case op::finished:
      case op::drain_events:
        c.req = 0;
        break;
      case op::load:
      case op::save:
      case op::save_by_layer: {
        const int range = *weightedElement<int>({{4, 0}, {2, 1}, {c.what == op::load ? 1 : 0, 2}});
        if (range == 1) c.a = *inRange<std::uint8_t>(0, 6), c.b = *inRange<std::uint8_t>(0, 6);
        if (range == 2) c.a = 254, c.b = 0;
        c.slots = *weightedElement<slots_kind>(
            {{14, slots_kind::ok},
             {c.what == op::load ? 2 : 0, slots_kind::block_table},
             {unless("short_slots", 1), slots_kind::short_slots},
             {unless("out_of_range", 1), slots_kind::out_of_range},
             {unless("negative_slots", 2), slots_kind::minus_one},
             {c.what == op::load ? unless("negative_slots", 1) : 0, slots_kind::short_table}});
        if (c.slots != slots_kind::ok) {
          c.rank = some_rank();
          if (range == 0) c.b = *inRange<std::uint8_t>(0, 16);  // where the bad slot is
        }
        if (c.what == op::save_by_layer)
          c.layer = *weightedElement<std::uint8_t>({{4, 255}, {1, 1}, {1, 2}, {1, 3}});
        break;
      }
      case op::limit_load:
        for (auto& cap : c.caps)
          cap = *weightedElement<std::uint8_t>({{2, 255}, {1, 0}, {2, 1}, {1, 2}, {1, 3}});
        break;
      case op::cancel_load:
        c.rank = some_rank();
        break;
      default:
        break;
    }
    return c;
  });
}

// One request's engine flow: look up, agree, load (part of the plan, maybe with bad slots; layer
// waits, caps), agree the outcome, compute the rest, save it (whole or by layer), finish; every
// step but the first may be left out.
inline std::vector<command> gen_flow(std::uint8_t r, std::uint8_t layers, const gen_options& g) {
  using rc::gen::weightedElement;
  const auto maybe = [](int yes, int no) { return *weightedElement<bool>({{no, false}, {yes, true}}); };
  std::vector<command> f{begin_lookup(r)};
  f.push_back(maybe(5, 1) ? settle() : step());
  if (maybe(5, 1)) {
    command l = *gen_command_of(op::load, g);
    l.req = r;
    f.push_back(l);
    if (maybe(1, 4)) f.push_back(*gen_command_of(op::limit_load, g)), f.back().req = r;
    if (maybe(1, 5)) f.push_back(*gen_command_of(op::cancel_load, g)), f.back().req = r;
    if (maybe(1, 5)) f.push_back(wait_local(r));
    if (maybe(3, 2))
      for (std::uint8_t layer = 0; layer < layers; ++layer)
        if (maybe(3, 1)) f.push_back(*gen_command_of(op::wait_for_layer, g)), f.back().layer = layer;
    if (maybe(1, 5)) {  // the engine drops the request while its load runs (a client went away)
      if (maybe(1, 1)) f.push_back(wait_local(r));
      f.push_back(step());
      f.push_back(finish(r));
      return f;
    }
    if (maybe(4, 1)) f.push_back(settle());
  }
  if (maybe(6, 1)) f.push_back(compute(r));
  if (maybe(3, 1)) {
    command s = *gen_command_of(maybe(3, 1) ? op::save : op::save_by_layer, g);
    s.req = r;
    f.push_back(s);
    if (maybe(1, 3)) f.push_back(wait_for_save(r));
  }
  if (maybe(3, 1)) f.push_back(finish(r));
  return f;
}

// The commands of a case: the flows of its requests interleaved (mostly in order), with a few
// random commands in between.
inline rc::Gen<std::vector<command>> gen_commands(std::size_t requests, std::uint8_t layers,
                                                  const gen_options& g) {
  return rc::gen::exec([requests, layers, g] {
    std::vector<std::vector<command>> flows;
    for (std::size_t r = 0; r < requests; ++r)
      flows.push_back(gen_flow(static_cast<std::uint8_t>(r), layers, g));
    std::vector<std::size_t> at(requests, 0);
    std::vector<command> out;
    for (;;) {
      std::vector<std::pair<std::uint32_t, std::size_t>> open;  // (weight, flow): earlier flows first
      for (std::size_t r = 0; r < requests; ++r)
        if (at[r] < flows[r].size())
          open.push_back({static_cast<std::uint32_t>(8 >> std::min<std::size_t>(open.size() * 2, 3)), r});
      if (open.empty()) break;
      if (*rc::gen::weightedElement<bool>({{9, false}, {1, true}})) out.push_back(*gen_command(g));
      std::uint32_t total = 0;
      for (const auto& o : open) total += o.first;
      std::uint32_t x = *rc::gen::inRange<std::uint32_t>(0, total);
      std::size_t r = open.back().second;
      for (const auto& o : open) {
        if (x < o.first) {
          r = o.second;
          break;
        }
        x -= o.first;
      }
      out.push_back(flows[r][at[r]++]);
    }
    return out;
  });
}

inline rc::Gen<get_fault_spec> gen_get_fault(bool streamed) {
  return rc::gen::exec([streamed] {
    get_fault_spec f;
    f.f = *rc::gen::weightedElement<get_fault>(
        {{4, get_fault::none},
         {unless("late_hits", 5), get_fault::late_hits},
         {unless("stall", 2), get_fault::stall},
         {unless("get_throws", 2), get_fault::throws},
         {unless("corrupt", 2), get_fault::corrupt},
         {streamed ? unless("corrupt_group", 2) : 0, get_fault::corrupt_group},
         {unless("evict", 2), get_fault::evict},
         {unless("slow_first", 1), get_fault::slow_first},
         {streamed ? unless("stall_group", 2) : 0, get_fault::stall_group}});
    const bool late_mid_stream = streamed && f.f == get_fault::late_hits;
    if (f.f == get_fault::corrupt || f.f == get_fault::corrupt_group || f.f == get_fault::evict ||
        late_mid_stream)
      f.key = *rc::gen::inRange<std::uint8_t>(0, 3);
    if (f.f == get_fault::corrupt_group || f.f == get_fault::stall_group || f.f == get_fault::slow_first ||
        late_mid_stream)
      f.group = *rc::gen::inRange<std::uint8_t>(0, 4);
    return f;
  });
}

inline rc::Gen<model_case> gen_case(const gen_options& g = {}) {
  return rc::gen::exec([g] {
    using rc::gen::inRange;
    using rc::gen::weightedElement;
    model_case c;
    c.world = g.world ? g.world : *inRange<std::uint8_t>(1, 5);
    c.two_comms = *rc::gen::arbitrary<bool>();
    c.streamed = *rc::gen::arbitrary<bool>();
    c.layers = *inRange<std::uint8_t>(2, 5);
    c.per_group = *inRange<std::uint8_t>(1, 3);
    c.batch = *weightedElement<std::uint8_t>({{2, 1}, {1, 0}, {1, 2}});
    c.workers = *weightedElement<std::uint8_t>({{3, 1}, {1, 2}});
    const std::size_t n = *inRange<std::size_t>(1, max_requests + 1);
    for (std::size_t i = 0; i < n; ++i) {
      prompt_spec p;
      p.family = *weightedElement<std::uint8_t>({{3, 0}, {1, 1}});
      p.chunks = *inRange<std::uint8_t>(1, 6);
      p.tail = *weightedElement<std::uint8_t>({{1, 0}, {1, 5}, {1, 15}});
      if (*weightedElement<int>({{2, 0}, {1, 1}}))
        p.diverge = *inRange<std::uint8_t>(0, 5), p.variant = *inRange<std::uint8_t>(0, 2);
      c.prompts.push_back(p);
    }
    const std::size_t warm = *weightedElement<std::size_t>({{1, 0}, {3, 1}, {2, 2}});
    for (std::size_t i = 0; i < warm; ++i) {
      warm_spec w;
      w.prompt = *inRange<std::uint8_t>(0, static_cast<std::uint8_t>(n));
      w.chunks = *inRange<std::uint8_t>(1, 6);
      if (*weightedElement<int>({{4, 0}, {1, 1}})) w.hole = *inRange<std::uint8_t>(0, 5);
      c.warm.push_back(w);
    }
    if (*weightedElement<bool>({{7, false}, {2, true}})) {  // an adversarial case: short deadlines
      c.load_ms = *rc::gen::element<std::uint16_t>(4, 8, 16);
      c.lookup_ms = 20;
      for (std::size_t r = 0; r < c.world; ++r) {
        rank_faults f;
        // Faults often after a call or two that work: a late hit after chunks that landed in
        // time is what makes a reach grow again.
        const std::size_t lead = *weightedElement<std::size_t>({{2, 0}, {2, 1}, {1, 2}});
        const std::size_t gets = *weightedElement<std::size_t>({{2, 0}, {3, 1}, {2, 2}, {1, 3}});
        if (gets) f.gets.resize(lead);
        for (std::size_t i = 0; i < gets; ++i) f.gets.push_back(*gen_get_fault(c.streamed));
        const std::size_t puts = *weightedElement<std::size_t>({{4, 0}, {1, 1}});
        for (std::size_t i = 0; i < puts; ++i)
          f.puts.push_back(*weightedElement<put_fault>(
              {{1, put_fault::none}, {3, put_fault::fails}, {2, put_fault::throws}, {1, put_fault::slow}}));
        const std::size_t ex = *weightedElement<std::size_t>({{6, 0}, {1, 1}});
        for (std::size_t i = 0; i < ex; ++i)
          f.exists.push_back(*weightedElement<exists_fault>({{1, exists_fault::none},
                                                             {1, exists_fault::stall},
                                                             {1, exists_fault::late},
                                                             {1, exists_fault::throws},
                                                             {1, exists_fault::error}}));
        c.faults.push_back(std::move(f));
      }
      if (!g.mpi && *weightedElement<int>({{3, 0}, {1, 1}})) {
        comm_fault f;
        f.rank = *inRange<std::uint8_t>(0, c.world);
        f.round = *inRange<std::uint8_t>(0, 12);
        const int kind = *weightedElement<int>({{2, 0}, {2, 1}, {1, 2}});
        f.fail = kind == 1;
        if (kind == 2)
          f.slow_ms = *rc::gen::element<std::uint8_t>(2, 5), f.round = *inRange<std::uint8_t>(0, 3),
          f.data = true;
        f.data = *rc::gen::arbitrary<bool>();
        c.comm.push_back(f);
        c.step_ms = *rc::gen::element<std::uint16_t>(10, 20);
      }
    }
    if (c.two_comms && *weightedElement<int>({{5, 0}, {1, 1}})) {
      // A rank whose moves join late (timing only, any case): the mover still moves a load
      // after the engine went on, e.g. finished it and gave its pages to the next request.
      comm_fault f;
      f.rank = *inRange<std::uint8_t>(0, c.world);
      f.round = *inRange<std::uint8_t>(0, 3);
      f.data = true;
      f.slow_ms = *rc::gen::element<std::uint8_t>(1, 2);
      c.comm.push_back(f);
    }
    if (g.mpi && c.load_ms) c.two_comms = true;  // see gen_options
    c.commands = *gen_commands(n, c.layers, g);
    return c;
  });
}

// gen_case() with the shrinks of smaller(): rapidcheck's own shrinking of gen::exec's picks keeps
// little of a failing command sequence; these remove commands, ranks, faults one at a time.
inline rc::Gen<model_case> gen_shrinking_case(const gen_options& g = {}) {
  return rc::Gen<model_case>([g](const rc::Random& random, int size) {
    return rc::shrinkable::shrinkRecur(gen_case(g)(random, size).value(), [g](const model_case& c) {
      std::vector<model_case> s = smaller(c);
      std::erase_if(s, [&](const model_case& x) { return !g.allows(x); });
      return rc::seq::fromContainer(std::move(s));
    });
  });
}

/// The model property: `run` (a case -> its first violation, empty when every invariant held)
/// over params.maxSuccess cases of gen_shrinking_case(g). Empty when it held (`passed`:
/// rapidcheck's report), else rapidcheck's report and the last case that failed, as it failed:
/// rapidcheck reports the smallest failing case by running it once more, and a failure that
/// depends on timing may not repeat.
///
///   const std::string failure = check_model_property("connector model", params, {}, run_case);
template <class Run>
std::string check_model_property(const std::string& description, const rc::detail::TestParams& params,
                                 const gen_options& g, Run run, std::string* passed = nullptr) {
  std::string last_failure;
  rc::detail::TestMetadata metadata;
  metadata.id = metadata.description = description;
  const auto result = rc::detail::checkTestable(
      [&] {
        const model_case c = *gen_shrinking_case(g);
        const std::string v = run(c);
        if (v.empty()) return;
        std::ostringstream os;
        os << c << "\n" << v;
        last_failure = os.str();
        RC_FAIL(v);
      },
      metadata, params);
  std::ostringstream report;
  rc::detail::printResultMessage(result, report);
  if (result.template is<rc::detail::SuccessResult>()) {
    if (passed) *passed = report.str();
    return {};
  }
  return report.str() + "\nthe last case that failed, as it failed:\n" + last_failure;
}

}  // namespace kvtier::test::model
