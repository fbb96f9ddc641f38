// Unit tests of rendezvous_store: a rank's partition over K stores (memory stores here; the same
// code runs over remote_stores): stable placement, balance, growth moves few keys, caller order.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/rendezvous_store.hpp"
#include "store_fakes.hpp"

using namespace std::chrono_literals;
using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::memory_store;
using kvtier::rendezvous_store;

static_assert(kvtier::chunk_store<rendezvous_store<memory_store>>);

namespace {
std::vector<chunk_key> keys_n(std::size_t n) {
  std::vector<chunk_key> k;
  for (std::size_t i = 0; i < n; ++i) k.push_back(chunk_key{0x1234 * (i + 7), i * 0x9E3779B97F4A7C15ull});
  return k;
}
// K memory stores named "srv-0" ... (the names stand for their servers' identities).
struct instances {
  explicit instances(std::size_t k) {
    for (std::size_t i = 0; i < k; ++i) {
      owned.push_back(std::make_unique<memory_store>(64 << 20));
      names.push_back("srv-" + std::to_string(i));
    }
    for (auto& s : owned) ptrs.push_back(s.get());
  }
  std::vector<std::unique_ptr<memory_store>> owned;
  std::vector<memory_store*> ptrs;
  std::vector<std::string> names;
};
}  // namespace

TEST_CASE("rendezvous_store: balanced, stable, and growth moves only the new instance's keys", "[unit]") {
  const auto keys = keys_n(4000);
  instances four(4), five(5);
  rendezvous_store<memory_store> a(four.ptrs, four.names), b(four.ptrs, four.names),
      grown(five.ptrs, five.names);
  std::vector<std::size_t> count(4, 0);
  std::size_t moved = 0;
  for (const auto& k : keys) {
    REQUIRE(a.instance_of(k) == b.instance_of(k));  // every engine agrees without talking
    ++count[a.instance_of(k)];
    const std::size_t g = grown.instance_of(k);
    if (g != a.instance_of(k)) {
      ++moved;
      REQUIRE(g == 4);  // a key only ever moves to the new instance
    }
  }
  for (std::size_t c : count) REQUIRE((c > 800 && c < 1200));  // 1000 each, give or take
  REQUIRE((moved > 600 && moved < 1000));                      // about 1/5 of 4000
  // Another seed is another placement.
  rendezvous_store<memory_store> other(four.ptrs, four.names, 99);
  std::size_t same = 0;
  for (const auto& k : keys) same += other.instance_of(k) == a.instance_of(k);
  REQUIRE(same < 1500);
}

TEST_CASE("rendezvous_store: batches split by instance, statuses in the caller's order", "[unit]") {
  instances three(3);
  rendezvous_store<memory_store> store(three.ptrs, three.names);
  const auto keys = keys_n(60);
  std::vector<std::vector<std::byte>> src;
  for (std::size_t i = 0; i < keys.size(); ++i) src.emplace_back(10 + i, static_cast<std::byte>(i));
  // Store every other key.
  std::vector<chunk_key> half;
  std::vector<std::span<const std::byte>> half_src;
  for (std::size_t i = 0; i < keys.size(); i += 2) half.push_back(keys[i]), half_src.emplace_back(src[i]);
  std::vector<chunk_status> st(half.size());
  REQUIRE_FALSE(store.put(half, half_src, st, deadline_after(1s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  // Each value is on its own instance only.
  for (std::size_t i = 0; i < keys.size(); i += 2) {
    for (std::size_t k = 0; k < 3; ++k) {
      chunk_status one = chunk_status::error;
      REQUIRE_FALSE(three.ptrs[k]->exists(std::span(&keys[i], 1), std::span(&one, 1), deadline_after(1s)));
      REQUIRE(one == (k == store.instance_of(keys[i]) ? chunk_status::hit : chunk_status::miss));
    }
  }
  std::vector<std::vector<std::byte>> dst;
  for (const auto& s : src) dst.emplace_back(s.size());
  std::vector<std::span<std::byte>> d(dst.begin(), dst.end());
  st.assign(keys.size(), chunk_status::error);
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(1s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << i);
    REQUIRE(st[i] == (i % 2 == 0 ? chunk_status::hit : chunk_status::miss));
    if (i % 2 == 0) REQUIRE(dst[i] == src[i]);
  }
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(1s)));
  for (std::size_t i = 0; i < keys.size(); ++i)
    REQUIRE(st[i] == (i % 2 == 0 ? chunk_status::hit : chunk_status::miss));
  // The contract's checks pass through: sizes, and a deadline already gone.
  REQUIRE(store.get(keys, std::span(d).first(3), st, deadline_after(1s)) == kvtier::errc::invalid_argument);
  REQUIRE(store.exists(keys, st, kvtier::clock::now() - 1ms) == kvtier::errc::timeout);
  for (auto s : st) REQUIRE(s == chunk_status::timeout);
  REQUIRE_THROWS_AS(rendezvous_store<memory_store>({}, {}), std::invalid_argument);
  REQUIRE_THROWS_AS(rendezvous_store<memory_store>(three.ptrs, {"a", "b"}), std::invalid_argument);
  REQUIRE_THROWS_AS(rendezvous_store<memory_store>(three.ptrs, {"a", "b", "a"}), std::invalid_argument);
}

TEST_CASE("rendezvous_store: removing any instance moves only its own keys (about 1/K)", "[unit]") {
  // Weights depend on an instance's name, not its position: removing one from the middle of the
  // list must not shift the keys of the instances after it (issue 18). Every K from 2 to 8 and
  // every removed position, over 4000 keys: keys of the other instances stay exactly where they
  // were, and the removed one held about 1/K of them (within 6 binomial standard deviations).
  const auto keys = keys_n(4000);
  for (std::size_t k = 2; k <= 8; ++k) {
    instances all(k);
    rendezvous_store<memory_store> before(all.ptrs, all.names, 7);
    for (std::size_t gone = 0; gone < k; ++gone) {
      INFO("K = " << k << ", instance " << gone << " removed");
      std::vector<memory_store*> ptrs = all.ptrs;
      std::vector<std::string> names = all.names;
      ptrs.erase(ptrs.begin() + static_cast<std::ptrdiff_t>(gone));
      names.erase(names.begin() + static_cast<std::ptrdiff_t>(gone));
      rendezvous_store<memory_store> after(ptrs, names, 7);
      std::size_t moved = 0, wrongly_moved = 0;
      for (const auto& key : keys) {
        const std::string& was = before.name(before.instance_of(key));
        const std::string& now = after.name(after.instance_of(key));
        if (was == all.names[gone])
          ++moved;
        else
          wrongly_moved += was != now;
      }
      CHECK(wrongly_moved == 0);
      const double n = static_cast<double>(keys.size()), p = 1.0 / static_cast<double>(k);
      CHECK(std::abs(static_cast<double>(moved) - n * p) <= 6 * std::sqrt(n * p * (1 - p)));
    }
  }
  // The order of the list does not matter either: a key lands on the same named instance.
  instances five(5);
  rendezvous_store<memory_store> forward(five.ptrs, five.names);
  std::vector<memory_store*> rptrs(five.ptrs.rbegin(), five.ptrs.rend());
  std::vector<std::string> rnames(five.names.rbegin(), five.names.rend());
  rendezvous_store<memory_store> backward(rptrs, rnames);
  for (const auto& key : keys)
    REQUIRE(forward.name(forward.instance_of(key)) == backward.name(backward.instance_of(key)));
}

// Three digest-keeping instances of format f (the forwarding tests below).
struct digest_instances {
  explicit digest_instances(kvtier::value_format f) {
    for (int i = 0; i < 3; ++i)
      owned.push_back(std::make_unique<kvtier::test::digest_store>(f)), ptrs.push_back(owned.back().get());
  }
  std::vector<std::unique_ptr<kvtier::test::digest_store>> owned;
  std::vector<kvtier::test::digest_store*> ptrs;
};

// Issue 28: put_prehashed through the instances: each gets exactly its keys' digests.
TEST_CASE("rendezvous_store: put_prehashed gives each instance its own keys' digests", "[unit]") {
  using kvtier::test::digest_store;
  const kvtier::value_format f = kvtier::value_format::v2(8);
  digest_instances three(f);
  const std::vector<digest_store*>& ptrs = three.ptrs;
  rendezvous_store<digest_store> r(ptrs, {"a", "b", "c"});
  static_assert(kvtier::prehashed_put_store<rendezvous_store<digest_store>>);
  REQUIRE(r.format().group_bytes == 8);

  const auto keys = keys_n(48);
  std::vector<std::byte> value(20, std::byte{3});
  std::vector<std::span<const std::byte>> src(keys.size(), value);
  std::vector<kvtier::value_digest> digests;
  for (std::size_t i = 0; i < keys.size(); ++i)
    digests.push_back(kvtier::test::tagged_digest(f, 20, 1000 + i));
  std::vector<chunk_status> st(keys.size(), chunk_status::error);
  REQUIRE_FALSE(r.put_prehashed(keys, src, digests, st, deadline_after(5s)));
  std::size_t used = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CHECK(st[i] == chunk_status::stored);
    const digest_store& home = *ptrs[r.instance_of(keys[i])];
    CHECK(home.given(keys[i]).hashes == digests[i].hashes);
  }
  for (digest_store* s : ptrs) used += s->plain_puts() == 0;
  CHECK(used == 3);  // nobody hashed for itself

  std::vector<kvtier::value_digest> short_list(digests.begin(), digests.begin() + 3);
  CHECK(r.put_prehashed(keys, src, short_list, st, deadline_after(5s)) == kvtier::errc::invalid_argument);
}

TEST_CASE("rendezvous_store: put_pieces gives each instance its own keys' values in pieces and digests",
          "[unit]") {
  using kvtier::test::digest_store;
  const kvtier::value_format f = kvtier::value_format::v2(8);
  digest_instances three(f);
  const std::vector<digest_store*>& ptrs = three.ptrs;
  rendezvous_store<digest_store> r(ptrs, {"a", "b", "c"});
  static_assert(kvtier::piecewise_put_store<rendezvous_store<digest_store>>);

  const auto keys = keys_n(48);
  // Value i: 20 bytes i, i+1, ..., in two pieces of 12 and 8.
  std::vector<std::vector<std::byte>> bytes(keys.size());
  std::vector<std::array<std::span<const std::byte>, 2>> pieces(keys.size());
  std::vector<kvtier::value_pieces> values;
  std::vector<kvtier::value_digest> digests;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (std::size_t j = 0; j < 20; ++j) bytes[i].push_back(static_cast<std::byte>(i + j));
    pieces[i] = {std::span<const std::byte>(bytes[i]).first(12),
                 std::span<const std::byte>(bytes[i]).subspan(12)};
    values.emplace_back(pieces[i]);
    digests.push_back(kvtier::test::tagged_digest(f, 20, 2000 + i));
  }
  std::vector<chunk_status> st(keys.size(), chunk_status::error);
  REQUIRE_FALSE(r.put_pieces(keys, values, digests, st, deadline_after(5s)));
  std::vector<std::byte> got(20);
  const std::span<std::byte> dst[1] = {got};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << i);
    CHECK(st[i] == chunk_status::stored);
    digest_store& home = *ptrs[r.instance_of(keys[i])];
    CHECK(home.given(keys[i]).hashes == digests[i].hashes);
    chunk_status gs[1];
    REQUIRE_FALSE(home.get(std::span(keys).subspan(i, 1), dst, gs, deadline_after(5s)));
    CHECK(gs[0] == chunk_status::hit);
    CHECK(got == bytes[i]);
  }
  std::size_t piecewise = 0;
  for (digest_store* s : ptrs) piecewise += s->piece_puts() == 1 && s->plain_puts() == 0;
  CHECK(piecewise == 3);

  std::vector<kvtier::value_digest> short_list(digests.begin(), digests.begin() + 3);
  CHECK(r.put_pieces(keys, values, short_list, st, deadline_after(5s)) == kvtier::errc::invalid_argument);
}
