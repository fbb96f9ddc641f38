// pinned_arena (CPU source): slots carved from one region, exhaustion as errors (never a crash),
// waiting up to a deadline, bad options named, and a memory_store keeping its values in slots.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/pinned_arena.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/deadline_check.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<pinned_arena> make(std::size_t slot_bytes, std::size_t slots) {
  std::error_code ec;
  std::string why;
  auto a = pinned_arena::create({.slot_bytes = slot_bytes, .slots = slots}, ec, &why);
  INFO(why);
  REQUIRE(a);
  REQUIRE_FALSE(ec);
  return a;
}

}  // namespace

TEST_CASE("pinned_arena: distinct aligned slots inside one region", "[unit]") {
  auto a = make(1000, 5);
  CHECK(a->slot_stride() == 4096);
  CHECK(a->region().size() >= 5 * 4096);
  CHECK_FALSE(a->device_mapped());
  std::vector<pinned_arena::slot> held;
  std::set<std::size_t> idx;
  std::error_code ec;
  for (int i = 0; i < 5; ++i) {
    held.push_back(a->try_acquire(ec));
    REQUIRE_FALSE(ec);
    auto b = held.back().bytes();
    REQUIRE(b.size() == 1000);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 4096 == 0);
    CHECK(a->contains(b.data()));
    CHECK(b.data() == a->region().data() + held.back().index() * a->slot_stride());
    std::memset(b.data(), i + 1, b.size());
    idx.insert(held.back().index());
  }
  CHECK(idx.size() == 5);
  for (int i = 0; i < 5; ++i)  // no slot overwrote another
    CHECK(held[i].bytes()[999] == std::byte(i + 1));
  CHECK(a->stats().peak_in_use == 5);
  held.clear();
  CHECK(a->free_slots() == 5);
}

TEST_CASE("pinned_arena: a slot released and then destroyed goes back once; slots taken again stay distinct",
          "[unit]") {
  auto a = make(100, 4);
  std::error_code ec;
  {
    auto first = a->try_acquire(ec);
    auto second = a->try_acquire(ec);
    REQUIRE(first);
    REQUIRE(second);
    first.release();  // explicitly, then destroyed at the end of the scope
    CHECK_FALSE(first);
    CHECK(first.bytes().empty());
    first.release();  // a second release is a no-op too
    CHECK(a->free_slots() == 3);
    pinned_arena::slot moved_from = a->try_acquire(ec);
    pinned_arena::slot moved_to = std::move(moved_from);  // only the new owner gives it back
    CHECK(a->free_slots() == 2);
    moved_to = a->try_acquire(ec);  // assigning over a held slot gives that one back first
    CHECK(a->free_slots() == 2);
  }
  CHECK(a->free_slots() == 4);
  CHECK(a->stats().in_use == 0);
  // Taken again, the four slots are four different ones, and then there is none.
  std::vector<pinned_arena::slot> held;
  std::set<std::size_t> idx;
  for (int i = 0; i < 4; ++i) {
    held.push_back(a->try_acquire(ec));
    REQUIRE_FALSE(ec);
    idx.insert(held.back().index());
  }
  CHECK(idx.size() == 4);
  CHECK_FALSE(a->try_acquire(ec));
  CHECK(ec == errc::resource_exhausted);
  held.clear();

  // Random acquire / release / destroy / move sequences against a model: a slot is never
  // handed out twice, and the free count is always the slots nobody holds.
  std::uint64_t seed = 42;
  auto next = [&seed] {
    seed += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<pinned_arena::slot> owners(6);
  for (int step = 0; step < 5000; ++step) {
    pinned_arena::slot& s = owners[next() % owners.size()];
    switch (next() % 4) {
      case 0:
        if (!s) s = a->try_acquire(ec);
        break;
      case 1:
        s.release();
        break;
      case 2:
        s = pinned_arena::slot{};  // destroyed by assignment
        break;
      case 3:
        owners[next() % owners.size()] = std::move(s);
        break;
    }
    std::set<std::size_t> seen;
    std::size_t live = 0;
    for (const auto& o : owners)
      if (o) ++live, seen.insert(o.index());
    REQUIRE(seen.size() == live);  // no index held twice
    REQUIRE(a->free_slots() == 4 - live);
  }
}

TEST_CASE("pinned_arena: exhaustion is an error, and acquire waits until its deadline", "[unit]") {
  auto a = make(64, 2);
  std::error_code ec;
  auto s0 = a->try_acquire(ec);
  auto s1 = a->try_acquire(ec);
  REQUIRE(s1);
  auto none = a->try_acquire(ec);
  CHECK_FALSE(none);
  CHECK(ec == errc::resource_exhausted);
  CHECK(none.bytes().empty());
  CHECK(a->stats().exhausted == 1);

  const auto dl = deadline_after(50ms);
  auto late = a->acquire(dl, ec);
  CHECK_FALSE(late);
  CHECK(ec == errc::timeout);
  CHECK(clock::now() >= dl);
  CHECK(kvtier::test::returned_by(dl));
  CHECK(a->stats().timeouts == 1);

  // A slot given back by another thread ends the wait (bounded: the deadline is 10 s away).
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    s0.release();
  });
  auto got = a->acquire(deadline_after(10s), ec);
  t.join();
  CHECK(got);
  CHECK_FALSE(ec);
  CHECK(a->stats().waited == 2);

  pinned_arena::slot moved = std::move(got);  // moving keeps one owner
  CHECK_FALSE(got);
  CHECK(moved);
  moved = {};
  CHECK(a->free_slots() == 1);
}

TEST_CASE("pinned_arena: bad options and a failing source give clear errors", "[unit]") {
  std::error_code ec;
  std::string why;
  CHECK_FALSE(pinned_arena::create({.slot_bytes = 0, .slots = 4}, ec, &why));
  CHECK(ec == errc::invalid_argument);
  CHECK(why.find("slot_bytes") != std::string::npos);
  CHECK_FALSE(pinned_arena::create({.slot_bytes = 8, .slots = 0}, ec, &why));
  CHECK(why.find("slots") != std::string::npos);
  CHECK_FALSE(pinned_arena::create({.slot_bytes = 8, .slots = 1, .alignment = 48}, ec, &why));
  CHECK(why.find("alignment") != std::string::npos);
  CHECK_FALSE(pinned_arena::create({.slot_bytes = SIZE_MAX / 4, .slots = 8}, ec, &why));
  CHECK(why.find("overflows") != std::string::npos);
  CHECK_FALSE(pinned_arena::create({.slot_bytes = 8, .slots = 1, .numa_node = 5000}, ec, &why));
  CHECK(ec == errc::invalid_argument);
  CHECK(why.find("numa_node") != std::string::npos);

  host_region_source broken;
  broken.name = "broken source";
  broken.allocate = [](void*, std::size_t, int, std::byte**, std::string* w) {
    *w = "no memory today";
    return make_error_code(errc::backend_error);
  };
  broken.release = [](void*, std::byte*, std::size_t) noexcept {};
  CHECK_FALSE(pinned_arena::create({.slot_bytes = 8, .slots = 1}, ec, &why, broken));
  CHECK(ec == errc::backend_error);
  CHECK(why == "pinned_arena: broken source: no memory today");
}

TEST_CASE("pinned_arena: NUMA node 0 binds, or says why not", "[unit]") {
  std::error_code ec;
  std::string why;
  auto a = pinned_arena::create({.slot_bytes = 4096, .slots = 2, .numa_node = 0}, ec, &why);
  if (a) {
    CHECK_FALSE(ec);
  } else {  // e.g. a container that forbids mbind
    CHECK(ec == errc::backend_error);
    CHECK(why.find("mbind to NUMA node 0") != std::string::npos);
  }
}

TEST_CASE("pinned_arena: memory_store keeps its values in arena slots", "[unit]") {
  auto a = make(256, 4);
  basic_memory_store<pinned_arena::allocator> store(3 * 200, a->get_allocator());
  std::vector<std::byte> v(200);
  std::vector<chunk_key> keys{{0, 1}, {0, 2}, {0, 3}, {0, 4}};
  std::vector<chunk_status> st(1);
  for (std::size_t i = 0; i < keys.size(); ++i) {  // the 4th put evicts the 1st: 3 slots in use
    std::memset(v.data(), static_cast<int>(i + 1), v.size());
    std::span<const std::byte> src[] = {v};
    REQUIRE_FALSE(store.put(std::span(&keys[i], 1), src, st, deadline_after(1s)));
    CHECK(st[0] == chunk_status::stored);
  }
  CHECK(store.entry_count() == 3);
  CHECK(a->free_slots() == 1);
  std::vector<std::byte> out(200);
  std::span<std::byte> dst[] = {out};
  REQUIRE_FALSE(store.get(std::span(&keys[3], 1), dst, st, deadline_after(1s)));
  CHECK(st[0] == chunk_status::hit);
  CHECK(out[0] == std::byte{4});

  std::vector<std::byte> big(257);  // larger than a slot: not stored, no crash
  std::span<const std::byte> bsrc[] = {big};
  const chunk_key kb{9, 9};
  REQUIRE_FALSE(store.put(std::span(&kb, 1), bsrc, st, deadline_after(1s)));
  CHECK(st[0] == chunk_status::error);

  std::error_code ec;  // every slot taken elsewhere: the store's put fails cleanly
  auto held = a->try_acquire(ec);
  REQUIRE(held);
  const chunk_key k5{0, 5};
  std::span<const std::byte> src[] = {v};
  REQUIRE_FALSE(store.put(std::span(&k5, 1), src, st, deadline_after(1s)));
  CHECK(st[0] == chunk_status::error);
  CHECK(store.stats().rejected == 2);
  store.clear();
  held.release();
  CHECK(a->free_slots() == 4);
}
