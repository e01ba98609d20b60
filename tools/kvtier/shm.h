// tools/kvtier/shm.h — `kvtier shm create|inspect|destroy NAME`: manage a shared host tier (a
// POSIX shared-memory segment that several engine processes attach; kvtier/shared_host_pool.h).
//
// Thread safety: used from main's one thread.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvtier::tools {

// Registers `shm` and its three subcommands on `app`; after parsing, Run() the one given.
class ShmCommand {
 public:
  explicit ShmCommand(CLI::App& app);
  ShmCommand(const ShmCommand&) = delete;
  ShmCommand& operator=(const ShmCommand&) = delete;

  bool parsed() const;
  // Returns the process exit code: 0 done, 1 the operation failed (or --check found a broken
  // invariant), 2 bad arguments.
  int Run() const;

 private:
  int RunCreate() const;
  int RunInspect() const;
  int RunDestroy() const;

  CLI::App* shm_ = nullptr;
  CLI::App* create_ = nullptr;
  CLI::App* inspect_ = nullptr;
  CLI::App* destroy_ = nullptr;

  std::string name_;
  // create
  std::string layout_ = "page_first";
  bool mla_ = false;
  int64_t layers_ = 0;
  int64_t slot_bytes_ = 0;
  int64_t page_size_ = 16;
  int64_t heads_ = 1;
  std::string capacity_;
  int64_t pages_ = 0;
  bool huge_pages_ = false;
  std::string group_;
  int max_processes_ = 64;
  // inspect
  bool json_ = false;
  bool check_ = false;
};

}  // namespace kvtier::tools
