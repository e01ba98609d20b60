// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), so
// that a locking contract is code the compiler checks (`-Wthread-safety`) rather than a comment.
// They expand to nothing on other compilers (GCC builds ignore them).
//
//   KVTIER_GUARDED_BY(c)       data that may be read or written only while `c` is held
//   KVTIER_PT_GUARDED_BY(c)    the data a pointer points at, likewise
//   KVTIER_REQUIRES(c...)      a function the caller must call with `c` held
//   KVTIER_EXCLUDES(c...)      a function the caller must NOT call with `c` held (it waits, or
//                              takes `c` itself)
//   KVTIER_ACQUIRE / RELEASE   functions that take / let go of `c` (no argument: the scoped
//                              object's own capability)
//   KVTIER_TRY_ACQUIRE(r, c)   a function that takes `c` when it returns `r`
//   KVTIER_ASSERT_CAPABILITY(c)  a function that checks at run time that `c` is held (the
//                              analysis then takes it as held)
//   KVTIER_CAPABILITY(name)    a type whose objects are capabilities (a mutex, a role)
//   KVTIER_SCOPED_CAPABILITY   a RAII type holding a capability for its lifetime
//   KVTIER_NO_THREAD_SAFETY_ANALYSIS  a function the analysis cannot follow; say why beside it
#pragma once

#if defined(__clang__)
#define KVTIER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVTIER_THREAD_ANNOTATION(x)
#endif

#define KVTIER_CAPABILITY(name) KVTIER_THREAD_ANNOTATION(capability(name))
#define KVTIER_SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION(scoped_lockable)
#define KVTIER_GUARDED_BY(c) KVTIER_THREAD_ANNOTATION(guarded_by(c))
#define KVTIER_PT_GUARDED_BY(c) KVTIER_THREAD_ANNOTATION(pt_guarded_by(c))
#define KVTIER_REQUIRES(...) KVTIER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KVTIER_EXCLUDES(...) KVTIER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define KVTIER_ACQUIRE(...) KVTIER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KVTIER_RELEASE(...) KVTIER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KVTIER_TRY_ACQUIRE(...) KVTIER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define KVTIER_ASSERT_CAPABILITY(c) KVTIER_THREAD_ANNOTATION(assert_capability(c))
#define KVTIER_NO_THREAD_SAFETY_ANALYSIS KVTIER_THREAD_ANNOTATION(no_thread_safety_analysis)
