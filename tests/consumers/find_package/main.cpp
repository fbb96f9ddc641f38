// Chunks a prompt with an installed kvtier and prints the remote name of its
// first key and its lookup answer.
#include <kvtier/kvtier.hpp>

#include <cstdio>
#include <numeric>
#include <vector>

int main() {
  std::vector<kvtier::token_id> prompt(1000);
  std::iota(prompt.begin(), prompt.end(), 1u);
  const kvtier::key_namespace ns{
      .model = "consumer", .kv_format = "fp8", .chunk_tokens = 256, .ownership = "mod:2"};
  const auto keys = kvtier::chunker<>(ns).keys(prompt);
  if (keys.size() != 3) return 1;
  const auto starts = kvtier::owned_starts(kvtier::modulo_ownership(2), 1, keys.size(), ns.chunk_tokens);
  const std::vector<bool> present(starts.size(), false);
  std::printf("find_package consumer: %s rank1-answer=%llu\n", kvtier::remote_key_text(ns, keys[0]).c_str(),
              static_cast<unsigned long long>(kvtier::rank_answer(starts, present, keys.size() * 256)));
  return 0;
}
