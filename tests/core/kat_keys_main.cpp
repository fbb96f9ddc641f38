// kvtier_kat_keys: prints the chunker's keys for the KAT prompts, one line each.
//
//   kvtier_kat_keys             keys computed by this process
//   kvtier_kat_keys --expected  the committed known answers (chunker_kat.hpp)
//
// ctest runs it as separate processes (two_process_keys.cmake) and requires the
// outputs to be byte-identical with each other and with the known answers.
#include <cstdio>
#include <cstring>
#include <string>

#include "core/chunker_kat.hpp"

int main(int argc, char** argv) {
  const bool expected = argc > 1 && std::strcmp(argv[1], "--expected") == 0;
  for (const auto& kat : kvtier::test::chunker_kats()) {
    std::printf("# %.*s\n", static_cast<int>(kat.name.size()), kat.name.data());
    if (expected) {
      std::printf("root %.*s\n", static_cast<int>(kat.root.size()), kat.root.data());
      for (std::string_view k : kat.expected) std::printf("%.*s\n", static_cast<int>(k.size()), k.data());
      continue;
    }
    const kvtier::chunker<> ch(kat.ns, kat.tail);
    std::printf("root %s\n", ch.root().to_hex().c_str());
    for (const auto& key : ch.keys(kvtier::test::kat_tokens(kat.n_tokens)))
      std::printf("%s\n", kvtier::remote_key_text(kat.ns, key).c_str());
  }
  return 0;
}
