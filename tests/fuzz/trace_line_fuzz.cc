// libFuzzer target over the Mooncake trace line parser (tools/replay/workload.h,
// ParseMooncakeTraceLine), the parser `kvtier replay --workload FILE` runs on every line.
//
// Properties checked on every input (one line, as the loader hands it over):
//   1. no crash, out-of-bounds access or undefined behaviour (ASan/UBSan), bounded work;
//   2. a request it accepts is valid: 1 <= input_length <= 2^24, one hash id >= 0 per 512-token
//      block, a finite timestamp >= 0, output_length >= 0;
//   3. an error names the line ("where:" starts the message).
// Any violation aborts (a finding). Run: build-fuzz/tests/fuzz/kvtier_fuzz_trace_line
// -max_total_time=30
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "workload.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace tools = kvtier::tools;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  kvtier::Result<tools::WorkloadRequest> r = tools::ParseMooncakeTraceLine(line, "fuzz:1");
  if (!r.ok()) {
    Check(r.status().message().starts_with("fuzz:1: "));
    return 0;
  }
  Check(r->input_length >= 1 && r->input_length <= (int64_t{1} << 24));
  Check(r->output_length >= 0);
  Check(std::isfinite(r->arrival_ms) && r->arrival_ms >= 0);
  const int64_t blocks = (r->input_length + tools::kBlockTokens - 1) / tools::kBlockTokens;
  Check(static_cast<int64_t>(r->hash_ids.size()) == blocks);
  for (int64_t id : r->hash_ids) Check(id >= 0);
  return 0;
}
