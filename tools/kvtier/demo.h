// tools/kvtier/demo.h — `kvtier demo`: a short, self-checking tour of the transfer path.
//
// Thread safety: RunDemo is called once from main.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier::tools {

struct DemoOptions {
  int64_t tokens = 2048;         // tokens backed up and loaded back
  std::string backend = "best";  // best, cpu, kernel, dma, auto
  uint64_t seed = 7;
};

// Runs the demo and returns the process exit code (0 when every byte checked out).
int RunDemo(const DemoOptions& options);

}  // namespace kvtier::tools
