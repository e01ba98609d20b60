// tools/replay/replay.h — `kvtier replay`: serve a workload through the whole hierarchy (device,
// host, storage) the way an engine's scheduler drives HierarchicalCache, check every loaded byte,
// and report what the cache saves.
//
// Per request, in the order the scheduler serves them:
//   arrival:  Match -> QueryStorage -> Prefetch (policy)          (storage I/O starts)
//   serve:    FinishPrefetch (the prefetch wait) -> LoadBack -> AllocateDeviceSlots for the new
//             whole pages -> prefill (per layer: WaitLayer, check the matched KV, compute, write
//             the new tokens' KV) -> Insert -> Release
// Scheduling: open loop (arrivals at the workload's timestamps / --speed), closed loop
// (--concurrency N requests in flight; with --decode-ms-per-token a request holds its place until
// its output is decoded) or --sequential (one at a time, in file order). The device serves one
// prefill at a time in arrival order; TTFT = queueing + prefetch wait + load + prefill,
// on a timeline built from the measured (or, for compute on cpu, modelled) durations. Storage hits
// are streamed (stream_load_back with a wait_complete or timeout prefetch: LoadBack ends the
// prefetch, so its wait on the read is inside the load), else the prefetch ends before the load.
//
// Three runs side by side in one invocation: no cache (every prompt computed), a device-only
// radix cache (no host tier, no storage: what engines have without a hierarchy) and the full
// hierarchy; plus the ideal of the hierarchy (its hits, every load at the measured ceiling and
// fully overlapped with compute, no prefetch wait: host hits at the host -> device ceiling,
// storage hits at the storage read ceiling, both measured at start, see replay_ceiling.h; a
// storage read begins when the run's prefetch began, at Match, so queueing hides part of it).
//
// Thread safety: RunReplay is called once from main.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"

namespace kvtier::tools {

// The cache settings of a replay before its flags: the cache's defaults, except where the replay
// has a reason of its own: SGLang's (page 64, write_through, wait_complete prefetches) and 4
// storage I/O threads (not the cache's 0, the machine's core count, so that a replay's numbers do
// not depend on it).
HierarchicalCacheConfig ReplayCacheDefaults();

struct ReplayOptions {
  // ---- workload ----
  // "mooncake" (the shipped conversation trace), a Mooncake JSONL file, or a synthetic kind:
  // "chat", "system-prompt", "doc-qa".
  std::string workload = "mooncake";
  int64_t requests = 0;  // 0: the whole trace / 1000 synthetic requests
  // Requests served first (one at a time, KV written and checked, nothing timed or recorded) to
  // fill the tiers; the report covers the `requests` after them.
  int64_t warmup = 0;
  // Trace workloads: requests of the trace left out before the warm-up ones, after --shard.
  int64_t skip = 0;
  // Trace workloads: "I/K" keeps the conversations a prefix-affinity router over K engines sends
  // to engine I (ShardWorkload); "" keeps all.
  std::string shard;
  uint64_t seed = 1;  // synthetic workloads
  double rate = 2.0;  // synthetic arrivals per second
  bool insert_output = false;

  // ---- scheduling ----
  int64_t concurrency = 0;  // > 0: closed loop with this many requests in flight
  double speed = 1.0;       // open loop: timestamps divided by this
  bool sequential = false;
  // Wait for every backup to storage to land after each request, before the next one is served
  // (an engine idle long enough for write-through): storage hits then do not depend on how fast
  // the store writes compared with the replay's modelled compute.
  bool settle_backups = false;
  int64_t max_inflight = 64;  // open loop: requests matched ahead of the one being served
  // Closed loops: how long a response's decode holds its client after the first token, in ms per
  // output token (the trace's output_length), or "measure" (the GPU GEMM engine times a decode
  // step of --concurrency tokens). "0": the next request follows the first token at once, so the
  // device does nothing but prefill. A client's next request arrives when its response is done,
  // as in SGLang's and vLLM's serving benchmarks with --max-concurrency.
  std::string decode_ms_per_token = "0";

  // ---- model and compute ----
  std::string model = "llama3-8b";
  // The model whose prefill the compute stands for ("" = --model): a small --model's KV with a
  // large model's compute keeps a long replay's bytes small on cpu.
  std::string compute_model;
  std::string compute = "auto";  // auto (gemm on a GPU, model on cpu), gemm, model
  double tflops = 400;           // the cost model's rate
  int64_t chunk_tokens = 8192;   // chunked prefill (SGLang's --chunked-prefill-size)
  std::string device = "auto";   // auto, gpu, cpu

  // ---- tiers ----
  // The cache's settings (page size, host layout, write / prefetch / eviction policies,
  // thresholds, storage admission, the store's options, the copy engine's fields, ...): one flag
  // per field of HierarchicalCacheConfigSchema, named as replay_options.h's ReplayCacheFlagNames
  // says (SGLang's --hicache-* names where they exist), bounded by the schema and checked by the
  // cache's own Validate. Fields the replay sets itself (capacities, the store, the device, backup
  // threads, pin budgets) have no flag (ReplaySetsCacheField). Defaults are the cache's, except
  // ReplayCacheDefaults' (replay_options.cc).
  HierarchicalCacheConfig cache = ReplayCacheDefaults();
  int64_t device_tokens = 131072;
  int64_t host_tokens = -1;        // -1: 4 x device_tokens; 0: no host tier
  bool host_tokens_given = false;  // --host-tokens was on the command line (then -1 is an error)
  // file (a temporary file store), redis (a redis-server the run starts on a free loopback port
  // and stops), none, or a storage URL. Needs a host tier (--host-tokens > 0) unless none.
  std::string storage = "file";
  int64_t storage_bytes = 0;  // capacity of the run's file store / redis; 0: 8 x the host's bytes
  // --shared-host NAME: the hierarchy's host tier is this shared segment (kvtier shm create),
  // shared with every process attached to it; no storage tier below it.
  std::string shared_host;
  std::string io_backend = "auto";  // --hicache-io-backend: auto (kernel on a GPU), kernel,
                                    // dma, cpu

  // ---- checks, faults, output ----
  std::string verify = "all";  // all, sample
  // "storage-down@SECONDS" (--storage redis: the server is stopped), or "storage-delay@MS": every
  // storage call waits MS first, from the start (a slow store).
  std::string fault;
  std::string json_path;
  std::string plot_path;
  std::string sweep;  // "host-tokens=A,B,C"
  // --kv-events ENDPOINT: the hierarchy run publishes its KV events there (kvtier/kv_events.h;
  // bound when it has '*', else connected, as vLLM does), with a replay socket bound at
  // --kv-events-replay and every message under --kv-events-topic.
  std::string kv_events;
  std::string kv_events_replay;
  std::string kv_events_topic;
  double kv_events_hold_s = 0;  // --kv-events-hold: sockets stay open this long after the run
  // --pin-system-prompt TIERS: the hierarchy run pins the prefix every request shares in these
  // tiers ("device,host,storage" or "all"; replay_pin.h), for --pin-ttl seconds (0: the run).
  std::string pin_system_prompt;
  double pin_ttl_s = 0;
  bool metrics = false;
  bool progress = true;
  // Runs to make: "all" (no cache, device-only, hierarchy), "no_cache,hierarchy" or "hierarchy".
  std::string runs = "all";
  // A hit class (device / host / storage / none) whose TTFT is slower than no cache for the same
  // requests beyond noise (its bootstrap interval above 1 + slow_class_margin) fails the run
  // (exit code 3), or with slow_class_warn only prints a warning.
  double slow_class_margin = 0.05;
  bool slow_class_warn = false;
  std::string command_line;  // echoed into the JSON
  std::string label = "kvtier replay";

  // Bounds every number and checks every name; InvalidArgument naming the flag.
  Status Validate() const;
};

// Runs the replay and returns the process exit code: 0, 1 when a byte was wrong or the run failed,
// 2 for bad options, 3 when a hit class is slower than no cache beyond noise (unless
// slow_class_warn).
int RunReplay(const ReplayOptions& options);

struct Workload;  // workload.h
// The requests `options` name (--workload, --requests, --warmup, --skip, --shard): the warm-up
// ones first. InvalidArgument / NotFound naming the flag or file.
Status LoadWorkload(const ReplayOptions& options, Workload* workload);

// The shipped conversation trace (data/traces/...), or "" when it cannot be found.
std::string DefaultTracePath();

}  // namespace kvtier::tools
