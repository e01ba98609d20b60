// Flags of `kvtier replay` and `kvtier demo` (see replay_cli.h). Numbers are bounded and names
// checked by ReplayOptions::Validate, which answers with a message naming the flag.
#include "replay_cli.h"

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

#include "config_flags.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/layout.h"
#include "kvtier/tp_group.h"
#include "replay_model.h"
#include "replay_options.h"

namespace kvtier::tools {
namespace {

// A flag for every field of the cache's schema that the replay does not set itself, under the
// replay's name for it (kReplayCacheFlagNames, else FlagName), bound to o->cache: its default the
// replay's (ReplayCacheDefaults), its help, bounds and choices the schema's.
void AddCacheFlags(CLI::App* c, ReplayOptions* o) {
  const ConfigSchema<HierarchicalCacheConfig>& schema = HierarchicalCacheConfigSchema();
  for (const ConfigField<HierarchicalCacheConfig>& f : schema) {
    if (ReplaySetsCacheField(f.name) || f.name == "stream_load_back") continue;
    std::string names = FlagName(f.name);
    for (const auto& [field, replay_names] : kReplayCacheFlagNames) {
      if (field == f.name) names = replay_names;
    }
    CLI::Option* opt = AddFieldFlag(c, f, &o->cache, names);
    if (f.name == "page_size") {  // the cache's 0 ("the device region's") is no replay page size
      opt->description(fmt::format(
          "tokens per page of every tier (SGLang's --page-size); a power of two in [1, {}]",
          kMaxKvPageSize));
    }
    if (f.name == "device_eviction") {
      // One eviction policy for both tiers, as SGLang's: --eviction sets host_eviction too.
      opt->description("eviction order of the device and host tiers; " + f.RangeText());
      opt->each([o](const std::string& name) {
        if (Result<EvictionPolicyKind> k = ParseEvictionPolicy(name); k.ok()) {
          o->cache.host_eviction = *k;
        }
      });
    }
  }
  // A switch that turns the field off (its default is on).
  const ConfigField<HierarchicalCacheConfig>& stream = *FindField(schema, "stream_load_back");
  c->add_flag("!--no-stream-load-back", o->cache.storage.stream_load_back,
              "turn off: " + stream.help);
}

// --workload and the requests it gives.
void AddWorkloadFlags(CLI::App* c, ReplayOptions* o) {
  c->add_option("--workload", o->workload,
                "mooncake (the shipped conversation trace), a Mooncake JSONL trace file, or a "
                "synthetic workload: chat, system-prompt, doc-qa")
      ->capture_default_str();
  c->add_option("--requests", o->requests,
                "requests to serve: the first N of the trace (0 = all; synthetic: 1000)")
      ->capture_default_str();
  c->add_option("--warmup", o->warmup,
                "requests served first to fill the tiers (KV written and checked, not timed or "
                "reported); --requests counts the measured ones after them")
      ->capture_default_str();
  c->add_option("--skip", o->skip,
                "trace workloads: requests left out before the warm-up ones (after --shard)")
      ->capture_default_str();
  c->add_option("--shard", o->shard,
                "trace workloads: I/K serves only the conversations that a prefix-affinity "
                "router over K engines sends to engine I (conversation = second block id, "
                "modulo K)");
  c->add_option("--seed", o->seed, "seed of the synthetic workloads")->capture_default_str();
  c->add_option("--rate", o->rate, "synthetic workloads: arrivals per second")
      ->capture_default_str();
  c->add_flag("--insert-output", o->insert_output,
              "also cache each request's output tokens (default: prompts only)");
}

// How the requests arrive and are served.
void AddSchedulingFlags(CLI::App* c, ReplayOptions* o) {
  c->add_option("--concurrency", o->concurrency,
                "closed loop: this many requests in flight (0 = open loop by timestamps)")
      ->capture_default_str();
  c->add_option("--speed", o->speed, "open loop: the trace's timestamps divided by this")
      ->capture_default_str();
  c->add_flag("--sequential", o->sequential, "one request at a time, in file order");
  c->add_option("--decode-ms-per-token", o->decode_ms_per_token,
                "closed loop: a request holds its place until its output (the trace's "
                "output_length) is decoded at this many ms a token, or 'measure' (GPU, compute "
                "gemm: a decode step of --concurrency tokens timed); 0: the next request follows "
                "the first token")
      ->capture_default_str();
  c->add_flag("--settle-backups", o->settle_backups,
              "wait for each request's backups to storage before serving the next (storage hits "
              "independent of the store's write speed)");
  c->add_option("--max-inflight", o->max_inflight,
                "open loop: requests matched (and prefetching) ahead of the one being served")
      ->capture_default_str();
}

// The model and its compute.
void AddModelFlags(CLI::App* c, ReplayOptions* o) {
  c->add_option("--model", o->model, "model shape: " + ReplayModelNames())->capture_default_str();
  c->add_option("--compute-model", o->compute_model,
                "the model whose prefill the compute stands for (default: --model); e.g. --model "
                "tiny --compute-model llama3-8b keeps a long replay's KV bytes small");
  c->add_option("--compute", o->compute,
                "prefill compute: gemm (real bf16 cuBLAS GEMMs, GPU), model (cost model at "
                "--tflops), auto (gemm on a GPU)")
      ->capture_default_str();
  c->add_option("--tflops", o->tflops, "the cost model's rate (TFLOP/s)")->capture_default_str();
  c->add_option("--chunk-tokens", o->chunk_tokens,
                "chunked prefill: tokens per chunk (SGLang's --chunked-prefill-size)")
      ->capture_default_str();
  c->add_option("--device", o->device,
                "device pool: gpu, cpu (host memory standing in), auto (gpu when present)")
      ->capture_default_str();
}

// The tiers: capacities, the store, the copies and the cache's settings.
void AddTierFlags(CLI::App* c, ReplayOptions* o) {
  c->add_option("--device-tokens", o->device_tokens, "device tier capacity in tokens")
      ->capture_default_str();
  c->add_option("--host-tokens", o->host_tokens,
                "host tier capacity in tokens (0 = no host tier; default 4 x --device-tokens)")
      ->each([o](const std::string&) { o->host_tokens_given = true; });
  c->add_option("--storage", o->storage,
                "storage tier: file (a temporary file store, removed afterwards), redis (a "
                "redis-server the run starts on a free 127.0.0.1 port and stops), none, or a URL: "
                "file:///dir, redis://host:port, memory://")
      ->capture_default_str();
  c->add_option(
      "--shared-host", o->shared_host,
      "host tier: the shared segment NAME (`kvtier shm create NAME` with the model's "
      "geometry), shared with every process attached to it: a replay finds what another "
      "computed; --host-tokens is this process's budget of pinned pages; no storage tier");
  c->add_option("--storage-bytes", o->storage_bytes,
                "capacity of the temporary file store or the run's redis-server (0 = 8 x the "
                "host tier's bytes)")
      ->capture_default_str();
  c->add_option("--hicache-io-backend,--io-backend", o->io_backend,
                "host <-> device copies: auto (kernel on a GPU, cpu otherwise), kernel, dma, cpu")
      ->capture_default_str();
  // The cache's settings.
  AddCacheFlags(c, o);
}

// Checks, faults, KV events, pins, the runs made and the outputs.
void AddCheckAndOutputFlags(CLI::App* c, ReplayOptions* o) {
  c->add_option("--verify", o->verify, "check all loaded bytes, or a sample (one page in eight)")
      ->capture_default_str();
  c->add_option("--fault", o->fault,
                "storage-down@SECONDS: from that point of the replay's clock on, the store is "
                "down (--storage redis: its redis-server is stopped; otherwise every call "
                "fails); storage-delay@MS: every storage call waits MS ms (1..1000) first, from "
                "the start (a slow store)");
  c->add_option("--slow-class-margin", o->slow_class_margin,
                "a hit class is slower than no cache beyond noise when the 95 % bootstrap "
                "interval of its TTFT p50 ratio (hierarchy / no cache) lies above 1 + this "
                "(timing noise the bootstrap over requests does not see) and the p50s are at "
                "least 1 ms apart")
      ->capture_default_str();
  c->add_flag("--slow-class-warn", o->slow_class_warn,
              "a hit class slower than no cache is a warning, not a failure (exit code 3)");
  c->add_option("--json", o->json_path, "also write the numbers (and per-request series) as JSON");
  c->add_option("--plot", o->plot_path,
                "write the plots (hit rate over time per tier, TTFT CDF) as a PNG; needs "
                "python3-matplotlib");
  c->add_option("--sweep", o->sweep,
                "host-tokens=A,B,C: one hierarchy run per value; hit rate and TTFT against it");
  c->add_option("--kv-events", o->kv_events,
                "publish the hierarchy run's KV events (vLLM's schema, ZeroMQ PUB) on this "
                "endpoint, e.g. tcp://*:5557 (bound) or tcp://127.0.0.1:5557 (connected)");
  c->add_option("--kv-events-replay", o->kv_events_replay,
                "with --kv-events: the replay socket (ROUTER, bound), e.g. tcp://*:5558");
  c->add_option("--kv-events-topic", o->kv_events_topic,
                "with --kv-events: the topic frame of every message (default empty)");
  c->add_option("--kv-events-hold", o->kv_events_hold_s,
                "with --kv-events: keep the sockets open this many seconds after the report, "
                "for subscribers that still fetch missed batches from the replay socket");
  c->add_option("--pin-system-prompt", o->pin_system_prompt,
                "pin the prefix every request shares (the synthetic workloads' system prompt) in "
                "these tiers of the hierarchy run: device,host,storage (any) or all; "
                "HierarchicalCache::Pin, budgets set to the prompt");
  c->add_option("--pin-ttl", o->pin_ttl_s,
                "with --pin-system-prompt: the pin's TTL in seconds (0 = the whole run)")
      ->capture_default_str();
  c->add_option("--runs", o->runs,
                "all (no cache, device-only, hierarchy), no_cache,hierarchy (what the ideal, "
                "the mostly-cached speed-up and the hit classes need) or hierarchy")
      ->capture_default_str();
  c->add_flag("--metrics", o->metrics, "print the cache's Prometheus metrics at the end");
  c->add_flag("!--no-progress", o->progress, "no progress line");
}

}  // namespace

CLI::App* AddReplayCommand(CLI::App& app, ReplayOptions* o) {
  CLI::App* c = app.add_subcommand(
      "replay",
      "Serve a recorded or synthetic workload through device, host and storage; check "
      "every loaded byte; report hits per tier, bandwidth and TTFT");
  c->footer(
      "Drives HierarchicalCache per request as an engine's scheduler does: Match -> QueryStorage "
      "-> Prefetch -> LoadBack -> prefill (per layer: WaitLayer, check the matched KV, compute, "
      "write the new tokens' KV) -> Insert -> Release. Three runs side by side: no cache, a "
      "device-only radix cache, and the full hierarchy, plus the hierarchy's ideal: its own hits "
      "and compute, no prefetch wait, loads fully overlapped with the compute, host hits at the "
      "host -> device ceiling (GPU: one pinned copy; cpu: memcpy) and storage hits at the "
      "storage read ceiling, both measured at start (file://: N threads of open+pread+close over "
      "files of one page in the store's directory, N = --storage-io-threads; redis: a "
      "redis-benchmark GET baseline; otherwise the run's own storage -> host rate, as the report "
      "says); a storage read begins at the request's Match, as the run's prefetch does, so its "
      "queueing hides part of it. TTFT = queueing + prefetch wait + load + prefill (a streamed "
      "storage hit's wait on the read is inside its load). Loads are timed to completion "
      "(GPU: CUDA events on the load stream; cpu: the copy is synchronous, wall time). "
      "Spread: hierarchy / ideal (p50, p90) and the speed-up of requests with >= 90 % cached come "
      "with a 95 % interval from a paired bootstrap over the measured requests (1000 resamples, "
      "fixed seed): how much the ratio depends on which requests the slice holds; use >= 300 "
      "measured requests for numbers to quote. Hit classes: each request's class is the tier "
      "that served most of its matched prefix (device, host, storage; none: nothing matched); "
      "per class, its TTFT p50 against the same requests with no cache, and a class whose "
      "interval lies above 1 + --slow-class-margin, with p50s at least 1 ms apart, is slower "
      "than no cache beyond noise. Exact "
      "mode: --sequential --host-tokens 0 --storage none --eviction lru makes the device tier a "
      "plain leaf-LRU prefix cache. Exit codes: 1 if any loaded byte is wrong (or the run "
      "failed), 2 for bad flags, 3 if a hit class is slower than no cache beyond noise (a "
      "warning with --slow-class-warn).");
  AddWorkloadFlags(c, o);
  AddSchedulingFlags(c, o);
  AddModelFlags(c, o);
  AddTierFlags(c, o);
  AddCheckAndOutputFlags(c, o);
  return c;
}

CLI::App* AddDemoCommand(CLI::App& app, DemoOptions* o) {
  CLI::App* c = app.add_subcommand(
      "demo", "The first thing to run: replay of the shipped trace through all three tiers");
  c->footer(
      "`kvtier replay` on the shipped Mooncake conversation trace with embedded defaults: the "
      "GPU if present (else host memory standing in for it), a temporary file store, capacities "
      "small enough that every tier gets hits. Prints hits per tier, bandwidths and TTFT with no "
      "cache, a device-only cache and the hierarchy; checks every loaded byte (exit code 1 on "
      "any wrong byte).");
  c->add_option("--requests", o->requests, "requests of the trace to serve (0 = the default)")
      ->capture_default_str();
  c->add_option("--device", o->device, "gpu, cpu or auto")
      ->check(CLI::IsMember({"auto", "gpu", "cpu"}))
      ->capture_default_str();
  c->add_option("--json", o->json_path, "also write the numbers as JSON");
  c->add_option("--plot", o->plot_path, "write the plots as a PNG (python3-matplotlib)");
  return c;
}

void AddTpReplayFlags(CLI::App* replay, TpReplayArgs* a) {
  replay
      ->add_option("--tp", a->tp,
                   "tensor-parallel ranks: one process per rank (GPU, or cpu device), one cache "
                   "decision per group; serves the requests at TP=1 first and compares "
                   "(sequential; --storage file or none: a file store of per-head objects per "
                   "pass, host layout page_head)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  replay->add_flag(
      "--tp-equal-bytes", a->equal_bytes,
      "--tp: also serve the requests at TP=1 on each rank's GPU at that rank's bytes per copy "
      "(MHA: one rank's share of the KV heads; MLA: the whole latent), each rank's load "
      "bandwidth baseline on its own GPU (the cpu device: one such pass for every rank)");
  // The ring's settings: the schema's fields under the replay's --tp-* names.
  const ConfigSchema<TpGroupConfig>& schema = TpGroupConfigSchema();
  for (const auto& [field, flag] : {std::pair{"ack_timeout_s", "--tp-timeout"},
                                    {"follower_poll_s", "--tp-follower-poll"},
                                    {"follower_doze_s", "--tp-follower-doze"},
                                    {"leader_poll_s", "--tp-leader-poll"}}) {
    CLI::Option* opt = AddFieldFlag(replay, *FindField(schema, field), &a->ring, flag);
    opt->description("--tp: " + opt->get_description());
  }
  replay->add_flag("--tp-ack-each-copy", a->ring.ack_each_copy,
                   "--tp: " + FindField(schema, "ack_each_copy")->help);
  replay->add_option("--tp-rank", a->rank)->group("")->check(CLI::Range(1, 7));
  replay->add_option("--tp-group", a->group)->group("");
  replay->add_option("--tp-store", a->store)->group("");
}

}  // namespace kvtier::tools
