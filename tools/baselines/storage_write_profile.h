// tools/baselines/storage_write_profile.h — a store's Set phases (StorageStats' set_*_seconds,
// filled by the file store's WriteProfile) as the tools write them in JSON: one name per phase, in
// the order a Set page runs them. `kvtier bench --storage` and `kvtier replay` both use it, so a
// phase added to StorageStats is added here once.
#pragma once

#include <nlohmann/json.hpp>

#include "kvtier/storage.h"

namespace kvtier::tools {

// {"open": s, "copy": s, "checksum": s, "write": s, "fsync": s, "stamp_rename": s, "index": s,
//  "unlink": s, "open_dir": s}: seconds summed over the profiled pages
//  (StorageStats::set_profiled_pages); the phases add up to the pages' time but "open_dir", which
//  is the part of "open" spent opening the page's directory.
inline nlohmann::json SetPhaseSecondsJson(const StorageStats& st) {
  return {{"open", st.set_open_seconds},        {"copy", st.set_copy_seconds},
          {"checksum", st.set_hash_seconds},    {"write", st.set_write_seconds},
          {"fsync", st.set_sync_seconds},       {"stamp_rename", st.set_publish_seconds},
          {"index", st.set_index_seconds},      {"unlink", st.set_unlink_seconds},
          {"open_dir", st.set_open_dir_seconds}};
}

}  // namespace kvtier::tools
