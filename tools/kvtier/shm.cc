// tools/kvtier/shm.cc — `kvtier shm create|inspect|destroy NAME` (see shm.h).
//
// Thread safety: used from main's one thread.
#include "shm.h"

#include <fmt/format.h>
#include <grp.h>

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "kvtier/shared_host_pool.h"

namespace kvtier::tools {

namespace {

// "4096", "64K", "512M", "2G", "1T" (binary units) -> bytes.
Result<int64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return Status::InvalidArgument("--capacity is empty");
  size_t used = 0;
  long double value = 0;
  try {
    value = std::stold(text, &used);
  } catch (...) {
    return Status::InvalidArgument(fmt::format("--capacity '{}' is not a size", text));
  }
  const std::string unit = text.substr(used);
  long double scale = 1;
  if (unit == "K" || unit == "KiB") {
    scale = 1024.0L;
  } else if (unit == "M" || unit == "MiB") {
    scale = 1024.0L * 1024;
  } else if (unit == "G" || unit == "GiB") {
    scale = 1024.0L * 1024 * 1024;
  } else if (unit == "T" || unit == "TiB") {
    scale = 1024.0L * 1024 * 1024 * 1024;
  } else if (!unit.empty() && unit != "B") {
    return Status::InvalidArgument(
        fmt::format("--capacity '{}': unknown unit '{}' (use K, M, G or T)", text, unit));
  }
  const long double bytes = value * scale;
  if (!(bytes >= 1) || bytes >= 9.2e18L) {
    return Status::InvalidArgument(fmt::format("--capacity '{}' is out of range", text));
  }
  return static_cast<int64_t>(bytes);
}

// An integer option in [lo, hi]; CLI11 prefixes the message with the option's name.
CLI::Validator IntegerIn(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || v < lo || v > hi) {
          return fmt::format("{} is not an integer in [{}, {}]", text, lo, hi);
        }
        return std::string();
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

// Bounds of `shm create` (a segment's index and pages must stay far from int64 overflow).
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxSlotBytes = int64_t{1} << 30;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxPages = int64_t{1} << 40;

// A group name or a numeric group id.
Result<int64_t> ParseGroup(const std::string& text) {
  if (!text.empty() && std::all_of(text.begin(), text.end(), ::isdigit)) {
    return static_cast<int64_t>(std::strtoll(text.c_str(), nullptr, 10));
  }
  group* g = getgrnam(text.c_str());
  if (g == nullptr) return Status::InvalidArgument(fmt::format("--group '{}' is no group", text));
  return static_cast<int64_t>(g->gr_gid);
}

std::string HumanBytes(int64_t bytes) {
  if (bytes < (int64_t{1} << 20)) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  if (bytes < (int64_t{1} << 30)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
}

void PrintInfo(const SharedHostPoolInfo& info) {
  const KvGeometry& g = info.geometry;
  std::printf("segment    %s (%s), %s, %s\n", info.name.c_str(), info.path.c_str(),
              HumanBytes(info.segment_bytes).c_str(),
              info.huge_pages ? "huge pages" : "normal pages");
  std::printf("geometry   %s, %s, %lld layers, slot_bytes %lld, page_size %lld, head_num %lld\n",
              LayoutName(g.layout), info.mla ? "MLA" : "K+V", static_cast<long long>(g.num_layers),
              static_cast<long long>(g.slot_bytes), static_cast<long long>(g.page_size),
              static_cast<long long>(g.head_num));
  std::printf(
      "pages      %lld of %s: %lld empty, %lld writing, %lld ready (%lld pinned, %lld "
      "unreachable)\n",
      static_cast<long long>(info.num_pages), HumanBytes(info.page_bytes).c_str(),
      static_cast<long long>(info.empty_pages), static_cast<long long>(info.writing_pages),
      static_cast<long long>(info.ready_pages), static_cast<long long>(info.pinned_pages),
      static_cast<long long>(info.unreachable_pages));
  std::printf(
      "history    clock %llu; %lld evictions (%lld of a page with a resident child); %lld lock "
      "recoveries; %lld dead processes reaped, %lld of their writing pages reclaimed, %lld of "
      "their references dropped\n",
      static_cast<unsigned long long>(info.clock), static_cast<long long>(info.evictions),
      static_cast<long long>(info.evictions_with_children),
      static_cast<long long>(info.lock_recoveries), static_cast<long long>(info.reaped_processes),
      static_cast<long long>(info.reclaimed_writing_pages),
      static_cast<long long>(info.dropped_refs));
  std::printf("processes  %zu attached (at most %d), this one included\n", info.processes.size(),
              info.max_processes);
  std::printf("  %-6s %-10s %-6s %-11s %-12s %-13s\n", "record", "pid", "alive", "pinned_refs",
              "pinned_pages", "writing_pages");
  for (const auto& p : info.processes) {
    std::printf("  %-6d %-10lld %-6s %-11lld %-12lld %-13lld%s\n", p.slot,
                static_cast<long long>(p.pid), p.alive ? "yes" : "no",
                static_cast<long long>(p.pinned_refs), static_cast<long long>(p.pinned_pages),
                static_cast<long long>(p.writing_pages), p.is_caller ? "  (kvtier shm)" : "");
  }
}

nlohmann::json InfoJson(const SharedHostPoolInfo& info) {
  nlohmann::json j;
  j["name"] = info.name;
  j["path"] = info.path;
  j["segment_bytes"] = info.segment_bytes;
  j["huge_pages"] = info.huge_pages;
  j["layout"] = LayoutName(info.geometry.layout);
  j["mla"] = info.mla;
  j["num_layers"] = info.geometry.num_layers;
  j["slot_bytes"] = info.geometry.slot_bytes;
  j["page_size"] = info.geometry.page_size;
  j["head_num"] = info.geometry.head_num;
  j["num_pages"] = info.num_pages;
  j["page_bytes"] = info.page_bytes;
  j["empty_pages"] = info.empty_pages;
  j["writing_pages"] = info.writing_pages;
  j["ready_pages"] = info.ready_pages;
  j["pinned_pages"] = info.pinned_pages;
  j["unreachable_pages"] = info.unreachable_pages;
  j["clock"] = info.clock;
  j["evictions"] = info.evictions;
  j["evictions_with_children"] = info.evictions_with_children;
  j["lock_recoveries"] = info.lock_recoveries;
  j["reaped_processes"] = info.reaped_processes;
  j["reclaimed_writing_pages"] = info.reclaimed_writing_pages;
  j["dropped_refs"] = info.dropped_refs;
  j["max_processes"] = info.max_processes;
  nlohmann::json& procs = j["processes"] = nlohmann::json::array();
  for (const auto& p : info.processes) {
    procs.push_back({{"record", p.slot},
                     {"pid", p.pid},
                     {"start_time", p.start_time},
                     {"alive", p.alive},
                     {"is_caller", p.is_caller},
                     {"pinned_refs", p.pinned_refs},
                     {"pinned_pages", p.pinned_pages},
                     {"writing_pages", p.writing_pages}});
  }
  return j;
}

}  // namespace

ShmCommand::ShmCommand(CLI::App& app) {
  shm_ = app.add_subcommand(
      "shm", "Create, inspect or remove a host tier shared by several engine processes");
  shm_->require_subcommand(1);
  shm_->footer(
      "A shared host tier is a POSIX shared-memory segment (/dev/shm/kvtier.NAME) holding KV "
      "pages and a crash-safe page index; engine processes on this machine attach it by name.");

  create_ = shm_->add_subcommand("create", "Create a segment of a given size and geometry");
  create_->add_option("name", name_, "segment name (A-Z a-z 0-9 . _ -)")->required();
  create_->add_option("--layout", layout_, "host layout of the pages")
      ->check(CLI::IsMember({"layer_first", "page_first", "page_first_direct", "page_head"}))
      ->capture_default_str();
  create_->add_flag("--mla", mla_, "one buffer per page (MLA) instead of K and V");
  create_->add_option("--layers", layers_, "layers of the model")
      ->required()
      ->check(IntegerIn(1, kMaxLayers));
  create_
      ->add_option("--slot-bytes", slot_bytes_,
                   "bytes of one token in one layer of one buffer (a multiple of 4)")
      ->required()
      ->check(IntegerIn(1, kMaxSlotBytes));
  create_->add_option("--page-size", page_size_, "tokens per page (a power of two, 1..256)")
      ->check(IntegerIn(1, 256))
      ->capture_default_str();
  create_->add_option("--heads", heads_, "heads in slot_bytes (page_head splits by head)")
      ->check(IntegerIn(1, kMaxHeads))
      ->capture_default_str();
  auto* capacity = create_->add_option(
      "--capacity", capacity_, "page bytes of all buffers, e.g. 64G (rounded down to pages)");
  auto* pages =
      create_->add_option("--pages", pages_, "number of pages")->check(IntegerIn(1, kMaxPages));
  capacity->excludes(pages);
  create_->add_flag("--huge-pages", huge_pages_,
                    "use a hugetlbfs mount when there is one with room (else /dev/shm)");
  create_->add_option("--group", group_,
                      "let this group (name or id) attach too: mode 0660 instead of 0600");
  create_->add_option("--max-processes", max_processes_, "processes attached at once, at most")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();

  inspect_ = shm_->add_subcommand(
      "inspect",
      "Show occupancy, page states, attached processes and their references (and release what "
      "dead processes held)");
  inspect_->add_option("name", name_, "segment name")->required();
  inspect_->add_flag("--json", json_, "print JSON instead of the table");
  inspect_->add_flag("--check", check_,
                     "also check every invariant of the page index; exit 1 if one is broken");

  destroy_ = shm_->add_subcommand(
      "destroy", "Remove the segment's name (attached processes keep their mapping)");
  destroy_->add_option("name", name_, "segment name")->required();
}

bool ShmCommand::parsed() const { return shm_->parsed(); }

int ShmCommand::Run() const {
  if (create_->parsed()) return RunCreate();
  if (inspect_->parsed()) return RunInspect();
  if (destroy_->parsed()) return RunDestroy();
  return 2;
}

int ShmCommand::RunCreate() const {
  SharedHostPoolConfig config;
  config.name = name_;
  Result<KvLayout> layout = ParseLayout(layout_);
  Status bad = layout.status();
  if (layout.ok()) config.geometry.layout = *layout;
  config.mla = mla_;
  config.geometry.num_layers = layers_;
  config.geometry.slot_bytes = slot_bytes_;
  config.geometry.page_size = page_size_;
  config.geometry.head_num = heads_;
  config.huge_pages = huge_pages_;
  config.max_processes = max_processes_;
  config.register_with_cuda = false;  // this process only creates it
  // A page size no cache can use would make a segment nobody can attach.
  if (bad.ok()) bad = ValidatePageSize(page_size_, "--page-size");
  if (bad.ok() && !capacity_.empty()) {
    Result<int64_t> bytes = ParseBytes(capacity_);
    if (bytes.ok()) config.capacity_bytes = *bytes;
    bad = bytes.status();
  } else if (bad.ok() && pages_ > 0) {
    config.geometry.num_slots = pages_ * page_size_;
  } else if (bad.ok()) {
    bad = Status::InvalidArgument("give the size: --capacity BYTES or --pages N");
  }
  if (bad.ok() && !group_.empty()) {
    Result<int64_t> gid = ParseGroup(group_);
    if (gid.ok()) config.group_id = *gid;
    bad = gid.status();
  }
  if (bad.ok()) bad = config.Validate();
  if (!bad.ok()) {
    std::fprintf(stderr, "kvtier shm create: %s\n", bad.ToString().c_str());
    return 2;
  }
  auto pool = SharedHostPool::Create(config);
  if (!pool.ok()) {
    std::fprintf(stderr, "kvtier shm create: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  auto info = (*pool)->Inspect();
  if (!info.ok()) {
    std::fprintf(stderr, "kvtier shm create: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::printf("created %s: %lld pages of %s (%s in all) at %s, mode %s\n", name_.c_str(),
              static_cast<long long>(info->num_pages), HumanBytes(info->page_bytes).c_str(),
              HumanBytes(info->segment_bytes).c_str(), info->path.c_str(),
              config.group_id >= 0 ? "0660" : "0600");
  return 0;
}

int ShmCommand::RunInspect() const {
  SharedHostPoolAttachOptions options;
  options.register_with_cuda = false;
  auto pool = SharedHostPool::Attach(name_, options);
  if (!pool.ok()) {
    std::fprintf(stderr, "kvtier shm inspect: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  auto info = (*pool)->Inspect();
  if (!info.ok()) {
    std::fprintf(stderr, "kvtier shm inspect: %s\n", info.status().ToString().c_str());
    return 1;
  }
  Status invariants = check_ ? (*pool)->CheckInvariants() : Status::OK();
  if (json_) {
    nlohmann::json j = InfoJson(*info);
    if (check_) j["invariants"] = invariants.ok() ? "ok" : invariants.ToString();
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    PrintInfo(*info);
    if (check_)
      std::printf("invariants %s\n", invariants.ok() ? "ok" : invariants.ToString().c_str());
  }
  return invariants.ok() ? 0 : 1;
}

int ShmCommand::RunDestroy() const {
  Status s = SharedHostPool::Destroy(name_);
  if (!s.ok()) {
    std::fprintf(stderr, "kvtier shm destroy: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("removed %s\n", name_.c_str());
  return 0;
}

}  // namespace kvtier::tools
