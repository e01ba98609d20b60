// tools/replay/replay_tp_report.h — what `kvtier replay --tp N` measured in one pass (TP=1, then
// TP=N) and its report: the table it prints and its --json (see replay_tp.h, docs/tp.md).
//
// Thread safety: plain values and functions, used by the replay's one thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"
#include "kvtier/tp_group.h"

namespace kvtier::tools {

// The leader cache's calls that the decision time covers (TpPassResult::call_cpu_ms).
enum class TpCall : int {
  kMatch,
  kQueryStorage,
  kPrefetch,
  kLoadBack,
  kAllocate,
  kInsert,
  kRelease
};
inline constexpr int kTpCalls = 7;
inline constexpr const char* kTpCallNames[kTpCalls] = {
    "match", "query_storage", "prefetch", "load_back", "allocate", "insert", "release"};

// Where a rank ran: GPU r's PCI bus id and NUMA node, the NUMA node of its host pool (its first
// page) and of its thread's CPU, its GPU's host -> device ceiling (one large copy, measured when
// its engine was made). -1 / "" / 0 where unknown (the cpu device has no GPU).
struct TpPlacement {
  int gpu = -1;  // CUDA ordinal; -1: cpu device
  std::string pci_bus_id;
  int gpu_numa_node = -1;
  int host_numa_node = -1;
  int cpu_numa_node = -1;
  double ceiling_gbps = 0;
};
// CUDA's PCI bus id of `device` in sysfs's form ("0000:18:00.0"); "" without CUDA or on error.
std::string GpuPciBusId(int device);
// /sys/bus/pci/devices/<bus_id>/numa_node; -1 when unknown.
int PciNumaNode(const std::string& bus_id);
// The NUMA node of the (touched) page at `p`; -1 when unknown.
int MemoryNumaNode(const void* p);
// The NUMA node of the CPU the calling thread runs on; -1 when unknown.
int CpuNumaNode();

struct TpPassResult {
  int tp = 1;
  int64_t requests = 0, prompt_tokens = 0, device_hit = 0, host_hit = 0, storage_hit = 0;
  int64_t loaded = 0;
  int64_t bytes_checked = 0;  // rank 0's
  std::vector<double> ttft_ms;
  double slowest_rank_excess_ms = 0;  // summed: slowest rank's prefill minus rank 0's
  double wall_s = 0;
  // Per request, on rank 0: time in the cache's calls (Match, QueryStorage, Prefetch, LoadBack,
  // AllocateDeviceSlots, Insert, Release) less the time in the engine the cache was given —
  // the cache's decisions; the group's part of that engine time (publishing on the ring and
  // waiting for the ranks to apply: TP > 1 only); rank 0's own copies.
  std::vector<double> decide_ms, group_ms, copy_ms;
  // The decisions in the thread's CPU time: the calls' less rank 0's own copies' — including
  // the group's part that the thread runs (records, publishing, waking and waiting for ranks).
  std::vector<double> decide_cpu_ms;
  // decide_cpu_ms split by call (TpCall), summed over the measured requests: which call a TP
  // size makes dearer.
  double call_cpu_ms[kTpCalls] = {};
  double storage_wait_s = 0;  // FinishPrefetch: waiting for storage reads (every rank's)
  // Each rank's loads (host -> device copies) of the measured requests: the bytes it moved, the
  // device time of its own copies to completion (GPU: CUDA events on its load stream around
  // each copy; cpu: the synchronous copy's wall time), the number of copies.
  std::vector<int64_t> load_bytes;
  std::vector<double> load_seconds;
  std::vector<int64_t> loads;
  // Per rank: the median of its loads' GB/s, each copy's own (noise of one copy counts once).
  std::vector<double> load_gbps_median;
  std::vector<TpPlacement> placement;  // per rank
  TpLeaderStats ring;
  CacheStats cache;  // rank 0's cache at the end
  // The settings rank 0's cache was created with (TpCacheSettingsOf).
  std::vector<std::pair<std::string, std::string>> cache_settings;
};

// Every field of HierarchicalCacheConfigSchema in `c`: {name, ValueText}, in schema order.
std::vector<std::pair<std::string, std::string>> TpCacheSettingsOf(
    const HierarchicalCacheConfig& c);

// The run the passes belong to, for the report's header and JSON.
struct TpRunInfo {
  int tp = 1;
  std::string workload, model, io, command_line;
  std::string json_path;  // empty: no JSON
  int64_t warmup = 0;
  bool mla = false, gpu = false, storage = false;
};

// The q-quantile (0..1) of `v`; 0 when empty.
double TpPercentile(std::vector<double> v, double q);

// Prints the two passes side by side (hits, TTFT, the decision ring, the leader's decision time
// and waits, collectives, each rank's load bytes, copies, bytes per copy and bandwidth against
// TP=1's) and writes the JSON when
// info.json_path is set. Whether the hit counts are equal; IOError when the JSON cannot be
// written.
// `tp1_shard` (may be null): TP=1 with one rank's share of the KV heads (--tp-equal-bytes), the
// load bandwidth baseline at equal bytes per copy; its hits count in the comparison too.
// `own_gpu` (empty, or one per rank): rank r's baseline, a TP=1 pass on rank r's GPU at rank r's
// bytes per copy (MHA: 1/N of the heads; MLA: the whole latent); their hits count too.
Result<bool> ReportTpPasses(const TpRunInfo& info, const TpPassResult& tp1, const TpPassResult& tpn,
                            const TpPassResult* tp1_shard = nullptr,
                            const std::vector<const TpPassResult*>& own_gpu = {});

}  // namespace kvtier::tools
