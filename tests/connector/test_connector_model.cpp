// Issue 26: the connector against a reference model (connector_model.hpp). Random sequences of
// engine calls on W = 1..4 rank threads, whole chunks and stream_groups, one communicator or two,
// with scripted adversaries (stores that answer late, stall, throw, corrupt a value or a layer
// group, lose a key between lookup and load, fail a put; a communicator round that fails or
// stalls on one rank), checked after every command: agreed values equal on every rank, what an
// answer says is in the pages is there, every store holds only the model's bytes, blocking calls
// return by their deadlines, nothing throws, nothing agreed changes, short loads are explained.
// The regression cases below are shrunk counterexamples the property found.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "connector/connector_model.hpp"
#include "support/property.hpp"

using namespace kvtier;
using namespace kvtier::test::model;

namespace {

// KVTIER_MODEL_WITHOUT=a,b,...: features the generator leaves out, to look past a known bug:
// negative_slots (minus_one, short_table), get_throws, late_hits, or any get_fault / slots_kind name.
bool without(const char* feature) {
  static const std::string list = [] {
    const char* e = std::getenv("KVTIER_MODEL_WITHOUT");
    return "," + std::string(e ? e : "") + ",";
  }();
  return list.find("," + std::string(feature) + ",") != std::string::npos;
}
int unless(const char* feature, int weight) { return without(feature) ? 0 : weight; }

rc::Gen<command> gen_command_of(std::optional<op> what);
rc::Gen<command> gen_command() { return gen_command_of(std::nullopt); }

rc::Gen<command> gen_command_of(std::optional<op> what) {
  return rc::gen::exec([what] {
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
std::vector<command> gen_flow(std::uint8_t r, std::uint8_t layers) {
  using rc::gen::weightedElement;
  const auto maybe = [](int yes, int no) { return *weightedElement<bool>({{no, false}, {yes, true}}); };
  std::vector<command> f{begin_lookup(r)};
  f.push_back(maybe(5, 1) ? settle() : step());
  if (maybe(5, 1)) {
    command l = *gen_command_of(op::load);
    l.req = r;
    f.push_back(l);
    if (maybe(1, 4)) f.push_back(*gen_command_of(op::limit_load)), f.back().req = r;
    if (maybe(1, 5)) f.push_back(*gen_command_of(op::cancel_load)), f.back().req = r;
    if (maybe(1, 5)) f.push_back(wait_local(r));
    if (maybe(3, 2))
      for (std::uint8_t layer = 0; layer < layers; ++layer)
        if (maybe(3, 1)) f.push_back(*gen_command_of(op::wait_for_layer)), f.back().layer = layer;
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
    command s = *gen_command_of(maybe(3, 1) ? op::save : op::save_by_layer);
    s.req = r;
    f.push_back(s);
    if (maybe(1, 3)) f.push_back(wait_for_save(r));
  }
  if (maybe(3, 1)) f.push_back(finish(r));
  return f;
}

// The commands of a case: the flows of its requests interleaved (mostly in order), with a few
// random commands in between.
rc::Gen<std::vector<command>> gen_commands(std::size_t requests, std::uint8_t layers) {
  return rc::gen::exec([requests, layers] {
    std::vector<std::vector<command>> flows;
    for (std::size_t r = 0; r < requests; ++r)
      flows.push_back(gen_flow(static_cast<std::uint8_t>(r), layers));
    std::vector<std::size_t> at(requests, 0);
    std::vector<command> out;
    for (;;) {
      std::vector<std::pair<std::uint32_t, std::size_t>> open;  // (weight, flow): earlier flows first
      for (std::size_t r = 0; r < requests; ++r)
        if (at[r] < flows[r].size())
          open.push_back({static_cast<std::uint32_t>(8 >> std::min<std::size_t>(open.size() * 2, 3)), r});
      if (open.empty()) break;
      if (*rc::gen::weightedElement<bool>({{9, false}, {1, true}})) out.push_back(*gen_command());
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

rc::Gen<get_fault_spec> gen_get_fault(bool streamed) {
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

rc::Gen<model_case> gen_case() {
  return rc::gen::exec([] {
    using rc::gen::inRange;
    using rc::gen::weightedElement;
    model_case c;
    c.world = *inRange<std::uint8_t>(1, 5);
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
      if (*weightedElement<int>({{3, 0}, {1, 1}})) {
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
    c.commands = *gen_commands(n, c.layers);
    return c;
  });
}

void print_stats() {
  const model_stats& s = stats();
  std::cout << "connector model: " << s.cases << " cases (" << s.adversarial << " adversarial), "
            << s.commands << " commands; " << s.loads << " load outcomes (" << s.complete << " complete, "
            << s.short_loads << " short; " << s.sane_loads << " checked complete by the sanity rule), "
            << s.layer_ok << " layer waits answered ok (" << s.layer_checked_chunks
            << " chunk layers checked)\n";
  if (std::getenv("KVTIER_MODEL_PROFILE")) {
    std::cout << "  setup " << s.setup_us / 1000 << " ms, end " << s.end_us / 1000 << " ms, teardown "
              << s.teardown_us / 1000 << " ms\n";
    for (int o = 0; o < 15; ++o)
      std::cout << "  " << name(static_cast<op>(o)) << ": " << s.op_n[o] << " x, " << s.op_us[o] / 1000
                << " ms\n";
  }
}

}  // namespace

// gen_case() with the shrinks of smaller(): rapidcheck's own shrinking of gen::exec's picks keeps
// little of a failing command sequence; these remove commands, ranks, faults one at a time.
rc::Gen<model_case> gen_shrinking_case() {
  return rc::Gen<model_case>([](const rc::Random& random, int size) {
    return rc::shrinkable::shrinkRecur(gen_case()(random, size).value(), [](const model_case& c) {
      return rc::seq::fromContainer(smaller(c));
    });
  });
}

TEST_CASE("connector model: random engine call sequences keep every invariant", "[property][connector]") {
  // The last failing case and its violation, as it failed: rapidcheck reports the smallest
  // failing case by running it once more, and a failure that depends on timing may not repeat.
  // (kvtier::test::prop, with that case added to the report.)
  static std::string last_failure;
  last_failure.clear();
  using namespace rc::detail;
  TestParams params = configuration().testParams;
  params.maxSuccess = kvtier::test::property_cases();
  TestMetadata metadata;
  metadata.id = metadata.description = "connector model";
  const auto result = checkTestable(
      [] {
        const model_case c = *gen_shrinking_case();
        const std::string v = run_case(c);
        if (v.empty()) return;
        std::ostringstream os;
        os << c << "\n" << v;
        last_failure = os.str();
        RC_FAIL(v);
      },
      metadata, params);
  std::ostringstream report;
  printResultMessage(result, report);
  if (!result.template is<SuccessResult>()) {
    INFO("connector model:\n"
         << report.str() << "\nthe last case that failed, as it failed:\n"
         << last_failure);
    FAIL();
  }
  std::cout << "property 'connector model': " << report.str() << "\n";
  print_stats();
  CHECK(stats().complete > 0);    // the suite loads something
  CHECK(stats().sane_loads > 0);  // and checks that a stored prefix loads whole
  CHECK(stats().layer_ok > 0);    // and that layer waits answer
}

// ---- regressions: shrunk counterexamples the property found ----------------------------------

namespace {
void expect_passes(const model_case& c) {
  INFO(c);
  const std::string v = run_case(c);
  INFO(v);
  CHECK(v.empty());
}
}  // namespace

TEST_CASE("connector model regression: an agreed reach that grows again (late hits)",
          "[connector][regression]") {
  // Bug 1. Chunk 0 lands; the get of chunk 1 answers hits 2 ms past the load deadline. At the
  // deadline rank 0 reports reach 1: wait_for_layer(0) returns ok with chunk 1 not in the pages;
  // then the late hit raises the target and the outcome counts chunk 1 loaded.
  expect_passes({.world = 1,
                 .layers = 2,
                 .per_group = 1,
                 .batch = 1,
                 .load_ms = 16,
                 .lookup_ms = 20,
                 .prompts = {{.family = 0, .chunks = 2}},
                 .warm = {{.prompt = 0, .chunks = 2}},
                 .faults = {{.gets = {{}, {get_fault::late_hits}}}},
                 .commands = {begin_lookup(0), settle(), load(0), wait_for_layer(0), settle()}});
  // The same with stream_groups: group 1 of chunk 1 lands past the deadline; wait_for_layer(1)
  // returns ok with layer 1 of chunk 1 not in the pages.
  expect_passes(
      {.world = 1,
       .streamed = true,
       .layers = 2,
       .per_group = 1,
       .batch = 0,
       .load_ms = 16,
       .lookup_ms = 20,
       .prompts = {{.family = 0, .chunks = 2}},
       .warm = {{.prompt = 0, .chunks = 2}},
       .faults = {{.gets = {{get_fault::late_hits, 1, 1}}}},
       .commands = {begin_lookup(0), settle(), load(0), wait_for_layer(1), wait_local(0), settle()}});
}

TEST_CASE("connector model regression: a -1 slot in a save stores zeros under the real key",
          "[connector][regression]") {
  // Bug 2, save: the chunk's value is gathered with one token's row left zero and stored with a
  // valid checksum: every later load of it gets wrong bytes as a complete hit.
  expect_passes({.world = 1,
                 .layers = 2,
                 .per_group = 1,
                 .batch = 1,
                 .prompts = {{.family = 0, .chunks = 1}},
                 .commands = {begin_lookup(0), compute(0), save(0).with_slots(slots_kind::minus_one)}});
  expect_passes(
      {.world = 1,
       .layers = 2,
       .per_group = 1,
       .batch = 1,
       .prompts = {{.family = 0, .chunks = 1}},
       .commands = {begin_lookup(0), compute(0), save_by_layer(0).with_slots(slots_kind::minus_one)}});
}

TEST_CASE("connector model regression: a load with a -1 slot or a short block table is agreed complete",
          "[connector][regression]") {
  // Bug 2, load: the position without a page is never written, yet the outcome says it is.
  expect_passes(
      {.world = 1,
       .layers = 2,
       .per_group = 1,
       .batch = 1,
       .prompts = {{.family = 0, .chunks = 1}},
       .warm = {{.prompt = 0, .chunks = 1}},
       .commands = {begin_lookup(0), settle(), load(0).with_slots(slots_kind::minus_one), settle()}});
  expect_passes(
      {.world = 1,
       .layers = 2,
       .per_group = 1,
       .batch = 1,
       .prompts = {{.family = 0, .chunks = 2}},
       .warm = {{.prompt = 0, .chunks = 2}},
       .commands = {begin_lookup(0), settle(), load(0).with_slots(slots_kind::short_table), settle()}});
}

TEST_CASE("connector model regression: a store that throws during a load leaves a reason",
          "[connector][regression]") {
  // Bug 3: the fetch fails (every key 'cancelled') and the load is agreed short with errors(id)
  // empty on every rank.
  expect_passes({.world = 1,
                 .layers = 2,
                 .per_group = 1,
                 .batch = 1,
                 .load_ms = 8,
                 .lookup_ms = 20,
                 .prompts = {{.family = 0, .chunks = 1}},
                 .warm = {{.prompt = 0, .chunks = 1}},
                 .faults = {{.gets = {{get_fault::throws}}}},
                 .commands = {begin_lookup(0), settle(), load(0), settle()}});
}

TEST_CASE("connector model regression: a put that throws fails the save", "[connector][regression]") {
  // Bug 4: the saver's put threw on the saver thread: std::terminate.
  allow_put_throws() = true;
  expect_passes({.world = 1,
                 .layers = 2,
                 .per_group = 1,
                 .batch = 1,
                 .prompts = {{.family = 0, .chunks = 1}},
                 .faults = {{.puts = {put_fault::throws}}},
                 .commands = {begin_lookup(0), compute(0), save(0)}});
}
