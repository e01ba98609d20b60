// `kvtier bench --storage-hit URL` (see storage_hit_bench.h).
#include "storage_hit_bench.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "config_flags.h"
#include "kvtier/device.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/storage.h"
#include "kvtier/testing/device_tier.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/transfer.h"
#include "replay_ceiling.h"

namespace kvtier::tools {

namespace {

using Clock = std::chrono::steady_clock;

// Llama-3-8B (docs/performance.md's reference workload): 128 KiB a token, 2 MiB a page of 16.
constexpr int64_t kLayers = 32;
constexpr int64_t kSlotBytes = 2048;  // 8 KV heads x 128 x bf16, for K and for V

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The times of one cache's repeats, in seconds.
struct Times {
  std::vector<double> hit;    // Prefetch -> LoadBack complete (a storage hit)
  std::vector<double> read;   // Prefetch -> FinishPrefetch (the read alone)
  std::vector<double> load;   // LoadBack of a host hit, to completion (the load alone)
  std::vector<double> pread;  // the baseline: N pread threads over the store's page files
};

// A file:// store's page files: the regular files beneath its directory of a page's payload
// plus at most a header's bytes (the store holds this bench's prefix; any other page of the
// same size read by the baseline costs it the same). Empty for other schemes.
std::vector<std::string> StorePageFiles(const std::string& url, int64_t page_bytes) {
  std::vector<std::string> files;
  const std::string dir = FileUrlDirectory(url);
  if (dir.empty()) return files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    const auto size = static_cast<int64_t>(it->file_size(ec));
    if (!ec && size >= page_bytes && size <= page_bytes + (int64_t{64} << 10)) {
      files.push_back(it->path().string());
    }
  }
  return files;
}

class Bench {
 public:
  Bench(const StorageHitBenchOptions& o, TransferBackend backend,
        std::shared_ptr<StorageBackend> store)
      : o_(o), backend_(backend), store_(std::move(store)) {
    std::mt19937 rng(1234);
    tokens_.resize(static_cast<size_t>(o.tokens));
    for (Token& t : tokens_) t = static_cast<Token>(rng() % (Token{1} << 30));
    hashes_ = KvPatternHashes(tokens_, KvPatternSalt(""));
  }

  // A cache with stream_load_back off and one with it on, over the one store, each holding the
  // prefix; then `repeats` rounds (after a warm-up), each timing a storage hit on both caches in
  // turn (so that a machine's drift hits both alike) and the read and the load apart.
  Status Run(Times* unstreamed, Times* streamed) {
    Side off, on;
    KVTIER_RETURN_IF_ERROR(Open(/*stream=*/false, &off));
    KVTIER_RETURN_IF_ERROR(Open(/*stream=*/true, &on));
    page_files_ = StorePageFiles(store_->url(), PageBytes());
    // Memory like the cache's host pool (anonymous, advised to transparent huge pages), one page
    // per file, written before the first pass.
    const size_t into_bytes =
        std::max<size_t>(1, page_files_.size() * static_cast<size_t>(PageBytes()));
    void* into =
        ::mmap(nullptr, into_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (into == MAP_FAILED) return Status::OutOfMemory("the pread baseline's memory");
    pread_into_ = {static_cast<char*>(into), Unmap{into_bytes}};
    (void)::madvise(into, into_bytes, MADV_HUGEPAGE);
    std::memset(into, 1, into_bytes);
    if (!page_files_.empty() &&
        static_cast<int64_t>(page_files_.size()) != o_.tokens / o_.page_size) {
      fmt::print("note: the store's directory holds {} page files, the prefix {} pages\n",
                 page_files_.size(), o_.tokens / o_.page_size);
    }
    for (int r = 0; r < o_.repeats + 1; ++r) {  // the first is a warm-up
      const bool timed = r > 0;
      for (Side* side : {&off, &on}) {
        KVTIER_ASSIGN_OR_RETURN(double hit, StorageHit(*side, nullptr));
        if (timed) (side == &on ? streamed : unstreamed)->hit.push_back(hit);
      }
      double load = 0;
      KVTIER_ASSIGN_OR_RETURN(double read, StorageHit(off, &load));
      if (timed) {
        unstreamed->read.push_back(read);
        unstreamed->load.push_back(load);
      }
      if (timed && !page_files_.empty()) {
        const double pread =
            ReadPass(page_files_, PageBytes(), store_->options().io_threads, pread_into_.get());
        if (pread < 0) return Status::IOError("the pread baseline could not read a page file");
        unstreamed->pread.push_back(pread);
      }
    }
    return Status::OK();
  }

 private:
  // One cache over the store with its engine pool (every byte 0xEE until written, so that a
  // load that misses a page cannot pass its check on the bytes of the last round: Poison).
  struct Side {
    std::unique_ptr<testing::DeviceTier> pool;
    std::unique_ptr<HierarchicalCache> cache;
    CudaStreamHandle stream;
  };

  Status Open(bool stream, Side* side) {
    const KvGeometry g{KvLayout::kLayerFirst, kLayers, o_.tokens, kSlotBytes, o_.page_size, 1};
    KVTIER_ASSIGN_OR_RETURN(
        side->pool, testing::DeviceTier::Create(backend_, g, /*mla=*/false,
                                                {.k = std::byte{0xEE}, .v = std::byte{0xEE}}));
    HierarchicalCacheConfig cfg;
    cfg.write_policy = WritePolicy::kWriteThrough;
    cfg.transfer_backend = backend_;
    cfg.host_capacity_bytes = 2 * o_.tokens * kLayers * kSlotBytes;  // the prefix, K and V
    cfg.storage.backend = store_;
    cfg.storage.prefetch_threshold_tokens = 0;
    cfg.storage.max_prefetch_host_fraction = 1.0;
    cfg.storage.stream_load_back = stream;
    KVTIER_ASSIGN_OR_RETURN(side->cache, HierarchicalCache::Create(cfg, side->pool->region()));
    if (backend_ != TransferBackend::kCpu) {
      KVTIER_ASSIGN_OR_RETURN(side->stream, CudaStreamHandle::Create(0));
    }
    HierarchicalCache& cache = *side->cache;
    KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> slots, cache.AllocateDeviceSlots(o_.tokens));
    KVTIER_RETURN_IF_ERROR(side->pool->Fill(slots, hashes_));
    KVTIER_RETURN_IF_ERROR(cache.Insert(tokens_, slots).status());
    return cache.WaitForBackups();
  }

  // Evicts the prefix to storage only, then brings it back: returns the seconds from Prefetch to
  // the load's completion; with `load`: the read's seconds (Prefetch -> FinishPrefetch), and the
  // host hit's load in *load. Checks every loaded byte (untimed).
  Result<double> StorageHit(Side& side, double* load) {
    HierarchicalCache& cache = *side.cache;
    testing::DeviceTier& pool = *side.pool;
    const CudaStreamHandle& stream = side.stream;
    KVTIER_RETURN_IF_ERROR(cache.EvictDevice(std::numeric_limits<int64_t>::max()).status());
    KVTIER_RETURN_IF_ERROR(cache.EvictHost(std::numeric_limits<int64_t>::max()).status());
    pool.Poison();
    KVTIER_ASSIGN_OR_RETURN(MatchResult m, cache.Match(tokens_));
    if (m.storage_tokens != o_.tokens) {
      (void)cache.Release(m.handle);
      return Status::Internal(
          fmt::format("the store holds {} of the prefix's {} tokens", m.storage_tokens, o_.tokens));
    }
    const auto t0 = Clock::now();
    Result<PrefetchResult> p = cache.Prefetch(m.handle, PrefetchPolicy::kWaitComplete);
    double seconds = 0;
    if (p.ok() && load != nullptr) {
      p = cache.FinishPrefetch(m.handle);
      seconds = Seconds(t0, Clock::now());
    }
    const auto t1 = Clock::now();
    Result<LoadBackResult> l =
        p.ok() ? cache.LoadBack(m.handle, stream.get()) : Result<LoadBackResult>(p.status());
    if (l.ok() && backend_ != TransferBackend::kCpu) {
      if (Status st = stream.Synchronize(); !st.ok()) l = st;
    }
    const auto t2 = Clock::now();
    if (load != nullptr) {
      *load = Seconds(t1, t2);
    } else {
      seconds = Seconds(t0, t2);
    }
    Status st = l.ok() ? Status::OK() : l.status();
    if (st.ok() && l->loaded_tokens != o_.tokens) {
      st = Status::Internal(fmt::format("loaded {} of {} tokens (prefetch {})", l->loaded_tokens,
                                        o_.tokens, PrefetchStateName(l->prefetch.state)));
    }
    if (st.ok()) st = pool.Verify(l->device_slots, hashes_);
    const Status released = cache.Release(m.handle);
    KVTIER_RETURN_IF_ERROR(st);
    KVTIER_RETURN_IF_ERROR(released);
    return seconds;
  }

  int64_t PageBytes() const { return kLayers * kSlotBytes * 2 * o_.page_size; }

  const StorageHitBenchOptions& o_;
  TransferBackend backend_;
  std::shared_ptr<StorageBackend> store_;
  std::vector<Token> tokens_;
  std::vector<uint64_t> hashes_;
  std::vector<std::string> page_files_;  // file:// only: the baseline's files
  struct Unmap {
    size_t bytes;
    void operator()(char* p) const { ::munmap(p, bytes); }
  };
  std::unique_ptr<char, Unmap> pread_into_{nullptr, Unmap{0}};  // where the baseline reads to
};

}  // namespace

void AddStorageHitBenchOptions(CLI::App* bench, StorageHitBenchOptions* o) {
  bench->add_option("--storage-hit", o->url,
                    "time a storage hit (Prefetch -> LoadBack) of one prefix stored at this URL, "
                    "streamed and not, beside the read and the load alone (Llama-3-8B pages)");
  bench
      ->add_option("--storage-hit-tokens", o->tokens,
                   "the prefix's tokens (a multiple of --storage-hit-page)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20))
      ->capture_default_str();
  bench
      ->add_option("--storage-hit-page", o->page_size,
                   "tokens a page (128 KiB each: 4 = 512 KiB, 16 = 2 MiB, 64 = 8 MiB pages)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  bench->add_option("--storage-hit-backend", o->backend, "the cache's transfer backend")
      ->check(CLI::IsMember({"cpu", "kernel", "dma"}))
      ->capture_default_str();
  AddFieldFlag(bench, *FindField(StorageOptionsSchema(), "io_threads"), &o->storage,
               "--storage-hit-threads");
}

int RunStorageHitBench(const StorageHitBenchOptions& o) {
  if (o.tokens % o.page_size != 0) {
    std::fprintf(stderr,
                 "kvtier bench: --storage-hit-tokens = %lld is not a multiple of "
                 "--storage-hit-page = %lld\n",
                 static_cast<long long>(o.tokens), static_cast<long long>(o.page_size));
    return 2;
  }
  const TransferBackend backend = *ParseTransferBackend(o.backend);
  KvGeometry pages;
  pages.layout = KvLayout::kPageFirst;
  pages.num_layers = kLayers;
  pages.slot_bytes = kSlotBytes;
  pages.page_size = o.page_size;
  const StorageNamespace ns =
      StorageNamespaceOf(pages, /*mla=*/false, {.model_id = "kvtier-storage-hit-bench"});
  StorageOptions options = o.storage;
  options.timeout = std::chrono::seconds(60);
  Result<std::unique_ptr<StorageBackend>> opened = OpenStorage(o.url, ns, options);
  if (!opened.ok()) {
    std::fprintf(stderr, "kvtier bench: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<StorageBackend> store(std::move(*opened));
  const double bytes = static_cast<double>(o.tokens * kLayers * kSlotBytes * 2);
  fmt::print(
      "storage hit of {} tokens ({:.0f} MiB, Llama-3-8B pages of {} tokens, {} KiB) from {}, "
      "backend {}, {} repeats (median)\n",
      o.tokens, bytes / (1 << 20), o.page_size, o.page_size * kLayers * kSlotBytes * 2 / 1024,
      RedactUrl(store->url()), o.backend, o.repeats);
  Bench bench(o, backend, store);
  Times unstreamed, streamed;
  Status st = bench.Run(&unstreamed, &streamed);
  store->Close();
  if (!st.ok()) {
    std::fprintf(stderr, "kvtier bench: storage hit: %s\n", st.ToString().c_str());
    return 1;
  }
  const double read = Median(unstreamed.read), load = Median(unstreamed.load);
  auto row = [&](const char* what, double s) {
    fmt::print("  {:<44} {:>9.2f} ms {:>7.2f} GB/s {:>6.2f}x the read\n", what, s * 1e3,
               bytes / s / 1e9, s / read);
  };
  row("read alone (Prefetch -> FinishPrefetch)", read);
  row("load alone (LoadBack of a host hit)", load);
  row("storage hit, unstreamed (stream_load_back=0)", Median(unstreamed.hit));
  row("storage hit, streamed (stream_load_back=1)", Median(streamed.hit));
  if (!unstreamed.pread.empty()) {
    const double pread = Median(unstreamed.pread);
    row(fmt::format("{} threads of pread, the store's page files", store->options().io_threads)
            .c_str(),
        pread);
    fmt::print("the read alone (a prefetch end to end) runs at {:.0f} % of the pread baseline\n",
               100 * pread / read);
  }
  fmt::print("every loaded byte checked: ok\n");
  return 0;
}

}  // namespace kvtier::tools
