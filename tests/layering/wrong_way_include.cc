// Compiled by the layering.* tests (tests/CMakeLists.txt) with the include roots of one module
// (src/CMakeLists.txt gives each module roots that hold only its own headers, the public headers
// of the modules below it and the internal headers those offer above them) and one of the
// includes below switched on. Each KVTIER_PROBE_<MODULE>_<WHAT> names a header that module may
// not see, so the build must fail with "No such file" for it; the *_ALLOWED ones must compile.
//
// storage_api (page keys, namespaces, the StorageBackend interface; above util and layout;
// transfer, the stores and pool are not below it):
#if defined(KVTIER_PROBE_STORAGE_API_TRANSFER)
#include "kvtier/transfer.h"  // transfer: a page key needs the layout, not the engines
#endif
#if defined(KVTIER_PROBE_STORAGE_API_STORES)
#include "kvtier/storage.h"  // the stores and OpenStorage implement the interface, above it
#endif
#if defined(KVTIER_PROBE_STORAGE_API_POOL)
#include "kvtier/host_pool.h"  // pool (and its shm:// store) is above storage_api
#endif
#if defined(KVTIER_PROBE_STORAGE_API_ALLOWED)
#include "kvtier/layout.h"    // layout is below storage_api
#include "kvtier/page_key.h"  // its own
#include "util/log.h"         // util offers it to the modules above
#endif
// storage (above util, layout, storage_api; beside transfer and pool):
#if defined(KVTIER_PROBE_STORAGE_INTERNAL)
#include "cache/radix_tree.h"  // cache's internal header: cache is above storage
#endif
#if defined(KVTIER_PROBE_STORAGE_PUBLIC)
#include "kvtier/hierarchical_cache.h"  // cache's public header
#endif
#if defined(KVTIER_PROBE_STORAGE_BESIDE)
#include "kvtier/transfer.h"  // transfer is beside storage, not below it
#endif
#if defined(KVTIER_PROBE_STORAGE_STAGING)
#include "pool/page_staging.h"  // a host pool's pages to a store: pool's, above the stores' interface
#endif
#if defined(KVTIER_PROBE_STORAGE_ALLOWED)
#include "kvtier/layout.h"           // layout is below storage
#include "kvtier/storage_backend.h"  // storage_api is below storage
#include "util/thread_pool.h"        // util offers it to the modules above
#endif
// pool (above storage_api and transfer; the stores are not below it):
#if defined(KVTIER_PROBE_POOL_STORES)
#include "kvtier/storage.h"  // the stores and OpenStorage: storage, beside pool
#endif
#if defined(KVTIER_PROBE_POOL_ALLOWED)
#include "kvtier/storage_backend.h"  // the interface pool's shm:// store implements
#include "kvtier/transfer.h"
#endif
// tp (above pool and storage):
#if defined(KVTIER_PROBE_TP_PRIVATE)
#include "pool/shm_page_index.h"  // pool's private header (pool offers shm_segment.h and others)
#endif
#if defined(KVTIER_PROBE_TP_TESTING)
#include "kvtier/testing/kv_pattern.h"  // kvtier_testing's: no module may use it
#endif
#if defined(KVTIER_PROBE_TP_ALLOWED)
#include "kvtier/storage.h"
#include "pool/page_staging.h"
#include "pool/shm_process.h"
#include "pool/shm_segment.h"
#endif

int KvtierLayeringProbe() { return 0; }
