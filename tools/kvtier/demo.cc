// `kvtier demo` (see demo.h): replay with embedded defaults.
#include "demo.h"

#include <cstdio>

#include "kvtier/device.h"
#include "replay.h"

namespace kvtier::tools {

int RunDemo(const DemoOptions& options) {
  const bool gpu = options.device == "gpu" || (options.device == "auto" && CudaDeviceCount() > 0);
  ReplayOptions o;
  o.label = "kvtier demo";
  o.command_line = options.command_line;
  o.workload = "mooncake";
  o.device = gpu ? "gpu" : "cpu";
  // On a GPU: Llama-3-8B's KV (128 KiB per token) and real GEMMs; on cpu a small model's KV
  // (Qwen2.5-0.5B, 12 KiB per token) keeps the bytes every check touches within a few GB.
  o.model = gpu ? "llama3-8b" : "qwen2.5-0.5b";
  o.compute = gpu ? "gemm" : "model";
  o.requests = options.requests > 0 ? options.requests : (gpu ? 2000 : 400);
  // Open loop at 4x the trace's pace: the device-only cache keeps the system prompt and the
  // hottest conversations, host memory the recent ones, the file store everything.
  o.speed = 4;
  o.device_tokens = gpu ? 65536 : 16384;
  o.host_tokens = 4 * o.device_tokens;
  o.storage = "file";
  o.write_policy = "write_through";
  o.prefetch_policy = "wait_complete";
  o.json_path = options.json_path;
  o.plot_path = options.plot_path;
  std::printf("kvtier demo: `kvtier replay` on the shipped Mooncake conversation trace through "
              "device, host and storage tiers, every loaded byte checked. (`kvtier replay "
              "--help` for the knobs.)\n\n");
  return RunReplay(o);
}

}  // namespace kvtier::tools
