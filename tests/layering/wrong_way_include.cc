// Compiled by the layering.* tests (tests/CMakeLists.txt) as part of the storage module, with
// one of the includes below switched on: each names a module storage may not see (above it, or
// beside it), so the build must fail with "No such file" for it (src/CMakeLists.txt gives each
// module include roots that hold only its own and lower modules' headers).
#if defined(KVTIER_PROBE_INTERNAL)
#include "cache/radix_tree.h"  // cache's internal header
#endif
#if defined(KVTIER_PROBE_PUBLIC)
#include "kvtier/hierarchical_cache.h"  // cache's public header
#endif
#if defined(KVTIER_PROBE_BESIDE)
#include "kvtier/transfer.h"  // transfer is beside storage, not below it
#endif
#if defined(KVTIER_PROBE_ALLOWED)
#include "kvtier/layout.h"           // layout is below storage
#include "kvtier/storage_backend.h"  // storage_api is below storage
#include "util/thread_pool.h"        // util is below storage
#endif

int KvtierLayeringProbe() { return 0; }
