// `kvtier demo` (see demo.h): replay with embedded defaults.
#include "demo.h"

#include <cstdio>

#include "kvtier/device.h"
#include "replay.h"

namespace kvtier::tools {

int RunDemo(const DemoOptions& options) {
  ReplayOptions o;
  o.label = "kvtier demo";
  o.command_line = options.command_line;
  o.workload = "mooncake";
  o.device = options.device;
  // The first 1,500 requests of the trace (20 M prompt tokens): enough turns of the same
  // conversations come back that every tier gets hits. Each token's KV is the tiny model's 8
  // bytes, so a 2-core machine writes, moves and checks all of it in seconds; the prefill is costed
  // as Llama-3-8B's (the cost model, at 400 TFLOP/s).
  o.requests = options.requests > 0 ? options.requests : 1500;
  o.model = "tiny";
  o.compute_model = "llama3-8b";
  o.compute = "model";
  o.cache.page_size = 256;
  // Open loop at a fifth of the trace's pace (one device serves a fifth of the traffic a cluster
  // served). The device tier holds the hottest prefixes, host memory 4x as many, and the
  // temporary file store everything the run writes.
  o.speed = 0.2;
  o.device_tokens = 1 << 20;
  o.host_tokens = 4 << 20;
  o.storage = "file";
  o.storage_bytes = int64_t{1} << 30;
  o.cache.write_policy = WritePolicy::kWriteThrough;
  o.cache.storage.prefetch_policy = PrefetchPolicy::kWaitComplete;
  o.json_path = options.json_path;
  o.plot_path = options.plot_path;
  std::printf(
      "kvtier demo: `kvtier replay` on the shipped Mooncake conversation trace through "
      "device, host and storage tiers, every loaded byte checked. (`kvtier replay "
      "--help` for the knobs.)\n\n");
  return RunReplay(o);
}

}  // namespace kvtier::tools
