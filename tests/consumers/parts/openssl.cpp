// kvtier::openssl: the SHA-256 chunk chain (links OpenSSL's libcrypto).
#include <kvtier/chunk_hash_openssl.hpp>

#include <string>
#include <vector>

std::string use_openssl() {
  const kvtier::key_namespace ns{.model = "consumer", .chunk_tokens = 4};
  const std::vector<kvtier::token_id> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto keys = kvtier::chunker<kvtier::sha256_128>(ns).keys(tokens, {.tenant_salt = "t"});
  return keys.size() == 2 ? "ok " + keys[1].to_hex() : "wrong key count";
}
