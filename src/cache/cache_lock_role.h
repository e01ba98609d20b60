// Internal: the capability that stands for "this thread holds a cache's mutex" in Clang's
// thread-safety analysis (util/thread_annotations.h). The cache's state is KVTIER_GUARDED_BY it,
// the bookkeeping of the cache's parts KVTIER_REQUIRES it, and what must run without the mutex
// (copies, storage calls, waits) KVTIER_EXCLUDES it; a CacheLock (cache/cache_core.h) acquires it
// with the mutex.
//
// One role for every cache instance: the parts reach the state through their own reference to the
// core, and the analysis cannot tell that a part's core is the orchestrator's. So it checks that
// *a* cache's mutex is held (or not), not which one — each call works on one cache, so that is
// the contract that matters.
#pragma once

#include "util/thread_annotations.h"

namespace kvtier {

class KVTIER_CAPABILITY("mutex") CacheLockRole {};

inline CacheLockRole kCacheLock;

}  // namespace kvtier
