// Linked by the layering.production_links_testing tests (tests/CMakeLists.txt): a program that
// calls into kvtier_testing. Linked with libkvtier alone it must fail (testing's objects are not
// in the library production code links); linked with kvtier_testing it must link.
#include <vector>

#include "kvtier/testing/kv_pattern.h"

int main() {
  const std::vector<kvtier::Token> tokens = {1, 2, 3};
  return kvtier::KvPatternHashes(tokens, kvtier::KvPatternSalt("layering")).size() == 3 ? 0 : 1;
}
