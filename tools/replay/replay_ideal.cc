// The ideal of a replay run (see replay_ideal.h).
#include "replay_ideal.h"

#include <algorithm>

namespace kvtier::tools {

std::vector<double> IdealTtft(Timeline timeline, const std::vector<RequestRecord>& records,
                              int64_t kv_bytes_per_token, double pcie, double storage) {
  std::vector<double> out(records.size());
  const double token_bytes = static_cast<double>(kv_bytes_per_token);
  for (size_t i = 0; i < records.size(); ++i) {
    const RequestRecord& r = records[i];
    const int64_t at = static_cast<int64_t>(i);
    const double copy_ms =
        static_cast<double>(r.host_hit + r.storage_hit) * token_bytes / pcie * 1e3;
    const double read_ms =
        storage > 0 ? static_cast<double>(r.storage_hit) * token_bytes / storage * 1e3 : 0;
    const double hidden_ms =
        std::max(timeline.StartOf(at) - timeline.Arrival(at), r.prefetch_lead_ms);
    const double load_ms = std::max(copy_ms, read_ms - hidden_ms);
    const double end = timeline.Serve(at, std::max(r.compute_ms, load_ms));
    out[i] = end - timeline.Arrival(at);
  }
  return out;
}

}  // namespace kvtier::tools
