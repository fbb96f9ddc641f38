// Unit tests of the pcp_prefill example: JSON reader, trace format, generator,
// timing model, payloads, modeled stores and the report.
#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <sstream>

#include "json_line.hpp"
#include "model_stores.hpp"
#include "report.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

using namespace pcp;

TEST_CASE("splitmix64 is the usual definition and segment tokens follow the trace rule", "[unit]") {
  // The first two outputs of the reference SplitMix64 generator seeded with 0.
  CHECK(splitmix64(0) == 0xE220A8397B1DCDAFull);
  CHECK(splitmix64(0x9E3779B97F4A7C15ull) == 0x6E789E6AA1B965F4ull);
  for (std::uint64_t seed : {0ull, 1ull, 77ull, 0xFFFFFFFFull})
    for (std::uint64_t i : {0ull, 1ull, 255ull, 100000ull}) {
      const std::uint32_t t = segment_token(seed, i);
      CHECK(t == splitmix64((seed << 32) | i) % 151552);
      CHECK(t < vocab_size);
    }
}

TEST_CASE("json reader: values, escapes and errors with a column", "[unit]") {
  json_value v;
  std::string err;
  REQUIRE(parse_json(R"( {"a": [1, -2.5e1, true, null], "s": "x\"\u00e9\n", "o": {}} )", v, err));
  REQUIRE(v.kind == json_value::object);
  const json_value* a = v.find("a");
  REQUIRE(a);
  REQUIRE(a->items.size() == 4);
  CHECK(a->items[0].is_uint());
  CHECK(a->items[1].num == -25.0);
  CHECK_FALSE(a->items[1].is_uint());
  CHECK(a->items[2].b);
  CHECK(a->items[3].kind == json_value::null);
  CHECK(v.find("s")->text == "x\"\xC3\xA9\n");
  CHECK(v.find("missing") == nullptr);

  for (const char* bad :
       {"{", "{\"a\" 1}", "[1,]", "{\"a\": tru}", "\"open", "{} x", "01", "1.", "{\"a\":1,}"}) {
    INFO(bad);
    CHECK_FALSE(parse_json(bad, v, err));
    CHECK(err.find("column") != std::string::npos);
  }
}

TEST_CASE("json writer round-trips numbers and strings", "[unit]") {
  const std::string s =
      json_object_writer().field("x", 0.1).field("n", std::uint64_t{42}).field("s", "a\"b").str();
  json_value v;
  std::string err;
  REQUIRE(parse_json(s, v, err));
  CHECK(v.find("x")->num == 0.1);
  CHECK(v.find("n")->as_uint() == 42);
  CHECK(v.find("s")->text == "a\"b");
}

TEST_CASE("trace lines: tokens and segments", "[unit]") {
  request r;
  std::string err;
  REQUIRE(parse_trace_line(R"({"id": "a", "t": 1.5, "tokens": [5, 6, 7]})", "f:1", r, err));
  CHECK(r.id == "a");
  CHECK(r.t == 1.5);
  CHECK(r.tokens == std::vector<std::uint32_t>{5, 6, 7});

  REQUIRE(parse_trace_line(
      R"({"id": "b", "t": 0, "segments": [{"seed": 3, "len": 4}, {"seed": 9, "len": 2}], "x": 1})", "f:2", r,
      err));
  REQUIRE(r.tokens.size() == 6);
  CHECK(r.tokens[0] == segment_token(3, 0));
  CHECK(r.tokens[3] == segment_token(3, 3));
  CHECK(r.tokens[4] == segment_token(9, 0));
  CHECK(r.segments == std::vector<segment>{{3, 4}, {9, 2}});

  // Written lines read back as the same request.
  request back;
  REQUIRE(parse_trace_line(trace_line(r), "f:3", back, err));
  CHECK(back.tokens == r.tokens);
  CHECK(back.t == r.t);
}

TEST_CASE("trace lines: errors name the line and the field", "[unit]") {
  struct bad_case {
    const char* line;
    const char* must_contain;
  };
  const bad_case cases[] = {
      {"not json", "f:7: not valid JSON"},
      {"[1]", "expected a JSON object"},
      {R"({"t": 0, "tokens": [1]})", "field \"id\": missing"},
      {R"({"id": 5.5, "t": 0, "tokens": [1]})", "field \"id\""},
      {R"({"id": "a", "tokens": [1]})", "field \"t\": missing"},
      {R"({"id": "a", "t": "0", "tokens": [1]})", "field \"t\": expected a number"},
      {R"({"id": "a", "t": -1, "tokens": [1]})", "field \"t\": expected seconds >= 0"},
      {R"({"id": "a", "t": 0})", "missing \"tokens\" or \"segments\""},
      {R"({"id": "a", "t": 0, "tokens": [1], "segments": []})", "not both"},
      {R"({"id": "a", "t": 0, "tokens": [1, -2]})", "field \"tokens[1]\""},
      {R"({"id": "a", "t": 0, "tokens": [1, 4294967296]})", "field \"tokens[1]\""},
      {R"({"id": "a", "t": 0, "tokens": []})", "prompt is empty"},
      {R"({"id": "a", "t": 0, "segments": [{"len": 3}]})", "field \"segments[0].seed\": missing"},
      {R"({"id": "a", "t": 0, "segments": [{"seed": 4294967296, "len": 3}]})", "segments[0].seed"},
      {R"({"id": "a", "t": 0, "segments": [{"seed": 1, "len": 2}, {"seed": 1, "len": -3}]})",
       "segments[1].len"},
      {R"({"id": "a", "t": 0, "segments": [{"seed": 1, "len": 99999999}]})", "segments[0].len"},
      {R"({"id": "a", "t": 0, "segments": 3})", "field \"segments\": expected an array"},
  };
  for (const auto& c : cases) {
    INFO(c.line);
    request r;
    std::string err;
    CHECK_FALSE(parse_trace_line(c.line, "f:7", r, err));
    CHECK(err.rfind("f:7", 0) == 0);
    CHECK(err.find(c.must_contain) != std::string::npos);
  }
}

TEST_CASE("read_trace: blank lines, arrival order, duplicate ids", "[unit]") {
  std::vector<request> reqs;
  std::string err;
  std::istringstream ok(
      "{\"id\": \"b\", \"t\": 2, \"tokens\": [1]}\n\n{\"id\": \"a\", \"t\": 1, \"tokens\": [2]}\n");
  REQUIRE(read_trace(ok, "t.jsonl", reqs, err));
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].id == "a");

  std::istringstream dup(
      "{\"id\": \"a\", \"t\": 0, \"tokens\": [1]}\n{\"id\": \"a\", \"t\": 1, \"tokens\": [1]}\n");
  CHECK_FALSE(read_trace(dup, "t.jsonl", reqs, err));
  CHECK(err.find("t.jsonl:2: field \"id\": duplicate") != std::string::npos);

  std::istringstream third("{\"id\": \"a\", \"t\": 0, \"tokens\": [1]}\n\n{\"id\": \"b\", \"t\": x}\n");
  CHECK_FALSE(read_trace(third, "t.jsonl", reqs, err));
  CHECK(err.rfind("t.jsonl:3:", 0) == 0);

  std::istringstream empty("\n\n");
  CHECK_FALSE(read_trace(empty, "t.jsonl", reqs, err));
}

TEST_CASE("generator: the hit-heavy subset's published shape", "[unit]") {
  const auto reqs = generate_trace({.kind = trace_kind::hit_heavy});
  REQUIRE(reqs.size() == 450);
  std::vector<std::uint64_t> len;
  double total = 0, cacheable = 0;
  for (const auto& r : reqs) {
    len.push_back(r.tokens.size());
    total += static_cast<double>(r.tokens.size());
    cacheable += static_cast<double>((r.tokens.size() - 1) / 256 * 256);
  }
  std::sort(len.begin(), len.end());
  CHECK(len.front() == 14715);
  CHECK(len.back() == 17889);
  CHECK((len[224] + len[225]) / 2 == 16390);
  CHECK(total == Approx(7.35e6).epsilon(0.01));
  // Arrivals: sorted, mean rate 1.21 requests/s.
  CHECK(
      std::is_sorted(reqs.begin(), reqs.end(), [](const request& a, const request& b) { return a.t < b.t; }));
  CHECK(reqs.front().t == 0);
  CHECK(449.0 / reqs.back().t == Approx(1.21).epsilon(0.01));
  // After a priming replay every full chunk before the last token is cached: ~99%
  // of prompt tokens (the reference reports 98.5 %).
  CHECK(cacheable / total > 0.985);
  CHECK(cacheable / total < 0.995);
  // Prefix sharing: one system prompt for all, documents shared by groups of three.
  std::set<std::uint64_t> first_seeds, doc_seeds;
  for (const auto& r : reqs) {
    REQUIRE(r.segments.size() == 3);
    first_seeds.insert(r.segments[0].seed);
    doc_seeds.insert(r.segments[1].seed);
  }
  CHECK(first_seeds.size() == 1);
  CHECK(doc_seeds.size() == 150);
  // Deterministic for a seed, different for another.
  const auto again = generate_trace({.kind = trace_kind::hit_heavy});
  CHECK(again[17].tokens == reqs[17].tokens);
  CHECK(again[17].t == reqs[17].t);
  const auto other = generate_trace({.kind = trace_kind::hit_heavy, .seed = 2});
  CHECK(other[17].tokens != reqs[17].tokens);
}

TEST_CASE("generator: the cold stream shares nothing", "[unit]") {
  const auto cold = generate_trace({.kind = trace_kind::cold, .requests = 50});
  std::set<std::uint64_t> seeds;
  for (const auto& r : cold) {
    REQUIRE(r.segments.size() == 1);
    seeds.insert(r.segments[0].seed);
  }
  CHECK(seeds.size() == 50);
}

TEST_CASE("generator: the mixed stream shares about half of each prompt; the long stream's shape", "[unit]") {
  const auto mixed = generate_trace({.kind = trace_kind::mixed, .requests = 60});
  double shared = 0, total = 0;
  for (const auto& r : mixed) {
    REQUIRE(r.segments.size() == 3);
    shared += static_cast<double>(r.segments[0].len + r.segments[1].len);
    total += static_cast<double>(r.tokens.size());
  }
  CHECK(shared / total > 0.4);
  CHECK(shared / total < 0.6);

  const auto spec = long_prompt_spec();
  const auto longs = generate_trace(spec);
  std::uint64_t lo = ~0ull, hi = 0;
  for (const auto& r : longs)
    lo = std::min<std::uint64_t>(lo, r.tokens.size()), hi = std::max<std::uint64_t>(hi, r.tokens.size());
  CHECK(lo == 64000);
  CHECK(hi == 200000);
  const double span = longs.back().t - longs.front().t;
  CHECK(static_cast<double>(longs.size() - 1) / span == Approx(spec.rate_per_s));
  // Slow enough that recomputing everything keeps the engine well below saturation.
  CHECK(spec.rate_per_s * spec.mean_tokens / 52.2e3 < 0.3);
}

TEST_CASE("timing model: sizes, durations and the printed figures", "[unit]") {
  timing_model tm;
  CHECK(tm.chunk_model_bytes() == Approx(12.39e6).epsilon(0.001));
  CHECK(tm.chunk_bytes() == 1513);  // 12.39 MB / 8192, rounded
  CHECK(tm.compute_s(52200) == Approx(1.0));
  CHECK(kvtier::break_even_bandwidth_gb_per_s(tm.node()) == Approx(2.53).epsilon(0.01));
  CHECK(tm.l2_hold_s(1.71e9) == Approx(1.0));
  CHECK(tm.l1_load_s(0) == 0);  // nothing from L1: no fixed cost either
  CHECK(tm.l1_load_s(0.5e9) == Approx(tm.l1_t0_s + 1.0));
  CHECK(tm.broadcast_s(100e9, 2) == Approx(1.0 + 2 * tm.collective_s));
  CHECK(tm.l2_total_gbps(8) == Approx(1.71));
  tm.l2_instances = 16;
  CHECK(tm.l2_total_gbps(8) == Approx(8 * 1.71));  // at most one instance per rank is read at once
  tm.l2_instances = 1;
  std::ostringstream os;
  tm.print(os, 8);
  const std::string s = os.str();
  CHECK(s.find("R = 52.2k tokens/s") != std::string::npos);
  CHECK(s.find("S = 48.4 KB/token") != std::string::npos);
  CHECK(s.find("K = 1 instance") != std::string::npos);
  for (const char* cost : {"L2 load", "L2 lookup", "write-back", "broadcast", "L1 load"}) {
    INFO(cost);
    CHECK(s.find(cost) != std::string::npos);  // every modeled cost is printed
  }
  std::ostringstream real;
  tm.print(real, 8, l2_kind::real);
  CHECK(real.str().find("K = 1 instance") == std::string::npos);  // no modeled L2 figures beside real servers
  CHECK(real.str().find("measured") != std::string::npos);
}

TEST_CASE("l2 timeline: one request at a time per instance, in order of arrival", "[unit]") {
  timing_model tm;
  tm.l2_instances = 2;
  l2_timeline line(tm);
  CHECK(line.serve(0, 1.0, 0.5) == Approx(1.5));  // instance 0
  CHECK(line.serve(2, 1.2, 0.5) == Approx(2.0));  // rank 2 -> instance 0: queues behind rank 0
  CHECK(line.serve(1, 1.2, 0.5) == Approx(1.7));  // instance 1 is idle
  // A request booked later but arriving earlier takes an idle gap that fits it ...
  CHECK(line.serve(0, 5.0, 1.0) == Approx(6.0));
  CHECK(line.serve(0, 3.0, 0.5) == Approx(3.5));
  // ... and one that does not fit waits for the end of the booking in its way.
  CHECK(line.serve(0, 4.8, 0.5) == Approx(6.5));
  CHECK(line.busy_s() == Approx(3.5));
  line.prune(10);
  CHECK(line.serve(0, 10, 1) == Approx(11));
}

TEST_CASE("payloads are a function of tokens and positions; verify catches one flipped byte", "[unit]") {
  const std::vector<std::uint32_t> toks{1, 2, 3, 4};
  std::vector<std::byte> a(1000), b(1000), scratch(1000);
  fill_payload(a, toks, 0);
  fill_payload(b, toks, 0);
  CHECK(a == b);
  fill_payload(b, toks, 256);  // same tokens, other positions
  CHECK(a != b);
  const std::vector<std::uint32_t> other{1, 2, 3, 5};
  fill_payload(b, other, 0);
  CHECK(a != b);
  CHECK(std::equal(a.begin(), a.begin() + 700, b.begin()));  // only the last token's bytes differ
  CHECK(verify_payload(a, toks, 0, scratch));
  a[999] ^= std::byte{1};
  CHECK_FALSE(verify_payload(a, toks, 0, scratch));
}

TEST_CASE("modeled stores: chunk_store semantics and fault injection", "[unit]") {
  timing_model tm;
  l2_server srv(1 << 20);
  modeled_l2 a(srv), b(srv);
  const kvtier::chunk_key k1{1, 2}, k2{3, 4};
  std::vector<std::byte> v1(tm.chunk_bytes(), std::byte{7}), out(tm.chunk_bytes());
  std::vector<kvtier::chunk_key> keys{k1, k2};
  std::vector<std::span<const std::byte>> src{v1, v1};
  std::vector<kvtier::chunk_status> st(2);
  REQUIRE(!a.put(keys, src, st, kvtier::deadline_after(std::chrono::seconds(5))));
  CHECK(st[0] == kvtier::chunk_status::stored);
  std::vector<kvtier::chunk_key> k3{k1, kvtier::chunk_key{9, 9}};
  REQUIRE(!b.exists(k3, st, kvtier::deadline_after(std::chrono::seconds(5))));
  CHECK(st[0] == kvtier::chunk_status::hit);
  CHECK(st[1] == kvtier::chunk_status::miss);
  std::vector<std::span<std::byte>> dst{out, out};
  REQUIRE(!b.get(k3, dst, st, kvtier::deadline_after(std::chrono::seconds(5))));
  CHECK(st[0] == kvtier::chunk_status::hit);
  CHECK(out == v1);

  srv.set_fault_every(1);  // every get loses its second half
  REQUIRE(!b.get(keys, dst, st, kvtier::deadline_after(std::chrono::seconds(5))));
  CHECK(st[0] == kvtier::chunk_status::hit);
  CHECK(st[1] == kvtier::chunk_status::error);

  null_store none;
  REQUIRE(!none.exists(keys, st, kvtier::no_deadline));
  CHECK(st[0] == kvtier::chunk_status::miss);
  CHECK(modeled_timing_v<modeled_l2>);
  CHECK(modeled_timing_v<null_store>);
  CHECK_FALSE(modeled_timing_v<kvtier::memory_store>);  // any other store is timed by the wall clock
}

TEST_CASE("report: linear-interpolation percentiles and the summary JSON line", "[unit]") {
  const std::vector<double> v{1, 2, 3, 4};
  CHECK(percentile(v, 0.5) == Approx(2.5));
  CHECK(percentile(v, 0.99) == Approx(3.97));
  CHECK(percentile(v, 0) == 1);
  CHECK(percentile({}, 0.5) == 0);

  run_result r;
  for (int i = 0; i < 4; ++i) {
    request_result q;
    q.arrival_s = i;
    q.ttft_s = v[static_cast<std::size_t>(i)];
    q.prompt_tokens = 100;
    q.cached_tokens = 50;
    r.requests.push_back(q);
  }
  r.busy_s = 2;
  r.makespan_s = 8;
  r.mismatched_chunks = 3;
  const summary s = summarize(r);
  CHECK(s.ttft_mean_s == Approx(2.5));
  CHECK(s.hit_token_fraction == Approx(0.5));
  CHECK(s.busy_fraction == Approx(0.25));
  CHECK(s.errors == 3);
  const std::string line = summary_json(s);
  json_value j;
  std::string err;
  REQUIRE(parse_json(line, j, err));
  std::vector<std::string> names;
  for (const auto& [k, _] : j.members) names.push_back(k);
  CHECK(names == std::vector<std::string>{"ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s",
                                          "hit_token_fraction", "busy_fraction", "max_io_stall_s",
                                          "prompt_tokens_per_s", "predicted_p50_s", "rho", "errors",
                                          "failed_l2_calls"});
  CHECK(s.prompt_tokens_per_s == Approx(400.0 / 8));
  summary back;
  REQUIRE(parse_summary(line, back, err));
  CHECK(back.ttft_p99_s == Approx(s.ttft_p99_s));
  CHECK(back.errors == 3);

  request_result q = r.requests[0];
  q.id = "r0";
  q.status = "hit";
  REQUIRE(parse_json(request_json(q), j, err));
  for (const char* k : {"id", "arrival_s", "prompt_tokens", "cached_tokens", "l1_tokens", "l2_tokens",
                        "queue_s", "load_s", "split_tokens", "predicted_s", "ttft_s", "status"})
    CHECK(j.find(k) != nullptr);
}
