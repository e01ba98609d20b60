// tools/kvtier/demo.h — `kvtier demo`: the first thing to run. `kvtier replay` on the shipped
// Mooncake conversation trace with embedded defaults: the GPU when one is present (else host
// memory standing in for it), a temporary file store, and capacities small enough that every tier
// gets hits; every loaded byte is checked. Finishes in well under a minute on 2 cores.
//
// Thread safety: RunDemo is called once from main.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier::tools {

struct DemoOptions {
  int64_t requests = 0;  // 0: the demo's default (a prefix of the trace)
  std::string device = "auto";
  std::string json_path;
  std::string plot_path;
  std::string command_line;
};

// Runs the demo and returns the process exit code (0 when every byte checked out).
int RunDemo(const DemoOptions& options);

}  // namespace kvtier::tools
