// tests/resp_codec/feed.hpp: drives a kvtier::resp::parser the way a socket loop does
// (prepare, copy at most one received piece, commit, drain next()), for tests and the fuzzer.
#pragma once

#include <algorithm>
#include <cstring>
#include <span>
#include <string_view>
#include <system_error>
#include <vector>

#include "kvtier/resp/parser.hpp"

namespace kvtier::test {

struct parsed {
  std::vector<resp::value> values;
  std::error_code ec;
  bool stuck = false;  ///< prepare() stayed empty after next(): a parser bug
};

/// Feeds `input` in consecutive pieces whose sizes cycle through `pieces` (0 counts as 1;
/// empty: the whole input at once), draining next() after every commit. Stops at an error.
inline parsed feed(resp::parser& p, std::string_view input, std::span<const std::size_t> pieces = {}) {
  parsed r;
  auto drain = [&] {
    while (auto v = p.next(r.ec)) r.values.push_back(std::move(*v));
    return !r.ec;
  };
  std::size_t pos = 0;
  std::size_t k = 0;
  while (pos < input.size()) {
    std::size_t left = pieces.empty() ? input.size() : std::max<std::size_t>(pieces[k++ % pieces.size()], 1);
    left = std::min(left, input.size() - pos);
    while (left > 0) {
      std::span<std::byte> into = p.prepare();
      if (into.empty()) {
        if (!drain()) return r;
        into = p.prepare();
        if (into.empty()) {
          r.stuck = true;
          return r;
        }
      }
      const std::size_t n = std::min(into.size(), left);
      std::memcpy(into.data(), input.data() + pos, n);
      p.commit(n);
      pos += n;
      left -= n;
      if (!drain()) return r;
    }
  }
  drain();
  return r;
}

/// feed() into a fresh parser with `limits`.
inline parsed parse_all(std::string_view input, std::span<const std::size_t> pieces = {},
                        resp::parser_limits limits = {}) {
  resp::parser p(limits);
  return feed(p, input, pieces);
}

}  // namespace kvtier::test
