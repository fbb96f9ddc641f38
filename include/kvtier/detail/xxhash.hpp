// kvtier/detail/xxhash.hpp: includes <xxhash.h> inlined (XXH_INLINE_ALL) without
// leaking xxHash's configuration macros into the including code.
//
// XXH_INLINE_ALL also defines XXH_STATIC_LINKING_ONLY and XXH_IMPLEMENTATION; left
// defined, a user's own later `#include <xxhash.h>` would compile xxHash's
// non-inline definitions into every such translation unit (duplicate symbols at
// link time). So every macro this header defines is undefined again. If the user
// already inlines xxHash (XXH_INLINE_ALL defined), that one copy is shared.
#pragma once

#if defined(XXH_INLINE_ALL)
#include <xxhash.h>
#else
#if !defined(XXH_STATIC_LINKING_ONLY)
#define KVTIER_XXH_UNDEF_STATIC_LINKING_ONLY
#endif
#if !defined(XXH_IMPLEMENTATION)
#define KVTIER_XXH_UNDEF_IMPLEMENTATION
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>
#undef XXH_INLINE_ALL
#if defined(KVTIER_XXH_UNDEF_STATIC_LINKING_ONLY)
#undef XXH_STATIC_LINKING_ONLY
#undef KVTIER_XXH_UNDEF_STATIC_LINKING_ONLY
#endif
#if defined(KVTIER_XXH_UNDEF_IMPLEMENTATION)
#undef XXH_IMPLEMENTATION
#undef KVTIER_XXH_UNDEF_IMPLEMENTATION
#endif
#endif
