// The table of storage URL schemes (kvtier/storage_schemes.h): every row opens its store (or says
// what the build lacks), and the places that depend on a scheme follow its row.
#include "kvtier/storage_schemes.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "kvtier/kv_events.h"
#include "kvtier/storage.h"

namespace kvtier {
namespace {

StorageNamespace TinyNamespace() {
  StorageNamespace ns;
  ns.model_id = std::string("m");  // not = "m": gcc 12's -Wrestrict false positive (PR 105651)
  ns.num_layers = 2;
  ns.slot_bytes = 64;
  ns.page_size = 16;
  return ns;
}

TEST(StorageSchemesTest, NamesAreUniqueAndFound) {
  std::set<std::string_view> names;
  for (const StorageScheme& s : StorageSchemes()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_EQ(FindStorageScheme(s.name), &s);
    EXPECT_FALSE(s.medium.empty()) << s.name;
    EXPECT_TRUE(s.open != nullptr || !s.missing.empty()) << s.name << ": say what it needs";
  }
  EXPECT_EQ(FindStorageScheme("file://"), nullptr);
  EXPECT_EQ(FindStorageScheme("s3"), nullptr);
  EXPECT_EQ(FindStorageScheme(""), nullptr);
}

TEST(StorageSchemesTest, TheSchemesKvtierShips) {
  const std::pair<std::string_view, std::string_view> want[] = {{"file", kMediumDisk},
                                                                {"redis", kMediumRedis},
                                                                {"redis+cluster", kMediumRedis},
                                                                {"memory", kMediumMemory}};
  ASSERT_EQ(StorageSchemes().size(), std::size(want));
  for (const auto& [name, medium] : want) {
    const StorageScheme* s = FindStorageScheme(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->medium, medium) << name;
  }
  EXPECT_EQ(FindStorageScheme("file")->baseline, StorageBaseline::kFiles);
  EXPECT_EQ(FindStorageScheme("memory")->baseline, StorageBaseline::kMemcpy);
  EXPECT_EQ(FindStorageScheme("redis")->form, StorageUrlForm::kHosts);
  EXPECT_EQ(FindStorageScheme("file")->form, StorageUrlForm::kPath);
  EXPECT_EQ(StorageSchemeList(), "file://, redis://, redis+cluster:// or memory://");
}

TEST(StorageSchemesTest, UrlScheme) {
  EXPECT_EQ(StorageUrlScheme("file:///a?b=1"), "file");
  EXPECT_EQ(StorageUrlScheme("redis+cluster://h:1"), "redis+cluster");
  EXPECT_EQ(StorageUrlScheme("://x"), "");
  EXPECT_EQ(StorageUrlScheme("no-scheme"), "");
  EXPECT_EQ(StorageUrlScheme(""), "");
}

// OpenStorage reaches each row's backend: a store opens, or the backend's own error comes back
// (no server), or the row's `missing` line; never "unknown scheme".
TEST(StorageSchemesTest, OpenStorageUsesEveryRow) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("kvtier-schemes-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  for (const StorageScheme& s : StorageSchemes()) {
    std::string url = std::string(s.name) + "://";
    if (s.form == StorageUrlForm::kHosts) {
      url += "127.0.0.1:1?connect_timeout_ms=100";  // nothing listens on port 1
    } else if (s.baseline == StorageBaseline::kFiles) {
      url += dir.string() + "?capacity=1MiB";
    }
    auto store = OpenStorage(url, TinyNamespace());
    if (store.ok()) continue;
    const std::string message = store.status().message();
    EXPECT_EQ(message.find("unknown scheme"), std::string::npos) << url << ": " << message;
    if (s.open == nullptr) {
      EXPECT_NE(message.find(std::string(s.missing)), std::string::npos) << url << ": " << message;
    } else {
      EXPECT_EQ(s.form, StorageUrlForm::kHosts) << url << " should open: " << message;
    }
  }
  std::filesystem::remove_all(dir);
  auto unknown = OpenStorage("s3://bucket/x", TinyNamespace());
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown scheme 's3'"), std::string::npos);
  EXPECT_NE(unknown.status().message().find(StorageSchemeList()), std::string::npos);
}

// Where a URL's credentials end follows the row's form.
TEST(StorageSchemesTest, RedactionFollowsTheForm) {
  for (const StorageScheme& s : StorageSchemes()) {
    const std::string url = std::string(s.name) + "://:pa/ss@host:1?x=1";
    const std::string redacted = RedactUrl(url);
    if (s.form == StorageUrlForm::kHosts) {
      EXPECT_EQ(redacted, std::string(s.name) + "://***@host:1?x=1") << url;
    } else {
      // A path form's user info ends at the first '/': ":pa" holds no '@', so nothing is hidden.
      EXPECT_EQ(redacted, url) << url;
    }
  }
}

}  // namespace
}  // namespace kvtier
