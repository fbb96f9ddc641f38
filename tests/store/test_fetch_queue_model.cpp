// fetch_queue properties:
//  - a rapidcheck stateful test against a simple model: submit (load, lookup,
//    prefetch or put), a load that reuses a prefetch, release_prefetch, release a store
//    call, cancel, poll and close in random orders, with random worker counts and
//    bounds; every submission completes exactly once, and bytes in flight (load
//    destinations, put sources and held prefetch staging) match the model at every poll.
//  - the asynchronous per-rank lookup equals the synchronous rank_answer over
//    random presence patterns, world sizes and ranks.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <thread>
#include <vector>

#include <rapidcheck/state.h>

#include "kvtier/fetch_queue.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/memory_store.hpp"
#include "store/store_fakes.hpp"
#include "support/property.hpp"

using namespace kvtier;
using namespace std::chrono_literals;
using kvtier::test::gated_key;
using kvtier::test::gated_store;

namespace {

constexpr std::size_t T = 16;  // tokens per chunk
constexpr std::size_t B = 8;   // bytes per chunk

// ---- the model ----------------------------------------------------------------

enum class mstate { queued, running, done, failed };
enum class mkind { load, lookup, prefetch, put };
constexpr std::size_t none = static_cast<std::size_t>(-1);

struct mreq {
  std::uint32_t n = 1;      // chunks
  std::uint32_t mask = 0;   // bit c: chunk c present in the store
  std::uint32_t first = 0;  // first chunk index (layout)
  mkind kind = mkind::load;
  std::size_t gate = 0;       // whose keys (and so whose store gate) this request uses
  std::size_t source = none;  // load: the prefetch it took over
  request_id id = 0;
  mstate st = mstate::queued;
  errc why{};
  bool admitted = false;
  bool cancelled = false;
  std::size_t bytes() const { return kind == mkind::lookup ? 0 : n * B; }
  bool finished() const { return st == mstate::done || st == mstate::failed; }
  bool all_present() const { return mask == (1u << n) - 1; }
};

// Prefetch ids never collide with the plain requests' ids (their index).
request_id prefetch_id(std::size_t i) { return (request_id{1} << 40) + i; }

struct qmodel {
  std::size_t workers = 1, max_requests = 1, max_bytes = B;
  std::vector<mreq> reqs;
  std::deque<std::size_t> fifo;
  std::vector<std::size_t> running;
  std::vector<bool> gate_open;             // per request index: its store gate was released
  std::map<request_id, std::size_t> held;  // prefetches a later load may take over
  bool closed = false;

  bool open(std::size_t gate) const { return gate < gate_open.size() && gate_open[gate]; }
  std::size_t outstanding() const { return fifo.size() + running.size(); }
  // Load destinations while unfinished; prefetch staging while unfinished, held,
  // or read by an unfinished load that took it over.
  std::size_t bytes() const {
    std::size_t b = 0;
    for (auto i : fifo) b += reqs[i].kind == mkind::prefetch ? 0 : reqs[i].bytes();
    for (auto i : running) b += reqs[i].kind == mkind::prefetch ? 0 : reqs[i].bytes();
    for (std::size_t p = 0; p < reqs.size(); ++p) {
      if (reqs[p].kind != mkind::prefetch || !reqs[p].admitted) continue;
      bool alive = !reqs[p].finished() || held.contains(reqs[p].id);
      for (const mreq& l : reqs) alive = alive || (l.source == p && !l.finished());
      if (alive) b += reqs[p].bytes();
    }
    return b;
  }
  void fail(std::size_t i, errc why) {
    reqs[i].st = mstate::failed, reqs[i].why = why;
    // A failed prefetch staged nothing: it is no longer held.
    if (auto it = held.find(reqs[i].id);
        reqs[i].kind == mkind::prefetch && it != held.end() && it->second == i)
      held.erase(it);
  }
  void complete(std::size_t i) {
    if (reqs[i].cancelled) return fail(i, errc::cancelled);
    reqs[i].st = mstate::done;
  }
  // A running request's store call returns once its gate is open. A load that took
  // over a prefetch first waits for it, then reads only what it did not stage (no
  // store call at all when the prefetch staged every chunk).
  bool can_complete(std::size_t i) const {
    const mreq& r = reqs[i];
    if (r.source == none) return open(r.gate);
    const mreq& p = reqs[r.source];
    if (!p.finished()) return false;
    const bool nothing_left = p.st == mstate::done && p.all_present();
    return nothing_left || open(r.gate);
  }
  // Workers take queued requests in FIFO order; a released running call returns.
  void settle() {
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t k = 0; k < running.size(); ++k)
        if (can_complete(running[k])) {
          complete(running[k]);
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
          changed = true;
          break;
        }
      if (!changed && running.size() < workers && !fifo.empty()) {
        running.push_back(fifo.front());
        reqs[fifo.front()].st = mstate::running;
        fifo.pop_front();
        changed = true;
      }
    }
  }
};

// ---- the system under test -------------------------------------------------------

struct qsut {
  gated_store store;
  std::unique_ptr<fetch_queue<gated_store>> q;
  std::vector<fetch_handle> handles;
  std::deque<std::vector<std::byte>> data;  // one buffer per request (stable addresses)
  std::deque<std::vector<std::span<std::byte>>> spans;
  std::deque<std::atomic<int>> completions;
  // A failed assertion unwinds through here: stop the queue before the buffers
  // and counters its workers and callbacks use go away.
  ~qsut() {
    store.release_all();
    if (q) q->shutdown();
  }
};

std::uint64_t tag(std::size_t i) { return i + 1; }

std::vector<chunk_key> keys_of(const mreq& r) {
  std::vector<chunk_key> k;
  for (std::uint32_t c = 0; c < r.n; ++c) k.push_back(gated_key(tag(r.gate), c, r.mask));
  return k;
}

// Brings the SUT to the model's state and checks every request against it.
void sync_and_check(const qmodel& m, qsut& s) {
  // Workers have taken exactly the requests the model has running (a load waiting
  // for its prefetch shows in no store call, so the queue's count is the sync point).
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (s.q->stats().queued != m.fifo.size() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(50us);
  RC_ASSERT(s.q->stats().queued == m.fifo.size());
  for (std::size_t i = 0; i < m.reqs.size(); ++i) {
    const mreq& r = m.reqs[i];
    if (r.st == mstate::running && !r.cancelled) RC_ASSERT(s.store.wait_started(tag(r.gate)));
    const std::optional<fetch_result> completed = (r.st == mstate::done || r.st == mstate::failed)
                                                      ? s.q->wait(s.handles[i], deadline_after(10s))
                                                      : s.q->poll(s.handles[i]);
    if (r.st == mstate::queued || r.st == mstate::running) {
      RC_ASSERT(!completed.has_value());
      continue;
    }
    RC_ASSERT(completed.has_value());
    const fetch_result& got = *completed;
    // A put has no layout: it answers 0 tokens, done or failed.
    const std::uint64_t first_start = r.kind == mkind::put ? 0 : static_cast<std::uint64_t>(r.first) * T;
    if (r.st == mstate::failed) {
      RC_ASSERT(got.state == fetch_state::failed);
      RC_ASSERT(got.ec == make_error_code(r.why));
      RC_ASSERT(got.answer_tokens == first_start);
      RC_ASSERT(got.status.size() == r.n);
      for (auto st : got.status) RC_ASSERT(st != chunk_status::hit && st != chunk_status::stored);
      continue;
    }
    RC_ASSERT(got.state == fetch_state::done);
    RC_ASSERT(!got.ec);
    RC_ASSERT(got.status.size() == r.n);
    if (r.kind == mkind::put) {  // the gated store stores every key it is given
      RC_ASSERT(got.answer_chunks == r.n);
      RC_ASSERT(got.answer_tokens == 0u);
      for (auto st : got.status) RC_ASSERT(st == chunk_status::stored);
      continue;
    }
    std::uint32_t lead = 0;
    while (lead < r.n && ((r.mask >> lead) & 1u)) ++lead;
    RC_ASSERT(got.answer_chunks == lead);
    RC_ASSERT(got.answer_tokens == first_start + static_cast<std::uint64_t>(lead) * T);
    const auto keys = keys_of(r);
    for (std::uint32_t c = 0; c < r.n; ++c) {
      const bool present = (r.mask >> c) & 1u;
      RC_ASSERT(got.status[c] == (present ? chunk_status::hit : chunk_status::miss));
      if (r.kind == mkind::load && present)
        for (std::size_t j = 0; j < B; ++j)
          RC_ASSERT(s.spans[i][c][j] == kvtier::test::gated_byte(keys[c], j));
    }
  }
}

using cmd = rc::state::Command<qmodel, qsut>;

// Admission and, for a load, taking over the held prefetch with its id.
void admit(qmodel& m, mreq x) {
  const std::size_t i = m.reqs.size();
  if (x.bytes() > m.max_bytes) {
    x.st = mstate::failed, x.why = errc::too_large;
  } else if (m.closed) {
    x.st = mstate::failed, x.why = errc::shutdown;
  } else if (m.outstanding() + 1 > m.max_requests || m.bytes() + x.bytes() > m.max_bytes) {
    x.st = mstate::failed, x.why = errc::queue_full;
  } else {
    x.admitted = true;
    m.fifo.push_back(i);
    if (x.kind == mkind::prefetch) m.held[x.id] = i;
    if (auto it = m.held.find(x.id); x.kind == mkind::load && it != m.held.end()) {
      x.source = it->second;
      m.held.erase(it);
    }
  }
  m.reqs.push_back(x);
  m.settle();
}

// Submits `r` as request m.reqs.size() and checks the queue against the model after it.
void run_submit(const qmodel& m, qsut& s, const mreq& r) {
  const std::size_t i = m.reqs.size();
  const auto keys = keys_of(r);
  auto layout = chunk_layout::contiguous(r.first, r.n, T);
  s.data.emplace_back(r.n * B);
  auto& sp = s.spans.emplace_back();
  for (std::uint32_t c = 0; c < r.n; ++c) sp.emplace_back(s.data.back().data() + c * B, B);
  fetch_handle h;
  switch (r.kind) {
    case mkind::load:
      h = s.q->submit(r.id, keys, sp, layout, deadline_after(60s));
      break;
    case mkind::lookup:
      h = s.q->lookup(r.id, keys, layout, deadline_after(60s));
      break;
    case mkind::prefetch:
      h = s.q->prefetch(r.id, keys, B, layout, deadline_after(60s));
      break;
    case mkind::put: {
      const std::vector<std::span<const std::byte>> src(sp.begin(), sp.end());
      h = s.q->put(r.id, keys, src, deadline_after(60s));
      break;
    }
  }
  auto& counter = s.completions.emplace_back(0);
  s.q->on_complete(h, [&counter](const fetch_result&) { counter++; });
  s.handles.push_back(h);
  qmodel next = m;
  admit(next, r);
  sync_and_check(next, s);
}

struct submit_cmd : cmd {
  mreq r;
  explicit submit_cmd(const qmodel&) {
    r.n = *rc::gen::inRange<std::uint32_t>(1, 5);
    r.mask = *rc::gen::inRange<std::uint32_t>(0, 1u << r.n);
    r.first = *rc::gen::inRange<std::uint32_t>(0, 4);
    r.kind = *rc::gen::element(mkind::load, mkind::lookup, mkind::prefetch, mkind::put);
  }
  // Index, gate and id follow from the model (shrinking may drop earlier commands).
  mreq at(const qmodel& m) const {
    mreq x = r;
    x.gate = m.reqs.size();
    x.id = x.kind == mkind::prefetch ? prefetch_id(x.gate) : x.gate;
    return x;
  }
  void apply(qmodel& m) const override { admit(m, at(m)); }
  void run(const qmodel& m, qsut& s) const override { run_submit(m, s, at(m)); }
  void show(std::ostream& os) const override {
    os << (r.kind == mkind::load     ? "submit"
           : r.kind == mkind::lookup ? "lookup"
           : r.kind == mkind::put    ? "put"
                                     : "prefetch")
       << "(n=" << r.n << ", mask=" << r.mask << ", first=" << r.first << ")";
  }
};

// A load under a prefetch's id with the prefetch's keys: takes it over if it is
// still held, else reads like any load.
struct reuse_cmd : cmd {
  std::size_t p = 0;
  explicit reuse_cmd(const qmodel& m) {
    std::vector<std::size_t> prefetches;
    for (std::size_t k = 0; k < m.reqs.size(); ++k)
      if (m.reqs[k].kind == mkind::prefetch) prefetches.push_back(k);
    RC_PRE(!prefetches.empty());
    p = *rc::gen::elementOf(prefetches);
  }
  void checkPreconditions(const qmodel& m) const override {
    RC_PRE(p < m.reqs.size());  // separate: RC_PRE's && does not short-circuit
    RC_PRE(m.reqs[p].kind == mkind::prefetch);
  }
  mreq at(const qmodel& m) const {
    const mreq& src = m.reqs[p];
    mreq x;
    x.n = src.n, x.mask = src.mask, x.first = src.first;
    x.kind = mkind::load;
    x.gate = p;
    x.id = src.id;
    return x;
  }
  void apply(qmodel& m) const override { admit(m, at(m)); }
  void run(const qmodel& m, qsut& s) const override { run_submit(m, s, at(m)); }
  void show(std::ostream& os) const override { os << "load_after_prefetch(" << p << ")"; }
};

struct release_prefetch_cmd : cmd {
  std::size_t p = 0;
  explicit release_prefetch_cmd(const qmodel& m) {
    std::vector<std::size_t> prefetches;
    for (std::size_t k = 0; k < m.reqs.size(); ++k)
      if (m.reqs[k].kind == mkind::prefetch) prefetches.push_back(k);
    RC_PRE(!prefetches.empty());
    p = *rc::gen::elementOf(prefetches);
  }
  void checkPreconditions(const qmodel& m) const override {
    RC_PRE(p < m.reqs.size());  // separate: RC_PRE's && does not short-circuit
    RC_PRE(m.reqs[p].kind == mkind::prefetch);
  }
  void apply(qmodel& m) const override { m.held.erase(m.reqs[p].id); }
  void run(const qmodel& m, qsut& s) const override {
    s.q->release_prefetch(m.reqs[p].id);
    qmodel next = m;
    apply(next);
    sync_and_check(next, s);
  }
  void show(std::ostream& os) const override { os << "release_prefetch(" << p << ")"; }
};

// Lets the store calls on one request's gate return (a load that reuses a
// prefetch shares the prefetch's gate).
struct release_cmd : cmd {
  std::size_t gate = 0;
  explicit release_cmd(const qmodel& m) {
    std::vector<std::size_t> open;
    for (std::size_t k = 0; k < m.reqs.size(); ++k)
      if ((m.reqs[k].st == mstate::queued || m.reqs[k].st == mstate::running) && !m.open(m.reqs[k].gate))
        open.push_back(m.reqs[k].gate);
    RC_PRE(!open.empty());
    gate = *rc::gen::elementOf(open);
  }
  void checkPreconditions(const qmodel& m) const override {
    RC_PRE(gate < m.reqs.size());
    RC_PRE(!m.open(gate));
  }
  void apply(qmodel& m) const override {
    if (m.gate_open.size() <= gate) m.gate_open.resize(gate + 1, false);
    m.gate_open[gate] = true;
    m.settle();
  }
  void run(const qmodel& m, qsut& s) const override {
    s.store.release(tag(gate));
    qmodel next = m;
    apply(next);
    sync_and_check(next, s);
  }
  void show(std::ostream& os) const override { os << "release(" << gate << ")"; }
};

struct cancel_cmd : cmd {
  std::size_t i = 0;
  explicit cancel_cmd(const qmodel& m) {
    RC_PRE(!m.reqs.empty());
    i = *rc::gen::inRange<std::size_t>(0, m.reqs.size());
  }
  void checkPreconditions(const qmodel& m) const override { RC_PRE(i < m.reqs.size()); }
  void apply(qmodel& m) const override {
    mreq& r = m.reqs[i];
    if (r.st == mstate::queued) {
      m.fail(i, errc::cancelled);
      std::erase(m.fifo, i);
    } else if (r.st == mstate::running) {
      r.cancelled = true;
    }
    m.settle();
  }
  void run(const qmodel& m, qsut& s) const override {
    const mstate before = m.reqs[i].st;
    const bool ok = s.q->cancel(s.handles[i]);
    RC_ASSERT(ok == (before == mstate::queued || before == mstate::running));
    qmodel next = m;
    apply(next);
    sync_and_check(next, s);
  }
  void show(std::ostream& os) const override { os << "cancel(" << i << ")"; }
};

struct poll_cmd : cmd {
  explicit poll_cmd(const qmodel&) {}
  void apply(qmodel&) const override {}
  void run(const qmodel& m, qsut& s) const override {
    sync_and_check(m, s);
    const auto st = s.q->stats();
    RC_ASSERT(st.requests_in_flight == m.outstanding());
    RC_ASSERT(st.bytes_in_flight == m.bytes());
    RC_ASSERT(st.prefetches_held == m.held.size());
  }
  void show(std::ostream& os) const override { os << "poll"; }
};

struct close_cmd : cmd {
  explicit close_cmd(const qmodel& m) { RC_PRE(!m.closed); }
  void checkPreconditions(const qmodel& m) const override { RC_PRE(!m.closed); }
  void apply(qmodel& m) const override {
    m.closed = true;
    for (auto i : m.fifo) m.fail(i, errc::shutdown);
    m.fifo.clear();
    m.held.clear();  // held prefetches are dropped
    m.settle();
  }
  void run(const qmodel& m, qsut& s) const override {
    s.q->close();
    qmodel next = m;
    apply(next);
    sync_and_check(next, s);
  }
  void show(std::ostream& os) const override { os << "close"; }
};

}  // namespace

TEST_CASE("fetch_queue: stateful model of submit/prefetch/put/reuse/release/cancel/poll/close",
          "[property]") {
  kvtier::test::prop(
      "fetch_queue matches its model; one completion per submission",
      [] {
        qmodel m;
        m.workers = *rc::gen::inRange<std::size_t>(1, 4);
        m.max_requests = *rc::gen::inRange<std::size_t>(1, 7);
        m.max_bytes = B * *rc::gen::inRange<std::size_t>(1, 9);
        qsut s;
        s.q = std::make_unique<fetch_queue<gated_store>>(
            s.store,
            fetch_queue_options{
                .workers = m.workers, .max_requests = m.max_requests, .max_bytes_in_flight = m.max_bytes});
        rc::state::check(
            m, s,
            rc::state::gen::execOneOfWithArgs<submit_cmd, submit_cmd, reuse_cmd, release_prefetch_cmd,
                                              release_cmd, release_cmd, cancel_cmd, poll_cmd, close_cmd>());
        // Teardown: every call returns, every request completes exactly once.
        s.store.release_all();
        s.q->shutdown();
        for (std::size_t i = 0; i < s.handles.size(); ++i) {
          RC_ASSERT(s.q->poll(s.handles[i]).has_value());
          RC_ASSERT(s.completions[i].load() == 1);
        }
        RC_ASSERT(s.q->stats().requests_in_flight == 0u);
        RC_ASSERT(s.q->stats().bytes_in_flight == 0u);
      },
      2000);  // 10,000 take ~26 s in Release and minutes under TSan
}

TEST_CASE("fetch_queue: async per-rank lookup equals the synchronous rank answer", "[property]") {
  memory_store store(1 << 20);
  fetch_queue q(store, {.workers = 2});
  std::vector<std::byte> one(1);
  kvtier::test::prop(
      "async lookup == rank_answer",
      [&] {
        const auto w = *rc::gen::inRange<rank_t>(1, 9);
        const auto r = *rc::gen::inRange<rank_t>(0, w);
        const auto n = *rc::gen::inRange<std::size_t>(0, 41);
        const auto present = *rc::gen::container<std::vector<bool>>(n, rc::gen::arbitrary<bool>());
        store.clear();
        std::vector<chunk_key> all;
        for (std::size_t c = 0; c < n; ++c) all.push_back(chunk_key{0x51, c});
        for (std::size_t c = 0; c < n; ++c)
          if (present[c]) {
            std::span<const std::byte> src[1] = {one};
            chunk_status st[1];
            store.put(std::span<const chunk_key>(&all[c], 1), src, st, deadline_after(1s));
          }
        const modulo_ownership own(w);
        const auto mine = owned_chunks(own, r, n);
        const auto starts = owned_starts(own, r, n, T);
        std::vector<chunk_key> keys;
        std::vector<bool> mine_present;
        for (auto c : mine) keys.push_back(all[c]), mine_present.push_back(present[c]);
        const std::uint64_t end = n * T;

        auto h = q.lookup(r, keys, chunk_layout::owned(starts, end), deadline_after(10s));
        const auto res = q.wait(h, deadline_after(10s)).value();
        RC_ASSERT(res.state == fetch_state::done);
        const std::uint64_t sync = rank_answer(std::span<const std::uint64_t>(starts), mine_present, end);
        RC_ASSERT(res.answer_tokens == sync);
        RC_ASSERT(res.answer_tokens == rank_answer_cumulative(cumulative_lengths(starts, end), mine_present));
      },
      10000);
}
