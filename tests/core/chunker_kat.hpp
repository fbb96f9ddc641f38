// tests/core/chunker_kat.hpp: the chunker's known-answer vectors, in one place.
//
// Each case fixes a namespace, a tail policy and a token sequence; `expected`
// lists the remote key text of every key, computed once with the committed
// chunker and xxHash 0.8 and never regenerated: a change here means every
// stored chunk of every deployment changes name. test_chunker checks them in
// process; kvtier_kat_keys prints them from two separate processes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/chunker.hpp"

namespace kvtier::test {

struct chunker_kat {
  std::string_view name;
  key_namespace ns;
  tail_policy tail;
  std::size_t n_tokens;
  std::string_view root;                   ///< chunker root (namespace key), 32 hex digits
  std::vector<std::string_view> expected;  ///< remote_key_text of each key, in order
};

/// Token i of every KAT prompt: a fixed odd-multiplier sequence covering all 32 bits.
inline token_id kat_token(std::size_t i) {
  return static_cast<token_id>(static_cast<std::uint64_t>(i) * 2654435761u + 12345u);
}

inline std::vector<token_id> kat_tokens(std::size_t n) {
  std::vector<token_id> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = kat_token(i);
  return t;
}

inline std::vector<chunker_kat> chunker_kats() {
  const key_namespace glm{.model = "glm-5.3-fp8",
                          .kv_format = "mla-latent-fp8",
                          .chunk_tokens = 256,
                          .layout_version = 1,
                          .ownership = "mod:8"};
  key_namespace small = glm;
  small.chunk_tokens = 4;
  return {
      {"default namespace, 1000 tokens",
       key_namespace{},
       tail_policy::drop,
       1000,
       "60fde420962f2725e1595dec4cc48474",
       {"kvtier:60fde420962f2725:d720e441bb57423f550baaf6c9abe645",
        "kvtier:60fde420962f2725:2bb4edbeeb8ff68fb056a16daad737fb",
        "kvtier:60fde420962f2725:6b0b0730202f6df379c0c843aa91495d"}},
      {"glm mod:8, 1000 tokens, tail dropped",
       glm,
       tail_policy::drop,
       1000,
       "cb98e53d21d81d70a67c9fb99ad717fa",
       {"kvtier:cb98e53d21d81d70:ef2b1d81fc035a8d7b1f1424c7b444f8",
        "kvtier:cb98e53d21d81d70:96d120989cb4cc5810544e88ed56b60d",
        "kvtier:cb98e53d21d81d70:8e01e3e706aee2a618e892437744402e"}},
      {"glm mod:8, 1000 tokens, tail hashed",
       glm,
       tail_policy::hash_partial,
       1000,
       "cb98e53d21d81d70a67c9fb99ad717fa",
       {"kvtier:cb98e53d21d81d70:ef2b1d81fc035a8d7b1f1424c7b444f8",
        "kvtier:cb98e53d21d81d70:96d120989cb4cc5810544e88ed56b60d",
        "kvtier:cb98e53d21d81d70:8e01e3e706aee2a618e892437744402e",
        "kvtier:cb98e53d21d81d70:e655e277a6e352b4781fb219e141af2d"}},
      {"glm chunk 4, 10 tokens, tail hashed",
       small,
       tail_policy::hash_partial,
       10,
       "462d346cf15f2cc747edf81826312772",
       {"kvtier:462d346cf15f2cc7:1a8e8391f76aa8d2ffaac1dfdc7b04f8",
        "kvtier:462d346cf15f2cc7:fa18127259041688cb87dff4b376689f",
        "kvtier:462d346cf15f2cc7:364b4b56cb46266a181ee63282383fe9"}},
      {"glm mod:8, 255 tokens (no full chunk)",
       glm,
       tail_policy::drop,
       255,
       "cb98e53d21d81d70a67c9fb99ad717fa",
       {}},
  };
}

}  // namespace kvtier::test
