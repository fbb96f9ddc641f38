// Uses kvtier built as a subproject: chunks a prompt, prints the first key's
// remote name and whether a hit would pay off on the reference's hardware.
#include <kvtier/chunker.hpp>
#include <kvtier/cost_model.hpp>

#include <cstdio>
#include <vector>

int main() {
  const std::vector<kvtier::token_id> prompt(512, 42u);
  const kvtier::key_namespace ns{.model = "consumer", .chunk_tokens = 256};
  const auto keys = kvtier::chunker<>(ns).keys(prompt);
  if (keys.size() != 2 || keys[0] == keys[1]) return 1;
  const kvtier::prefill_node node{.kv_bytes_per_token = 48.4e3, .prefill_tokens_per_s = 52.2e3};
  std::printf("add_subdirectory consumer: %s B*=%.2f GB/s\n", kvtier::remote_key_text(ns, keys[0]).c_str(),
              kvtier::break_even_bandwidth_gb_per_s(node));
  return 0;
}
