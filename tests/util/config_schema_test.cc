// Every bound of the two config schemas is what Validate enforces: for each numeric field, the
// bound itself is accepted and the value just outside it is refused with a message naming the
// field; choices outside the list are refused; defaults are inside every bound.
#include "kvtier/config_schema.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/transfer.h"

namespace kvtier {
namespace {

// `base` with field f set to `value` (an int64 for integer fields, a double for floats).
template <typename Config>
Config WithInt(Config base, const ConfigField<Config>& f, int64_t value) {
  f.set_int(base, value);
  return base;
}
template <typename Config>
Config WithFloat(Config base, const ConfigField<Config>& f, double value) {
  f.set_float(base, value);
  return base;
}

// The fields of `schema` that `which` selects, each varied alone from `base` (a valid config
// where those fields are checked: the cache's storage fields need a storage tier).
template <typename Config>
void ExpectBoundsEnforced(const ConfigSchema<Config>& schema, const Config& base,
                          const std::function<bool(const ConfigField<Config>&)>& which = nullptr) {
  ASSERT_TRUE(base.Validate().ok()) << base.Validate().ToString();
  std::set<std::string> names;
  for (const ConfigField<Config>& f : schema) {
    SCOPED_TRACE(f.name);
    EXPECT_TRUE(names.insert(f.name).second) << "declared twice";
    EXPECT_FALSE(f.help.empty());
    if (which && !which(f)) continue;
    if (f.checked_when) {
      ASSERT_TRUE(f.checked_when(base));
    }
    auto refused = [&](const Config& c) {
      const Status st = c.Validate();
      EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
      EXPECT_EQ(st.message().rfind(f.name + " = ", 0), 0u) << st.message();
      EXPECT_NE(st.message().find(f.RangeText()), std::string::npos) << st.message();
    };
    switch (f.kind) {
      case FieldKind::kInt: {
        ASSERT_LE(f.int_min, f.int_max);
        EXPECT_TRUE(f.CheckInt(f.get_int(base), f.name).ok()) << "default out of bounds";
        // page_size's values between the bounds follow the page-size rule as well (0 and the
        // powers of two); its bounds themselves are valid page sizes.
        EXPECT_TRUE(WithInt(base, f, f.int_min).Validate().ok());
        EXPECT_TRUE(WithInt(base, f, f.int_max).Validate().ok());
        refused(WithInt(base, f, f.int_min - 1));  // every lower bound is >= 0
        // Values past the C++ type cannot be stored; inside it, one past the bound is refused.
        if (f.int_max < std::numeric_limits<int64_t>::max()) {
          const Config over = WithInt(base, f, f.int_max + 1);
          if (f.get_int(over) == f.int_max + 1) refused(over);
        }
        break;
      }
      case FieldKind::kFloat: {
        EXPECT_TRUE(f.CheckFloat(f.get_float(base), f.name).ok()) << "default out of bounds";
        if (f.min_exclusive) {
          refused(WithFloat(base, f, f.float_min));
          EXPECT_TRUE(WithFloat(base, f, std::nextafter(f.float_min, f.float_max)).Validate().ok());
        } else {
          EXPECT_TRUE(WithFloat(base, f, f.float_min).Validate().ok());
          refused(WithFloat(base, f, std::nextafter(f.float_min, -INFINITY)));
        }
        EXPECT_TRUE(WithFloat(base, f, f.float_max).Validate().ok());
        refused(WithFloat(base, f, std::nextafter(f.float_max, INFINITY)));
        refused(WithFloat(base, f, std::nan("")));
        refused(WithFloat(base, f, INFINITY));
        break;
      }
      case FieldKind::kChoice: {
        ASSERT_FALSE(f.choices.empty());
        for (size_t i = 0; i < f.choices.size(); ++i) {
          const Config c = WithInt(base, f, static_cast<int64_t>(i));
          EXPECT_EQ(f.ValueText(c), f.choices[i]);
          // transfer_backend: GPU backends validate as a config (Create may still refuse them).
          EXPECT_TRUE(c.Validate().ok()) << f.choices[i];
        }
        const Config bad = WithInt(base, f, static_cast<int64_t>(f.choices.size()));
        const Status st = bad.Validate();
        EXPECT_TRUE(st.IsInvalidArgument());
        EXPECT_NE(st.message().find(f.name), std::string::npos) << st.message();
        break;
      }
      case FieldKind::kBool:
        EXPECT_TRUE(WithInt(base, f, 0).Validate().ok());
        EXPECT_TRUE(WithInt(base, f, 1).Validate().ok());
        break;
      case FieldKind::kString:
        break;
    }
  }
}

TEST(ConfigSchemaTest, TransferEngineConfigBoundsAreValidated) {
  ExpectBoundsEnforced(TransferEngineConfigSchema(), TransferEngineConfig{});
  // Every field of the struct is in the schema (16 today: a new field must be declared there).
  EXPECT_EQ(TransferEngineConfigSchema().size(), 16u);
  EXPECT_EQ(FindField(TransferEngineConfigSchema(), "dma_ops_per_lane")->int_min, 16);
}

TEST(ConfigSchemaTest, CacheConfigBoundsAreValidated) {
  using Field = ConfigField<HierarchicalCacheConfig>;
  // Without a storage tier (host_ratio 0 is then valid: no host tier) ...
  ExpectBoundsEnforced<HierarchicalCacheConfig>(
      HierarchicalCacheConfigSchema(), HierarchicalCacheConfig{},
      [](const Field& f) { return f.when.empty() || f.name == "host_ratio"; });
  // ... and the storage fields with one (tp_size at its largest so any tp_rank is below it).
  HierarchicalCacheConfig base;
  base.storage.url = "memory://";
  base.storage.tp_size = FindField(HierarchicalCacheConfigSchema(), "storage_tp_size")->int_max;
  ExpectBoundsEnforced<HierarchicalCacheConfig>(
      HierarchicalCacheConfigSchema(), base,
      [](const Field& f) { return !f.when.empty() && f.name != "host_ratio"; });
  // The transfer engine's fields are the transfer schema's, reached through `transfer`.
  for (const auto& t : TransferEngineConfigSchema()) {
    const auto* f = FindField(HierarchicalCacheConfigSchema(), t.name);
    ASSERT_NE(f, nullptr) << t.name;
    EXPECT_EQ(f->int_min, t.int_min);
    EXPECT_EQ(f->int_max, t.int_max);
  }
}

TEST(ConfigSchemaTest, StorageFieldsAreIgnoredWithoutAStorageTier) {
  HierarchicalCacheConfig c;
  c.storage.max_backup_batch_pages = 0;
  EXPECT_TRUE(c.Validate().ok());
  c.storage.url = "memory://";
  EXPECT_NE(c.Validate().message().find("max_backup_batch_pages = 0 must be in [1, "),
            std::string::npos)
      << c.Validate().message();
  EXPECT_TRUE(c.storage.Validate().IsInvalidArgument());
}

TEST(ConfigSchemaTest, DefaultsAreTheStructs) {
  const auto& s = HierarchicalCacheConfigSchema();
  const HierarchicalCacheConfig d;
  EXPECT_EQ(FindField(s, "write_policy")->ValueText(d), "write_through_selective");
  EXPECT_EQ(FindField(s, "max_backup_batch_pages")->get_int(d), 256);
  EXPECT_EQ(FindField(s, "storage_timeout_ms")->get_int(d), 2000);
  EXPECT_EQ(FindField(s, "dma_ops_per_lane")->get_int(d), 256);
  EXPECT_EQ(FindField(s, "host_ratio")->get_float(d), 2.0);
}

TEST(ConfigSchemaTest, RulesBetweenFieldsUseTheCallersNames) {
  const FieldNamer flags = [](std::string_view f) {
    std::string s = "--" + std::string(f);
    for (char& ch : s) ch = ch == '_' ? '-' : ch;
    return s;
  };
  HierarchicalCacheConfig c;
  c.page_size = 48;  // within [0, 256], not a power of two: the geometry's page-size rule
  Status st = c.Validate(flags);
  EXPECT_EQ(st.message(), "--page-size = 48 must be a power of two in [1, 256]");
  c.page_size = 512;
  EXPECT_EQ(c.Validate(flags).message(), "--page-size = 512 must be in [0, 256]");
  c.page_size = 0;
  c.transfer.dma_ops_per_lane = 1;
  EXPECT_EQ(c.Validate(flags).message(), "--dma-ops-per-lane = 1 must be in [16, 1048576]");
  c.transfer.dma_ops_per_lane = 16;
  c.storage.url = "memory://";
  c.storage.tp_rank = 2;
  c.storage.tp_size = 2;
  EXPECT_EQ(c.Validate(flags).message(),
            "--storage-tp-rank = 2 must be below --storage-tp-size = 2");
  c.storage.tp_rank = 0;
  c.host_ratio = 0;
  EXPECT_NE(c.Validate(flags).message().find("--host-capacity-bytes = 0 and --host-ratio = 0"),
            std::string::npos);
}

TEST(ConfigSchemaTest, PageSizeRuleLivesInTheGeometry) {
  KvGeometry g{KvLayout::kLayerFirst, 2, 96, 8, 3, 1};
  EXPECT_EQ(g.Validate("pool").message(), "pool.page_size = 3 must be a power of two in [1, 256]");
  g.page_size = 512;
  g.num_slots = 1024;
  EXPECT_EQ(g.Validate("pool").message(),
            "pool.page_size = 512 must be a power of two in [1, 256]");
  for (int64_t p = 1; p <= kMaxKvPageSize; p *= 2) {
    g.page_size = p;
    g.num_slots = 1024;
    EXPECT_TRUE(g.Validate().ok()) << p;
    EXPECT_TRUE(ValidatePageSize(p).ok());
  }
  EXPECT_FALSE(ValidatePageSize(0).ok());
}

}  // namespace
}  // namespace kvtier
