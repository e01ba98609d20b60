// The text report of `kvtier replay` (PrintReport in replay_report.h): the runs' TTFT side by
// side, where the time goes, the hierarchy's bytes and bandwidth, its cache's events, a fault's
// effect, the sweep and the integrity line.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "replay_report.h"
#include "storage_read_profile.h"

namespace kvtier::tools {
namespace {

std::string IntervalText(const Interval& i) {
  return fmt::format("{:.2f}x [{:.2f}, {:.2f}]", i.value, i.lo, i.hi);
}

// The runs' TTFT table with the ideal, the headline ratios, the mostly-cached subset and the
// hit classes.
void PrintTtft(std::FILE* out, const ReplayReport& report, const RunSummary* hier) {
  std::fprintf(out, "\n%-12s %9s %9s %9s %9s %10s %10s %10s %10s\n", "run", "hit %", "device %",
               "host %", "storage %", "TTFT p50", "p90", "p99", "mean");
  auto row = [&](const std::string& name, const RunSummary* r, const Percentiles& p) {
    if (r != nullptr) {
      std::fprintf(out, "%-12s %9.2f %9.2f %9.2f %9.2f", name.c_str(), 100 * r->HitRate(),
                   100 * r->TierHitRate(0), 100 * r->TierHitRate(1), 100 * r->TierHitRate(2));
    } else {
      std::fprintf(out, "%-12s %9s %9s %9s %9s", name.c_str(), "", "", "", "");
    }
    std::fprintf(out, " %8.1fms %8.1fms %8.1fms %8.1fms\n", p.p50, p.p90, p.p99, p.mean);
  };
  for (const RunSummary& r : report.runs) row(r.name, &r, r.Ttft());
  row("ideal", nullptr, PercentilesOf(hier->ideal_ttft_ms));
  const Percentiles ideal = PercentilesOf(hier->ideal_ttft_ms);
  const Headline head = HeadlineOf(report);
  if (ideal.p50 > 0) {
    std::fprintf(out,
                 "hierarchy / ideal: p50 %s, p90 %s  ([lo, hi]: 95 %% interval of a bootstrap "
                 "over the %lld requests)\n",
                 IntervalText(head.over_ideal_p50).c_str(),
                 IntervalText(head.over_ideal_p90).c_str(), static_cast<long long>(head.requests));
  }
  std::fprintf(out,
               "  ideal: the hierarchy's hits and compute; host hits at %.2f GB/s (%s), storage "
               "hits at ",
               report.ceiling_bytes_per_s / 1e9, report.ceiling_how.c_str());
  if (report.storage_ceiling_bytes_per_s > 0) {
    std::fprintf(out, "%.2f GB/s (%s)", report.storage_ceiling_bytes_per_s / 1e9,
                 report.storage_ceiling_how.c_str());
    if (report.storage_cold_bytes_per_s > 0) {
      std::fprintf(out, " [cold reads of the same files, from the disk: %.2f GB/s, not charged]",
                   report.storage_cold_bytes_per_s / 1e9);
    }
  } else if (!report.storage_ceiling_how.empty()) {
    std::fprintf(out, "- (%s)", report.storage_ceiling_how.c_str());
  } else {
    std::fprintf(out, "- (no storage tier)");
  }
  std::fprintf(out,
               "; loads fully overlapped with the compute, no prefetch wait; a storage read "
               "begins when the run's prefetch began (at Match), hidden behind the request's "
               "queueing (the ideal's, or the run's lead from Prefetch to service if longer)\n");
  std::fprintf(out,
               "  ideal above the measured TTFT (by > 5 %% and 1 ms; it should be a lower bound): "
               "%lld of %zu requests\n",
               static_cast<long long>(IdealAboveMeasured(*hier)), hier->records.size());
  if (const RunSummary* none = report.Find("no_cache"); none != nullptr) {
    const std::vector<size_t> mostly = MostlyCached(*hier);
    if (mostly.empty()) {
      std::fprintf(out,
                   "requests with >= 90 %% of the prompt cached (in the hierarchy): none in this "
                   "slice\n");
    } else {
      const Percentiles a = PercentilesOf(TtftOf(*none, mostly));
      const Percentiles b = PercentilesOf(TtftOf(*hier, mostly));
      std::fprintf(out,
                   "requests with >= 90 %% of the prompt cached (in the hierarchy): %zu; TTFT p50 "
                   "no cache %.1f ms, hierarchy %.1f ms (%s better)",
                   mostly.size(), a.p50, b.p50, IntervalText(head.mostly_cached_speedup).c_str());
      if (const RunSummary* dev = report.Find("device_only"); dev != nullptr) {
        std::fprintf(out, ", device-only %.1f ms", PercentilesOf(TtftOf(*dev, mostly)).p50);
      }
      std::fprintf(out, "\n");
      const Percentiles sa = PercentilesOf(ServiceOf(*none, mostly));
      const Percentiles sb = PercentilesOf(ServiceOf(*hier, mostly));
      std::fprintf(out,
                   "  the same on service time (TTFT less queueing, each run's own): p50 no cache "
                   "%.1f ms, hierarchy %.1f ms (%s better)\n",
                   sa.p50, sb.p50, IntervalText(head.mostly_cached_service_speedup).c_str());
    }
  }
  if (head.requests < kHeadlineMinRequests) {
    std::fprintf(out,
                 "  (%lld measured requests, fewer than %lld: the ratios above are indicative "
                 "only)\n",
                 static_cast<long long>(head.requests),
                 static_cast<long long>(kHeadlineMinRequests));
  }
  const std::vector<ClassComparison> classes = report.CompareHitClasses();
  if (!classes.empty()) {
    std::fprintf(out,
                 "TTFT per hit class (the tier that served most of the matched prefix), the "
                 "same requests with no cache and in the hierarchy, p50 [95 %% interval]; "
                 "slower beyond noise = interval above %.2fx and p50s %.0f ms apart:\n",
                 1 + report.slow_class_margin, kTimeNoiseFloorMs);
    for (const ClassComparison& c : classes) {
      std::fprintf(out, "  %-8s %6lld requests: no cache %9.1f ms, hierarchy %9.1f ms: %s%s\n",
                   HitClassName(c.hit_class), static_cast<long long>(c.requests), c.no_cache_p50_ms,
                   c.hierarchy_p50_ms, IntervalText(c.ratio).c_str(),
                   c.slower ? "  SLOWER than no cache" : "");
    }
  }
}

// Time per request (hierarchy): where the TTFT goes.
void PrintTimeSplit(std::FILE* out, const RunSummary* hier) {
  double queue = 0, wait = 0, streamed_wait = 0, load = 0, compute = 0, device = 0;
  for (const RequestRecord& r : hier->records) {
    queue += r.queue_ms;
    (r.streamed ? streamed_wait : wait) += r.prefetch_wait_ms;
    load += r.load_ms;
    compute += r.compute_ms;
    device += r.device_ms;
  }
  const double n = std::max<double>(1.0, static_cast<double>(hier->records.size()));
  std::fprintf(out,
               "hierarchy, mean per request: queueing %.2f ms, prefetch wait %.2f ms, load %.2f "
               "ms, compute %.2f ms, device (load and compute overlapped) %.2f ms, load stall "
               "%.2f ms\n",
               queue / n, wait / n, load / n, compute / n, device / n,
               std::max(0.0, device - compute) / n);
  if (hier->streamed_loads > 0) {
    std::fprintf(out,
                 "  streamed storage hits (%lld): their LoadBack waited %.2f ms per request (mean "
                 "over all) on the read while loading; inside load and device above, not added "
                 "to the TTFT again\n",
                 static_cast<long long>(hier->streamed_loads), streamed_wait / n);
  }
}

// The hierarchy's bytes and bandwidth per direction, and the ceilings.
void PrintBytes(std::FILE* out, const ReplayReport& report, const RunSummary* hier) {
  const CacheStats& c = hier->cache;
  std::fprintf(out, "\nbytes and bandwidth (hierarchy):\n");
  std::fprintf(out, "  host -> device   %10.3f GB  %7.2f GB/s  (%lld tokens loaded back; %s)\n",
               static_cast<double>(c.load_back_tokens * report.kv_bytes_per_token) / 1e9,
               Gbps(c.load_back_tokens * report.kv_bytes_per_token, c.load_back_seconds),
               static_cast<long long>(c.load_back_tokens),
               report.gpu ? "the copies' time on the device to completion, CUDA events"
                          : "cpu: the copy is synchronous, its wall time");
  const LoadTotals lt = LoadTotalsOf(*hier);
  if (lt.requests > 0) {
    std::fprintf(out,
                 "  load back per request: %lld requests, mean %.2f ms for %.1f MB, %.2f GB/s "
                 "end to end (LoadBack called to the last layer in place%s)\n",
                 static_cast<long long>(lt.requests), lt.ms / static_cast<double>(lt.requests),
                 static_cast<double>(lt.bytes) / 1e6 / static_cast<double>(lt.requests),
                 Gbps(lt.bytes, lt.ms / 1e3),
                 report.gpu ? ": CUDA events on the load stream, read when the request completed"
                            : ": wall clock");
  }
  std::fprintf(out, "  device -> host   %10.3f GB  %7.2f GB/s  (%lld tokens backed up)\n",
               static_cast<double>(c.backup_bytes) / 1e9, Gbps(c.backup_bytes, c.backup_seconds),
               static_cast<long long>(c.backup_tokens));
  if (!hier->shared_host.empty()) {
    std::fprintf(out,
                 "  shared host %s: %lld tokens of host hits found in the segment by key, %lld "
                 "tokens found published when backed up (not copied)\n",
                 hier->shared_host.c_str(), static_cast<long long>(c.shared_host_hit_tokens),
                 static_cast<long long>(c.backup_present_tokens));
  }
  std::fprintf(out, "  storage -> host  %10.3f GB  %7.2f GB/s  (%lld tokens prefetched)\n",
               static_cast<double>(c.prefetch_bytes) / 1e9,
               Gbps(c.prefetch_bytes, c.prefetch_seconds),
               static_cast<long long>(c.prefetched_tokens));
  std::fprintf(out, "  host -> storage  %10.3f GB  %7.2f GB/s  (%lld tokens written)\n",
               static_cast<double>(c.storage_backup_bytes) / 1e9,
               Gbps(c.storage_backup_bytes, c.storage_backup_seconds),
               static_cast<long long>(c.storage_backup_tokens));
  std::fprintf(out, "  load ceiling     %.2f GB/s (measured at start: %s)\n",
               report.ceiling_bytes_per_s / 1e9, report.ceiling_how.c_str());
  if (report.storage_ceiling_bytes_per_s > 0) {
    std::fprintf(out, "  storage ceiling  %.2f GB/s (%s)\n",
                 report.storage_ceiling_bytes_per_s / 1e9, report.storage_ceiling_how.c_str());
  }
  if (report.storage_cold_bytes_per_s > 0) {
    std::fprintf(out, "  storage cold     %.2f GB/s (%s; context, not charged by the ideal)\n",
                 report.storage_cold_bytes_per_s / 1e9, report.storage_cold_how.c_str());
  } else if (!report.storage_cold_how.empty()) {
    std::fprintf(out, "  storage cold     - (%s)\n", report.storage_cold_how.c_str());
  }
}

// Where the store's Get and Set calls spent their time (StorageStats, the whole run): waiting in
// the queue, held behind a write of the same key (reads), and inside the backend with how many
// threads on average; and where the Gets' pages came from (page cache or disk) when the backend
// can tell.
void PrintStorageIo(std::FILE* out, const StorageStats& st) {
  auto per_ms = [](double seconds, int64_t calls) {
    return calls > 0 ? 1e3 * seconds / static_cast<double>(calls) : 0.0;
  };
  auto threads = [](double page_seconds, double seconds) {
    return seconds > 0 ? page_seconds / seconds : 0.0;
  };
  std::string source = "from the page cache / disk: not known for this store";
  if (st.get_cached_pages >= 0 && st.get_disk_pages >= 0) {
    source = fmt::format("hits from the page cache {} pages, from disk {} pages",
                         st.get_cached_pages, st.get_disk_pages);
  }
  // A profiled page's time (file://: 1 page in 8): on a core, waiting for a core, blocked.
  if (st.get_profiled_pages > 0 && st.get_profiled_seconds > 0) {
    source +=
        "; " + ProfiledGetPageText(st.get_profiled_pages, st.get_profiled_seconds,
                                   st.get_profiled_cpu_seconds, st.get_profiled_core_wait_seconds);
  }
  std::fprintf(out,
               "storage reads: %lld Gets, %.3f GB; per Get %.2f ms queued, %.2f ms inside the "
               "backend (%.1f threads, %.2f GB/s per thread); %lld held behind a write of their "
               "keys, %.2f ms each; %s\n",
               static_cast<long long>(st.get_calls), static_cast<double>(st.bytes_read) / 1e9,
               per_ms(st.get_queue_seconds, st.get_calls), per_ms(st.get_seconds, st.get_calls),
               threads(st.get_page_seconds, st.get_seconds),
               Gbps(st.bytes_read, st.get_page_seconds), static_cast<long long>(st.get_held_calls),
               per_ms(st.get_held_seconds, st.get_held_calls), source.c_str());
  std::fprintf(out,
               "storage writes: %lld Sets, %.3f GB; per Set %.2f ms queued, %.2f ms inside the "
               "backend (%.1f threads, %.2f GB/s per thread)\n",
               static_cast<long long>(st.set_calls), static_cast<double>(st.bytes_written) / 1e9,
               per_ms(st.set_queue_seconds, st.set_calls), per_ms(st.set_seconds, st.set_calls),
               threads(st.set_page_seconds, st.set_seconds),
               Gbps(st.bytes_written, st.set_page_seconds));
  if (st.set_profiled_pages > 0) {
    const double pages = static_cast<double>(st.set_profiled_pages);
    auto ms = [&](double seconds) { return 1e3 * seconds / pages; };
    std::fprintf(out,
                 "storage writes per page (ms, %lld pages): open %.3f (directory %.3f), copy "
                 "%.3f, checksum %.3f, write %.3f, fsync %.3f, stamp+rename %.3f, index %.3f, "
                 "unlink of evicted %.3f\n",
                 static_cast<long long>(st.set_profiled_pages), ms(st.set_open_seconds),
                 ms(st.set_open_dir_seconds), ms(st.set_copy_seconds), ms(st.set_hash_seconds),
                 ms(st.set_write_seconds), ms(st.set_sync_seconds), ms(st.set_publish_seconds),
                 ms(st.set_index_seconds), ms(st.set_unlink_seconds));
  }
}

// The storage oracle (replay_oracle.h): the storage hits of a store of the same capacity where
// every write the run's admission admitted was done at once, the hits this run lost against it,
// admit-all's hits (every write admitted and done at once), and the writes that were not done, by
// reason.
void PrintStorageOracle(std::FILE* out, const RunSummary& r) {
  if (!r.has_oracle) return;
  const CacheStats& c = r.cache;
  const double input = static_cast<double>(r.input_tokens());
  auto pct = [&](int64_t tokens) {
    return input > 0 ? 100.0 * static_cast<double>(tokens) / input : 0.0;
  };
  int64_t storage_hit = 0;
  for (const RequestRecord& x : r.records) storage_hit += x.storage_hit;
  const std::string capacity = r.oracle_capacity_pages >= 0
                                   ? fmt::format("{} pages", r.oracle_capacity_pages)
                                   : std::string("unbounded");
  std::fprintf(out,
               "storage hits vs oracle: %.2f %% of input tokens from storage; the oracle (same "
               "capacity, %s; every write the run's admission admitted done at once) %.2f %%: "
               "%.0f %% of it; hits lost to writes not done: %lld tokens (%.2f %% of input) in "
               "%lld requests; admit-all (same capacity, every write admitted and done at once, "
               "not a bound) %.2f %%; "
               "writes not done: admission refused %lld tokens, backlog full %lld, queue full "
               "%lld, timed out %lld, failed %lld, store refused (no room) %lld, policy %lld\n",
               pct(storage_hit), capacity.c_str(), pct(r.oracle_storage_tokens),
               r.oracle_storage_tokens > 0 ? 100.0 * static_cast<double>(storage_hit) /
                                                 static_cast<double>(r.oracle_storage_tokens)
                                           : 100.0,
               static_cast<long long>(r.lost_storage_tokens), pct(r.lost_storage_tokens),
               static_cast<long long>(r.lost_storage_requests), pct(r.admit_all_storage_tokens),
               static_cast<long long>(c.storage_backup_refused_tokens),
               static_cast<long long>(c.storage_backup_backlog_tokens),
               static_cast<long long>(c.storage_backup_dropped_tokens),
               static_cast<long long>(c.storage_backup_timed_out_tokens),
               static_cast<long long>(c.storage_backup_failed_tokens),
               static_cast<long long>(c.storage_backup_capacity_tokens),
               static_cast<long long>(c.storage_backup_policy_tokens));
}

// What the hierarchy's cache did: prefetches, evictions, failed loads, KV events, pins, the store.
void PrintCacheEvents(std::FILE* out, const RunSummary* hier) {
  const CacheStats& c = hier->cache;
  std::fprintf(out,
               "prefetch: %lld complete, %lld partial, %lld timed out, %lld none (no storage "
               "part, below the threshold or no room)\n",
               static_cast<long long>(hier->prefetch_complete),
               static_cast<long long>(hier->prefetch_partial),
               static_cast<long long>(hier->prefetch_timed_out),
               static_cast<long long>(hier->prefetch_none));
  if (!hier->storage_load_path.empty()) {
    std::fprintf(out, "storage hits' load: %s\n",
                 hier->storage_load_path == "streamed"
                     ? fmt::format("streamed (LoadBack ended {} prefetches, copying their pages "
                                   "to the device as they arrived)",
                                   hier->streamed_loads)
                           .c_str()
                     : "after the read (FinishPrefetch, then LoadBack: best_effort prefetch or "
                       "--no-stream-load-back)");
  }
  std::fprintf(out,
               "evictions: device %lld tokens (%lld dropped, the rest kept in host), host %lld "
               "tokens, storage %lld tokens forgotten by the tree",
               static_cast<long long>(c.device_evicted_tokens),
               static_cast<long long>(c.dropped_tokens),
               static_cast<long long>(c.host_evicted_tokens),
               static_cast<long long>(c.storage_forgotten_tokens));
  if (hier->has_storage && hier->storage_stats.evicted_pages > 0) {
    std::fprintf(out, ", %lld pages evicted by the store",
                 static_cast<long long>(hier->storage_stats.evicted_pages));
  }
  std::fprintf(out, "\n");
  if (hier->load_failures > 0) {
    std::fprintf(out, "load back: %lld requests recomputed their host hits (no device room)\n",
                 static_cast<long long>(hier->load_failures));
  }
  if (hier->has_kv_events) {
    const KvEventPublisherStats& e = hier->kv_events;
    std::fprintf(out,
                 "kv events: %llu batches (%llu events) published on %s, %llu dropped; the "
                 "cache holds %zu GPU, %zu CPU_PINNED, %zu %s blocks\n",
                 static_cast<unsigned long long>(e.published_batches),
                 static_cast<unsigned long long>(e.published_events),
                 hier->kv_events_endpoint.c_str(),
                 static_cast<unsigned long long>(e.dropped_batches), hier->kv_blocks.device.size(),
                 hier->kv_blocks.host.size(), hier->kv_blocks.storage.size(),
                 hier->kv_events_storage_medium.empty() ? "storage"
                                                        : hier->kv_events_storage_medium.c_str());
  }
  if (hier->has_pin) {
    const CacheStats& c = hier->cache;
    std::fprintf(
        out,
        "pin: system prompt of %lld tokens pinned in %s (%s), %lld covered at the end; "
        "pinned tokens device %lld host %lld storage %lld%s\n",
        static_cast<long long>(hier->pin_prompt_tokens), hier->pin_tiers.c_str(),
        hier->pin_ttl_s > 0 ? fmt::format("TTL {} s", hier->pin_ttl_s).c_str() : "the whole run",
        static_cast<long long>(hier->pin_covered_tokens),
        static_cast<long long>(c.pinned_device_tokens),
        static_cast<long long>(c.pinned_host_tokens),
        static_cast<long long>(c.pinned_storage_tokens),
        hier->pin_store_pinned ? ", the store keeps its pages" : "");
  }
  if (hier->has_storage) {
    std::fprintf(out,
                 "storage %s: %lld errors, %lld writes refused by a full store (Redis at "
                 "maxmemory), %lld corrupt pages, %lld read timeouts, %lld write timeouts, %lld "
                 "queue drops\n",
                 hier->storage.c_str(), static_cast<long long>(c.storage_errors),
                 static_cast<long long>(hier->storage_stats.set_refused_pages),
                 static_cast<long long>(c.storage_corrupt_pages),
                 static_cast<long long>(c.storage_read_timeouts),
                 static_cast<long long>(c.storage_write_timeouts),
                 static_cast<long long>(c.storage_queue_drops));
    PrintStorageIo(out, hier->storage_stats);
    PrintStorageOracle(out, *hier);
    const StoredChains& sc = hier->stored_chains;
    if (sc.checked) {
      std::fprintf(out,
                   "stored pages unreachable from a stored first page: %lld of %lld stored "
                   "(%lld page keys in the run's requests)\n",
                   static_cast<long long>(sc.unreachable), static_cast<long long>(sc.stored),
                   static_cast<long long>(sc.keys));
    } else {
      std::fprintf(out, "stored pages unreachable from a stored first page: not checked (%s)\n",
                   sc.why_unchecked.c_str());
    }
  }
}

// --fault: the hit rates before and after the store went down.
void PrintFault(std::FILE* out, const RunSummary* hier) {
  if (hier->fault_index >= 0) {
    auto storage_rate = [&](int64_t begin, int64_t end) {
      int64_t hit = 0, in = 0;
      for (int64_t i = begin; i < end; ++i) {
        hit += hier->records[static_cast<size_t>(i)].storage_hit;
        in += hier->records[static_cast<size_t>(i)].input_tokens;
      }
      return in > 0 ? 100.0 * static_cast<double>(hit) / static_cast<double>(in) : 0.0;
    };
    const int64_t n = static_cast<int64_t>(hier->records.size());
    std::fprintf(out,
                 "fault: storage down at %.1f s (request %lld): hit rate before %.2f %%, after "
                 "%.2f %%; storage hits before %.2f %%, after %.2f %%\n",
                 hier->fault_at_s, static_cast<long long>(hier->fault_index),
                 100 * hier->HitRate(0, hier->fault_index), 100 * hier->HitRate(hier->fault_index),
                 storage_rate(0, hier->fault_index), storage_rate(hier->fault_index, n));
    if (!hier->fault_action.empty()) std::fprintf(out, "  (%s)\n", hier->fault_action.c_str());
  }
}

// The sweep's runs, the integrity line over every run, and --metrics.
void PrintSweepAndIntegrity(std::FILE* out, const ReplayReport& report) {
  if (!report.sweep.empty()) {
    std::fprintf(out, "\nsweep (hierarchy):\n%-24s %9s %9s %9s %9s %10s %10s\n", "knob", "hit %",
                 "device %", "host %", "storage %", "TTFT p50", "p90");
    for (const SweepPoint& p : report.sweep) {
      const Percentiles t = p.run.Ttft();
      std::fprintf(out, "%-24s %9.2f %9.2f %9.2f %9.2f %8.1fms %8.1fms\n", p.run.name.c_str(),
                   100 * p.run.HitRate(), 100 * p.run.TierHitRate(0), 100 * p.run.TierHitRate(1),
                   100 * p.run.TierHitRate(2), t.p50, t.p90);
    }
  }
  int64_t checked = 0, wrong = 0;
  std::string first;
  auto add = [&](const RunSummary& r) {
    checked += r.bytes_checked;
    wrong += r.wrong_bytes;
    if (first.empty()) first = r.first_wrong;
  };
  for (const RunSummary& r : report.runs) add(r);
  for (const SweepPoint& p : report.sweep) add(p.run);
  std::fprintf(out, "integrity: %lld bytes checked, %lld wrong%s%s\n",
               static_cast<long long>(checked), static_cast<long long>(wrong),
               first.empty() ? "" : "; first: ", first.c_str());
  for (const RunSummary& r : report.runs) {
    if (!r.metrics.empty())
      std::fprintf(out, "\nmetrics (%s):\n%s", r.name.c_str(), r.metrics.c_str());
  }
}

}  // namespace

void PrintReport(std::FILE* out, const ReplayReport& report) {
  const RunSummary* hier = report.Find("hierarchy");
  if (hier == nullptr) return;
  const int64_t input = hier->input_tokens();
  std::fprintf(out, "\nrequests %zu, input tokens %lld\n", hier->records.size(),
               static_cast<long long>(input));

  PrintTtft(out, report, hier);
  PrintTimeSplit(out, hier);
  if (hier->has_cache) {
    PrintBytes(out, report, hier);
    PrintCacheEvents(out, hier);
  }
  PrintFault(out, hier);
  PrintSweepAndIntegrity(out, report);
  std::fflush(out);
}

}  // namespace kvtier::tools
