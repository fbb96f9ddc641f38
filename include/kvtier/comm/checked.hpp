// kvtier/comm/checked.hpp: a decorator that verifies every rank issues the same collective first.
//
// Backends such as NCCL cannot see mismatched calls: the ranks just wait until a
// deadline. checked<C> makes any backend report them like the in-process one does:
// before each top-level collective (or group) it runs one small host all_reduce
// that shows every rank's call to every rank; if they differ, every rank returns
// errc::collective_mismatch and last_error() names both calls; otherwise the real
// collective runs. The check itself never mismatches (its size depends only on W).
// Cost: one extra all_reduce of 5 * W u64 per collective -- a debugging aid for
// bring-up and tests, not for production paths.
//
//   kvtier::comm::checked<kvtier::comm::nccl_communicator> c(std::move(nccl));
//   auto ec = c.broadcast(buf, buf, root, dl);   // collective_mismatch instead of a hang
//
// Groups are queued here and replayed on the inner communicator after their check
// (local_copy runs at once, as before the group's collectives in NCCL); a group's
// operations are compared by count and by a hash of their descriptors. An empty
// group is checked as well (then not issued), so an empty group on one rank against
// a non-empty one on another is reported as a mismatch instead of shifting later checks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtier/comm/communicator.hpp"

namespace kvtier::comm {

template <communicator C>
class checked {
 public:
  static constexpr bool rounds_fail_together = comm::rounds_fail_together<std::remove_cvref_t<C>>;

  explicit checked(C inner) : inner_(std::forward<C>(inner)) {}

  std::remove_reference_t<C>& inner() noexcept { return inner_; }
  rank_t rank() const { return inner_.rank(); }
  rank_t size() const { return inner_.size(); }
  std::string last_error() const {
    return last_error_.empty() ? std::string(inner_.last_error()) : last_error_;
  }

  std::error_code broadcast(std::span<const std::byte> send, std::span<std::byte> recv, rank_t root,
                            kvtier::deadline dl) {
    op o{kind_call(op_kind::broadcast, root, recv.size()), send, recv};
    return submit(o, dl);
  }
  std::error_code all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             kvtier::deadline dl) {
    op o{kind_call(op_kind::all_gather, 0, send.size()), send, recv};
    return submit(o, dl);
  }
  std::error_code all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, dtype type,
                             reduce_op rop, kvtier::deadline dl) {
    collective_call c = kind_call(op_kind::all_reduce, 0, recv.size());
    c.type = type;
    c.reduce = rop;
    op o{c, send, recv};
    return submit(o, dl);
  }
  std::error_code group_start() {
    ++depth_;
    return {};
  }
  std::error_code group_end(kvtier::deadline dl) {
    if (depth_ == 0) return fail(kvtier::errc::invalid_argument, "group_end without group_start");
    if (--depth_ > 0) return {};
    std::vector<op> ops;
    ops.swap(queued_);
    // An empty group is checked too: skipping its check on one rank while a peer
    // checks a non-empty group would pair that check with this rank's next one and
    // shift every later comparison by one. Every rank reaching here checks, so an
    // empty group against a non-empty one is a collective_mismatch on every rank.
    collective_call g = kind_call(op_kind::group, 0, ops.size());
    std::uint64_t h = 0xCBF29CE484222325ull;
    for (const auto& o : ops) h = mix_call(h, o.call);
    if (auto ec = check(g, h, dl)) return ec;
    if (ops.empty()) return {};  // every rank's group is empty: nothing to issue (as in NCCL)
    if (auto ec = inner_.group_start()) return ec;
    std::error_code first;
    for (const auto& o : ops)
      if (auto ec = run(o, dl); ec && !first) first = ec;
    if (auto ec = inner_.group_end(dl); ec && !first) first = ec;
    return first;
  }
  std::error_code local_copy(std::span<std::byte> dst, std::span<const std::byte> src, kvtier::deadline dl) {
    return inner_.local_copy(dst, src, dl);
  }

 private:
  struct op {
    collective_call call;
    std::span<const std::byte> send;
    std::span<std::byte> recv;
  };
  static constexpr std::size_t fields = 5;

  static collective_call kind_call(op_kind k, rank_t root, std::uint64_t bytes) {
    collective_call c;
    c.op = k;
    c.root = root;
    c.bytes = bytes;
    return c;
  }
  static std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
    h ^= v;
    h *= 0x100000001B3ull;
    return h ^ (h >> 29);
  }
  // Each field is mixed in on its own: packing them into one word let the root's
  // bits cancel against the size's (broadcast(root=1, B) == broadcast(root=0, B ^ 2^20)).
  static std::uint64_t mix_call(std::uint64_t h, const collective_call& c) noexcept {
    h = mix(h, (static_cast<std::uint64_t>(c.op) << 16) | (static_cast<std::uint64_t>(c.type) << 8) |
                   static_cast<std::uint64_t>(c.reduce));
    h = mix(h, c.root);
    return mix(h, c.bytes);
  }

  std::error_code fail(std::error_code ec, std::string msg) {
    last_error_ = std::move(msg);
    return ec;
  }

  std::error_code submit(const op& o, kvtier::deadline dl) {
    if (depth_ > 0) {
      queued_.push_back(o);
      return {};
    }
    if (auto ec = check(o.call, 0, dl)) return ec;
    return run(o, dl);
  }

  std::error_code run(const op& o, kvtier::deadline dl) {
    last_error_.clear();
    switch (o.call.op) {
      case op_kind::broadcast:
        return inner_.broadcast(o.send, o.recv, o.call.root, dl);
      case op_kind::all_gather:
        return inner_.all_gather(o.send, o.recv, dl);
      case op_kind::all_reduce:
        return inner_.all_reduce(o.send, o.recv, o.call.type, o.call.reduce, dl);
      case op_kind::group:
        break;
    }
    return kvtier::errc::invalid_argument;
  }

  static collective_call decode(const std::uint64_t* s) {
    collective_call c;
    c.op = static_cast<op_kind>(s[0] - 1);
    c.root = static_cast<rank_t>(s[1]);
    c.bytes = s[2];
    c.type = static_cast<dtype>(s[3] >> 8);
    c.reduce = static_cast<reduce_op>(s[3] & 0xFF);
    return c;
  }

  // Every rank writes its call into its own slot of a zeroed vector; a sum shows all slots to all.
  std::error_code check(const collective_call& c, std::uint64_t list_hash, kvtier::deadline dl) {
    const rank_t w = size(), me = rank();
    slots_.assign(static_cast<std::size_t>(w) * fields, 0);
    std::uint64_t* mine = slots_.data() + static_cast<std::size_t>(me) * fields;
    mine[0] = static_cast<std::uint64_t>(c.op) + 1;
    mine[1] = c.root;
    mine[2] = c.bytes;
    mine[3] = (static_cast<std::uint64_t>(c.type) << 8) | static_cast<std::uint64_t>(c.reduce);
    mine[4] = list_hash;
    const auto bytes = std::as_writable_bytes(std::span<std::uint64_t>(slots_));
    if (auto ec = inner_.all_reduce(bytes, bytes, dtype::u64, reduce_op::sum, dl))
      return fail(ec, "checked: call check failed: " + std::string(inner_.last_error()));
    const std::uint64_t* ref = slots_.data();
    for (rank_t j = 1; j < w; ++j) {
      const std::uint64_t* s = slots_.data() + static_cast<std::size_t>(j) * fields;
      if (std::equal(s, s + fields, ref)) continue;
      std::string a = to_string(decode(ref)), b = to_string(decode(s));
      if (a == b)
        a += " [ops hash " + std::to_string(ref[4]) + "]", b += " [ops hash " + std::to_string(s[4]) + "]";
      return fail(kvtier::errc::collective_mismatch, "collective mismatch: rank 0 called " + a +
                                                         " but rank " + std::to_string(j) + " called " + b);
    }
    return {};
  }

  C inner_;
  std::uint32_t depth_ = 0;
  std::vector<op> queued_;
  std::vector<std::uint64_t> slots_;
  std::string last_error_;
};

}  // namespace kvtier::comm
