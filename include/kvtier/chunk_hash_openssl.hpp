// kvtier/chunk_hash_openssl.hpp: a SHA-256 chunk chain (OpenSSL), for deployments where
// tenants that share a cache must not be able to collide each other's keys.
//
// Part of the optional target kvtier::openssl (links OpenSSL::Crypto); kvtier::kvtier does not
// need OpenSSL. Use it as the chunker's hash:
//
//   #include <kvtier/chunk_hash_openssl.hpp>
//   kvtier::chunker<kvtier::sha256_128> chunk(ns);
//   auto keys = chunk.keys(tokens, {.tenant_salt = salt});
//
// key[c] = the first 128 bits of SHA-256(key[c-1].hi, key[c-1].lo (little-endian) || bytes).
// The default xxh3_128 chain never maps two different prompts to one key by accident, but it
// is not collision resistant against someone who chooses the tokens: a tenant could craft a
// prompt whose keys equal another tenant's and poison or probe a shared cache. Finding a
// collision of this chain costs about 2^64 SHA-256 evaluations. It is slower (bench_chunker
// reports both); a chain's keys depend on its hash, so both cannot share one cache namespace's
// entries (they simply never match).
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>

#include "kvtier/chunker.hpp"

namespace kvtier {

/// SHA-256 chunk chain truncated to 128 bits; satisfies chunk_hash_function.
/// Throws std::runtime_error when OpenSSL cannot hash (allocation failure, disabled digest).
struct sha256_128 {
  static constexpr std::string_view name = "sha256-128";

  static chunk_key chain(const chunk_key& prev, std::span<const std::byte> bytes) {
    // One context per thread, reused: EVP_MD_CTX_new per chunk would allocate on the hot path.
    thread_local const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                                                   &EVP_MD_CTX_free);
    unsigned char prev_bytes[16];
    for (int i = 0; i < 8; ++i) {
      prev_bytes[i] = static_cast<unsigned char>(prev.hi >> (8 * i));
      prev_bytes[8 + i] = static_cast<unsigned char>(prev.lo >> (8 * i));
    }
    unsigned char digest[32];
    unsigned int len = 0;
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1 ||
        EVP_DigestUpdate(ctx.get(), prev_bytes, sizeof prev_bytes) != 1 ||
        EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1 ||
        EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1 || len != sizeof digest)
      throw std::runtime_error("kvtier::sha256_128: OpenSSL SHA-256 failed");
    chunk_key k;
    for (int i = 0; i < 8; ++i) {
      k.hi |= static_cast<std::uint64_t>(digest[i]) << (8 * i);
      k.lo |= static_cast<std::uint64_t>(digest[8 + i]) << (8 * i);
    }
    return k;
  }
};

static_assert(chunk_hash_function<sha256_128>);

}  // namespace kvtier
