// A test that cannot run because a required dependency is missing (redis-server not installed, a
// build without hiredis): skipped on a developer's machine, a FAILURE under CI=true, where
// deps/debian-packages.txt is installed and a skip would hide an untested path behind a green run.
// (GPU tests skip without a GPU everywhere: a GPU is not a dependency CI can install.)
// tests/tools/missing_dep.py is the same rule for the Python-driven tests, python/tests/conftest.py
// for pytest.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace kvtier::testing {

// True under CI=true (or 1/yes): every required dependency must be present.
inline bool RequiredDependenciesMustBePresent() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string_view v(ci);
  return v == "true" || v == "TRUE" || v == "True" || v == "1" || v == "yes";
}

}  // namespace kvtier::testing

// In a TEST body or SetUp: returns from it, skipped (or failed under CI=true) with `why`.
#define KVTIER_SKIP_MISSING_DEPENDENCY(why)                                         \
  do {                                                                              \
    if (::kvtier::testing::RequiredDependenciesMustBePresent()) {                   \
      GTEST_FAIL() << (why) << " (CI=true: a required dependency must be present)"; \
    }                                                                               \
    GTEST_SKIP() << (why);                                                          \
  } while (0)
