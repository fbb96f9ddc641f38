// kvtier/detail/xxhash.hpp: includes <xxhash.h> inlined (XXH_INLINE_ALL) without
// leaking xxHash's configuration macros into the including code, and adds XXH3-64 entry points
// that pick the widest vector unit of the running CPU (AVX-512, AVX2, else the build's own).
//
// XXH_INLINE_ALL also defines XXH_STATIC_LINKING_ONLY and XXH_IMPLEMENTATION; left
// defined, a user's own later `#include <xxhash.h>` would compile xxHash's
// non-inline definitions into every such translation unit (duplicate symbols at
// link time). So every macro this header defines is undefined again. If the user
// already inlines xxHash (XXH_INLINE_ALL defined), that one copy is shared, and the entry points
// below use the build's own vector unit (no runtime choice: the AVX kernels were not compiled).
//
// Runtime dispatch: a release build targets baseline x86-64 (SSE2), so XXH3 runs at about half
// the speed the CPU allows. With GCC or Clang on x86-64 and xxHash 0.8.1 (whose internal
// kernels it reuses, the scheme of xxHash's own xxh_x86dispatch.c), xxHash's AVX2 and AVX-512
// kernels are compiled into functions marked __attribute__((target(...))) and chosen once per
// process with __builtin_cpu_supports. Every kernel computes the same hash (XXH3's result does not
// depend on the vector unit; tests/resp_io/test_value_header.cpp checks each one against the
// build's own over random inputs). The digest and short inputs (<= 240 bytes) keep the
// build's own code.
//
//   XXH3_state_t st;
//   XXH3_64bits_reset(&st);
//   kvtier::detail::xxh3_update(&st, piece.data(), piece.size());   // per piece, any split
//   std::uint64_t h = XXH3_64bits_digest(&st);   // == kvtier::detail::xxh3_64(all, n)
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(XXH_INLINE_ALL)
#include <xxhash.h>
#else
#if !defined(XXH_STATIC_LINKING_ONLY)
#define KVTIER_XXH_UNDEF_STATIC_LINKING_ONLY
#endif
#if !defined(XXH_IMPLEMENTATION)
#define KVTIER_XXH_UNDEF_IMPLEMENTATION
#endif
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(KVTIER_XXH_NO_DISPATCH)
// Compile xxHash's AVX2 / AVX-512 kernels too, each in a function of its own target.
#include <immintrin.h>
#define KVTIER_XXH_DISPATCH_WANTED 1
#define XXH_X86DISPATCH 1  // what xxh_x86dispatch.c sets: accumulators aligned for AVX-512
#define XXH_DISPATCH_AVX2 1
#define XXH_DISPATCH_AVX512 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#define XXH_TARGET_AVX512 __attribute__((__target__("avx512f")))
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>
#undef XXH_INLINE_ALL
#if defined(KVTIER_XXH_DISPATCH_WANTED)
#undef XXH_X86DISPATCH
#undef XXH_DISPATCH_AVX2
#undef XXH_DISPATCH_AVX512
#undef XXH_TARGET_AVX2
#undef XXH_TARGET_AVX512
#undef KVTIER_XXH_DISPATCH_WANTED
// The kernels' calling convention (XXH3_update taking a 512-byte accumulate step) is 0.8.1's;
// 0.8.2 changed it. Another version: the build's own vector unit only.
#if XXH_VERSION_NUMBER == 801
#define KVTIER_XXH_DISPATCH 1
#endif
#endif
#if defined(KVTIER_XXH_UNDEF_STATIC_LINKING_ONLY)
#undef XXH_STATIC_LINKING_ONLY
#undef KVTIER_XXH_UNDEF_STATIC_LINKING_ONLY
#endif
#if defined(KVTIER_XXH_UNDEF_IMPLEMENTATION)
#undef XXH_IMPLEMENTATION
#undef KVTIER_XXH_UNDEF_IMPLEMENTATION
#endif
#endif

namespace kvtier::detail {

/// The vector units an XXH3 kernel may use: the build's own (SSE2 on baseline x86-64), AVX2, AVX-512.
enum class xxh3_unit : std::uint8_t { build, avx2, avx512 };

#if defined(KVTIER_XXH_DISPATCH)
// GCC 12's own AVX-512 intrinsics (_mm512_undefined_epi32, a self-initialised value) trip
// -Wmaybe-uninitialized once inlined here; the value is never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
__attribute__((__target__("avx2"))) inline void xxh3_update_avx2(XXH3_state_t* s, const void* p,
                                                                 std::size_t n) noexcept {
  (void)XXH3_update(s, static_cast<const xxh_u8*>(p), n, XXH3_accumulate_512_avx2, XXH3_scrambleAcc_avx2);
}
__attribute__((__target__("avx512f"))) inline void xxh3_update_avx512(XXH3_state_t* s, const void* p,
                                                                      std::size_t n) noexcept {
  (void)XXH3_update(s, static_cast<const xxh_u8*>(p), n, XXH3_accumulate_512_avx512, XXH3_scrambleAcc_avx512);
}
// Long inputs only (> XXH3_MIDSIZE_MAX): what XXH3_64bits does for them, with these kernels.
__attribute__((__target__("avx2"))) inline std::uint64_t xxh3_long_avx2(const void* p,
                                                                        std::size_t n) noexcept {
  return XXH3_hashLong_64b_internal(p, n, XXH3_kSecret, sizeof(XXH3_kSecret), XXH3_accumulate_512_avx2,
                                    XXH3_scrambleAcc_avx2);
}
__attribute__((__target__("avx512f"))) inline std::uint64_t xxh3_long_avx512(const void* p,
                                                                             std::size_t n) noexcept {
  return XXH3_hashLong_64b_internal(p, n, XXH3_kSecret, sizeof(XXH3_kSecret), XXH3_accumulate_512_avx512,
                                    XXH3_scrambleAcc_avx512);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

/// True when this build has a kernel for `u` and the running CPU can execute it.
inline bool xxh3_unit_available(xxh3_unit u) noexcept {
  if (u == xxh3_unit::build) return true;
#if defined(KVTIER_XXH_DISPATCH)
  __builtin_cpu_init();
  return u == xxh3_unit::avx2 ? __builtin_cpu_supports("avx2") : __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

/// The widest available unit, decided once per process.
inline xxh3_unit xxh3_best_unit() noexcept {
  static const xxh3_unit best = xxh3_unit_available(xxh3_unit::avx512) ? xxh3_unit::avx512
                                : xxh3_unit_available(xxh3_unit::avx2) ? xxh3_unit::avx2
                                                                       : xxh3_unit::build;
  return best;
}

/// XXH3_64bits_update with unit `u` (which must be available). Same state, same result.
inline void xxh3_update_on(xxh3_unit u, XXH3_state_t* s, const void* p, std::size_t n) noexcept {
#if defined(KVTIER_XXH_DISPATCH)
  if (u == xxh3_unit::avx512) return xxh3_update_avx512(s, p, n);
  if (u == xxh3_unit::avx2) return xxh3_update_avx2(s, p, n);
#endif
  (void)u;
  (void)XXH3_64bits_update(s, p, n);
}

/// XXH3_64bits with unit `u` (which must be available). Same result.
inline std::uint64_t xxh3_64_on(xxh3_unit u, const void* p, std::size_t n) noexcept {
#if defined(KVTIER_XXH_DISPATCH)
  if (n > XXH3_MIDSIZE_MAX) {
    if (u == xxh3_unit::avx512) return xxh3_long_avx512(p, n);
    if (u == xxh3_unit::avx2) return xxh3_long_avx2(p, n);
  }
#endif
  (void)u;
  return XXH3_64bits(p, n);
}

/// XXH3_64bits_update on the widest unit the CPU has.
inline void xxh3_update(XXH3_state_t* s, const void* p, std::size_t n) noexcept {
  xxh3_update_on(xxh3_best_unit(), s, p, n);
}

/// XXH3_64bits on the widest unit the CPU has.
inline std::uint64_t xxh3_64(const void* p, std::size_t n) noexcept {
  return xxh3_64_on(xxh3_best_unit(), p, n);
}

}  // namespace kvtier::detail
