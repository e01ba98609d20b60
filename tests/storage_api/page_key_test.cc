// Page keys and the storage namespace: the SGLang test vector, chaining across calls, tenant salt
// isolation, bad tokens and page sizes, hex round trips; namespace validation, hashing and names.
// Expected digests were computed independently with Python's hashlib (struct.pack('<nI', ...)).
#include "kvtier/page_key.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

namespace kvtier {
namespace {

std::vector<std::string> HexOf(const std::vector<PageKey>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.Hex());
  return out;
}

TEST(PageKeyTest, SglangTestVector) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  auto keys = ComputePromptPageKeys(tokens, 4);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 1u);
  EXPECT_EQ((*keys)[0].Hex(), "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72");
}

TEST(PageKeyTest, ChainsAndDropsThePartialPage) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto keys = ComputePromptPageKeys(tokens, 4);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(HexOf(*keys), (std::vector<std::string>{
                              "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72",
                              "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6"}));
  // Continuing a chain from the previous key gives the same key as hashing the whole prompt.
  const std::vector<int32_t> second = {5, 6, 7, 8};
  auto continued = ComputePageKeys(std::span<const int32_t>(second), 4, (*keys)[0]);
  ASSERT_TRUE(continued.ok());
  ASSERT_EQ(continued->size(), 1u);
  EXPECT_EQ((*continued)[0], (*keys)[1]);
  // The same page after a different prefix has a different key (a key names its prefix).
  auto alone = ComputePageKeys(std::span<const int32_t>(second), 4, std::nullopt);
  ASSERT_TRUE(alone.ok());
  EXPECT_NE((*alone)[0], (*keys)[1]);
}

TEST(PageKeyTest, TokensAreUnsigned32BitLittleEndian) {
  const std::vector<int64_t> tokens = {0xFFFFFFFFll, 0, 7, int64_t{1} << 31};
  auto keys = ComputePageKeys(std::span<const int64_t>(tokens), 2, std::nullopt);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(HexOf(*keys), (std::vector<std::string>{
                              "72a4fa3544e43a836ffcb268ce06ccdbc55d44d5e6b1b1c19216a53ea98301fd",
                              "3b509b93c63275ec46f7075b87c993cd9ab97754ee8326c350dafc61e062c585"}));
  // int32 and int64 spellings of the same tokens give the same keys.
  const std::vector<int32_t> small = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int64_t> wide(small.begin(), small.end());
  auto a = ComputePageKeys(std::span<const int32_t>(small), 4, std::nullopt);
  auto b = ComputePageKeys(std::span<const int64_t>(wide), 4, std::nullopt);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(PageKeyTest, SaltSeedsTheChainAndIsolatesTenants) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  auto salted = ComputePromptPageKeys(tokens, 4, "tenant-a");
  ASSERT_TRUE(salted.ok());
  EXPECT_EQ((*salted)[0].Hex(), "32536273a94208feabc3cf641988b749050c9128666d0652aa789a6785b4a137");
  auto other = ComputePromptPageKeys(tokens, 4, "tenant-b");
  auto none = ComputePromptPageKeys(tokens, 4, "");
  ASSERT_TRUE(other.ok() && none.ok());
  EXPECT_NE((*salted)[0], (*other)[0]);
  EXPECT_NE((*salted)[0], (*none)[0]);
  EXPECT_FALSE(ChainSeed("").has_value());
  ASSERT_TRUE(ChainSeed("tenant-a").has_value());
  auto via_seed = ComputePageKeys(std::span<const int32_t>(tokens), 4, ChainSeed("tenant-a"));
  ASSERT_TRUE(via_seed.ok());
  EXPECT_EQ(*via_seed, *salted);
}

TEST(PageKeyTest, BadTokensAndPageSizesAreInvalidArgument) {
  const std::vector<int64_t> too_big = {1, 2, int64_t{1} << 32, 4};
  auto r = ComputePageKeys(std::span<const int64_t>(too_big), 2, std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_NE(r.status().message().find("position 2"), std::string::npos) << r.status().ToString();
  const std::vector<int32_t> negative = {1, -5, 3, 4};
  auto n = ComputePromptPageKeys(negative, 4);
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(n.status().IsInvalidArgument());
  EXPECT_NE(n.status().message().find("-5"), std::string::npos);
  // A bad token in the unkeyed partial page does not matter.
  const std::vector<int32_t> tail = {1, 2, 3, 4, -1};
  EXPECT_TRUE(ComputePromptPageKeys(tail, 4).ok());
  for (int64_t page_size : {int64_t{0}, int64_t{-1}, (int64_t{1} << 20) + 1}) {
    auto p = ComputePromptPageKeys(tail, page_size);
    ASSERT_FALSE(p.ok()) << page_size;
    EXPECT_TRUE(p.status().IsInvalidArgument());
    EXPECT_NE(p.status().message().find("page_size"), std::string::npos);
  }
  auto empty = ComputePromptPageKeys({}, 16);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(PageKeyTest, HexRoundTripAndBadHex) {
  std::vector<int32_t> tokens(64);
  for (int i = 0; i < 64; ++i) tokens[static_cast<size_t>(i)] = i * 7919;
  auto keys = ComputePromptPageKeys(tokens, 16);
  ASSERT_TRUE(keys.ok());
  for (const auto& k : *keys) {
    const std::string hex = k.Hex();
    ASSERT_EQ(hex.size(), 64u);
    for (char c : hex) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << hex;
    auto back = PageKey::FromHex(hex);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, k);
    std::string upper = hex;
    for (char& c : upper) c = static_cast<char>(std::toupper(c));
    EXPECT_EQ(*PageKey::FromHex(upper), k);
  }
  EXPECT_TRUE(PageKey::FromHex("").status().IsInvalidArgument());
  EXPECT_TRUE(PageKey::FromHex(std::string(63, 'a')).status().IsInvalidArgument());
  EXPECT_TRUE(PageKey::FromHex(std::string(65, 'a')).status().IsInvalidArgument());
  std::string bad(64, 'a');
  bad[10] = '/';
  auto r = PageKey::FromHex(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("position 10"), std::string::npos);
  bad[10] = 'g';
  EXPECT_FALSE(PageKey::FromHex(bad).ok());
}

TEST(PageKeyTest, HashSpreadsKeys) {
  std::vector<int32_t> tokens(16 * 1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 977);
  auto keys = ComputePromptPageKeys(tokens, 16);
  ASSERT_TRUE(keys.ok());
  std::unordered_set<PageKey, PageKeyHash> set(keys->begin(), keys->end());
  EXPECT_EQ(set.size(), 1000u);
  std::set<size_t> hashes;
  for (const auto& k : *keys) hashes.insert(PageKeyHash{}(k));
  EXPECT_EQ(hashes.size(), 1000u);
}

StorageNamespace ValidNamespace() {
  StorageNamespace ns;
  ns.model_id = "meta-llama/Llama-3-8B";
  ns.kv_dtype = "bf16";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = 32;
  ns.slot_bytes = 1024;
  ns.page_size = 16;
  ns.head_num = 8;
  ns.tp_rank = 0;
  ns.tp_size = 1;
  return ns;
}

TEST(StorageNamespaceTest, ValidateNamesTheField) {
  EXPECT_TRUE(ValidNamespace().Validate().ok());
  struct Case {
    const char* field;
    void (*mutate)(StorageNamespace&);
  };
  const Case cases[] = {
      {"num_layers", [](StorageNamespace& n) { n.num_layers = 0; }},
      {"slot_bytes", [](StorageNamespace& n) { n.slot_bytes = -4; }},
      {"page_size", [](StorageNamespace& n) { n.page_size = 0; }},
      {"page_size", [](StorageNamespace& n) { n.page_size = 24; }},
      {"page_size", [](StorageNamespace& n) { n.page_size = 512; }},
      {"head_num", [](StorageNamespace& n) { n.head_num = 0; }},
      {"head_num", [](StorageNamespace& n) { n.head_num = 3; }},
      {"tp_size", [](StorageNamespace& n) { n.tp_size = 0; }},
      {"tp_rank", [](StorageNamespace& n) { n.tp_rank = 1; }},
      {"tp_rank", [](StorageNamespace& n) { n.tp_rank = -1; }},
      {"layout", [](StorageNamespace& n) { n.layout = static_cast<KvLayout>(9); }},
  };
  for (const auto& c : cases) {
    StorageNamespace ns = ValidNamespace();
    c.mutate(ns);
    const Status s = ns.Validate();
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_TRUE(s.IsInvalidArgument());
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.ToString();
  }
}

TEST(StorageNamespaceTest, PageBytes) {
  StorageNamespace ns = ValidNamespace();
  EXPECT_EQ(ns.page_bytes(), 2 * 32 * 16 * 1024);  // 1 MiB: K and V
  ns.mla = true;
  EXPECT_EQ(ns.page_bytes(), 32 * 16 * 1024);
}

TEST(StorageNamespaceTest, EveryFieldChangesTheHash) {
  const StorageNamespace base = ValidNamespace();
  std::vector<StorageNamespace> variants;
  auto add = [&](void (*mutate)(StorageNamespace&)) {
    StorageNamespace ns = base;
    mutate(ns);
    variants.push_back(ns);
  };
  add([](StorageNamespace& n) { n.model_id = "meta-llama/Llama-3-70B"; });
  add([](StorageNamespace& n) { n.kv_dtype = "fp8_e4m3"; });  // SGLang issue #33268
  add([](StorageNamespace& n) { n.layout = KvLayout::kPageFirstDirect; });
  add([](StorageNamespace& n) { n.mla = true; });
  add([](StorageNamespace& n) { n.num_layers = 16; });
  add([](StorageNamespace& n) { n.slot_bytes = 512; });
  add([](StorageNamespace& n) { n.page_size = 64; });
  add([](StorageNamespace& n) { n.head_num = 4; });
  add([](StorageNamespace& n) {
    n.tp_rank = 1;
    n.tp_size = 2;
  });
  add([](StorageNamespace& n) { n.tp_size = 2; });
  // Concatenation must not collide: "ab"+"c" vs "a"+"bc".
  add([](StorageNamespace& n) {
    n.model_id = "meta-llama/Llama-3-8Bb";
    n.kv_dtype = "f16";
  });
  add([](StorageNamespace& n) {
    n.model_id = "meta-llama/Llama-3-8B";
    n.kv_dtype = "bbf16";
  });
  std::set<uint64_t> hashes = {base.Hash()};
  std::set<std::string> names = {base.Name()};
  for (const auto& v : variants) {
    hashes.insert(v.Hash());
    names.insert(v.Name());
  }
  EXPECT_EQ(hashes.size(), variants.size() + 1);
  EXPECT_EQ(names.size(), variants.size() + 1);
  // Deterministic, and a copy hashes the same.
  StorageNamespace copy = base;
  EXPECT_EQ(copy.Hash(), base.Hash());
}

TEST(StorageNamespaceTest, NameIsPathAndKeySafe) {
  const std::string name = ValidNamespace().Name();
  ASSERT_EQ(name.size(), 18u);
  EXPECT_EQ(name.substr(0, 2), "kv");
  for (char c : name.substr(2)) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  EXPECT_EQ(name, fmt::format("kv{:016x}", ValidNamespace().Hash()));
  const std::string d = ValidNamespace().Describe();
  EXPECT_NE(d.find("meta-llama/Llama-3-8B"), std::string::npos);
  EXPECT_NE(d.find("page_first"), std::string::npos);
}

// A pool's shape and its owner make the namespace; num_slots (the pool's size) does not.
TEST(StorageNamespaceTest, OfAPoolsShape) {
  const KvGeometry pages{KvLayout::kPageHead, 3, 512, 64, 16, 4};
  const StorageNamespace ns =
      StorageNamespaceOf(pages, /*mla=*/true, {"org/model", "fp8_e4m3", 1, 2});
  EXPECT_EQ(ns.model_id, "org/model");
  EXPECT_EQ(ns.kv_dtype, "fp8_e4m3");
  EXPECT_EQ(ns.layout, KvLayout::kPageHead);
  EXPECT_TRUE(ns.mla);
  EXPECT_EQ(ns.num_layers, 3);
  EXPECT_EQ(ns.slot_bytes, 64);
  EXPECT_EQ(ns.page_size, 16);
  EXPECT_EQ(ns.head_num, 4);
  EXPECT_EQ(ns.tp_rank, 1);
  EXPECT_EQ(ns.tp_size, 2);
  KvGeometry bigger = pages;
  bigger.num_slots *= 4;
  EXPECT_EQ(StorageNamespaceOf(bigger, true, {"org/model", "fp8_e4m3", 1, 2}).Hash(), ns.Hash());
  const StorageNamespace plain = StorageNamespaceOf(pages, false, {.model_id = "m"});
  EXPECT_EQ(plain.kv_dtype, "bf16");
  EXPECT_EQ(plain.tp_rank, 0);
  EXPECT_EQ(plain.tp_size, 1);
}

}  // namespace
}  // namespace kvtier
