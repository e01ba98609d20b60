// A worker process for the multi-process shared host pool tests
// (shared_host_pool_multiprocess_test.cc, shared_host_pool_gpu_test.cc): attaches to a segment
// by name and runs a workload on it, checking every byte it reads.
//
//   shared_host_pool_worker name=N mode=M [seed=S] [iterations=I] [prompts=P] [families=F]
//                           [max_pages=K] [pages=N] [hold=WHERE] [stop_file=PATH] [pause_us=U]
//
// mode=mixed  for each of `iterations` prompts (0 = until the file `stop_file` exists, or
//             forever): pin and check the cached prefix,
//             publish the prompt, check again. Prompt i is WorkloadPrompt(seed, i % prompts)
//             of tenant i % 2. Prints "hits=H published=P" and exits 0; exits 1 on the first
//             wrong byte or error (message on stderr).
// mode=hold   writes "A" once attached, runs mixed, but stops for good at `hold` after writing
//             "R" to stdout (`hold=random`: never stops; the parent kills it at a random time):
//             an index hook point (reserve:popped, reserve:writing, commit:ready, pin:counted,
//             evict:unlinked: the index lock held), mid-write (pages WRITING, half written) or
//             mid-read (pages pinned). The parent kills it there.
// mode=gpu    (two of these run at once on one GPU) publishes prompts i with i % 2 == parity
//             through the GPU (pattern -> device -> shared pages with the kernel backend) and
//             loads every prompt's cached prefix from the shared pages to the GPU with the kernel
//             backend, copies it back and checks it, until every prompt was fully loaded once.
//             Exits 3 when no GPU backend is available.
//
// Also linked into shared_host_pool_multiprocess_test (KVTIER_SHM_WORKER_IN_TEST: no main), which
// runs RunSharedHostPoolWorker in fork()ed children where exec would cost too much.
//
// Thread safety: a single-threaded program.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/transfer.h"
#include "pool/shared_host_pool_test_util.h"
#include "pool/shared_host_pool_worker_process.h"
#include "pool/shm_page_index.h"
#include "support/kv_test_util.h"

namespace kvtier::testing {
namespace {

std::map<std::string, std::string> g_args;
std::string g_hold_at;

std::string Arg(const std::string& key, const std::string& fallback) {
  auto it = g_args.find(key);
  return it == g_args.end() ? fallback : it->second;
}
int64_t IntArg(const std::string& key, int64_t fallback) {
  auto it = g_args.find(key);
  return it == g_args.end() ? fallback : std::strtoll(it->second.c_str(), nullptr, 10);
}

// Tells the parent where it stopped, then waits to be killed.
[[noreturn]] void StopHere() {
  (void)!write(STDOUT_FILENO, "R", 1);
  for (;;) pause();
}

void HoldHook(const char* where) {
  if (g_hold_at == where) StopHere();
}

int Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "shared_host_pool_worker %d: %s: %s\n", getpid(), what.c_str(),
               s.ToString().c_str());
  return 1;
}

struct Workload {
  uint64_t seed;
  int64_t prompts;
  int families;
  int64_t max_pages;
  std::vector<Tenant> tenants = WorkloadTenants();

  const Tenant& tenant(int64_t i) const { return tenants[static_cast<size_t>(i % 2)]; }
  Result<PromptPages> Prompt(const SharedHostPool& pool, int64_t i) const {
    const std::vector<Token> tokens =
        WorkloadPrompt(seed, i % prompts, families, max_pages, pool.page_size());
    return PagesOf(tokens, pool.page_size(), tenant(i % prompts));
  }
};

int RunMixed(SharedHostPool& pool, const Workload& w, int64_t iterations) {
  int64_t hits = 0;
  PublishStats stats;
  const std::string stop_file = Arg("stop_file", "");
  const int64_t pause_us = IntArg("pause_us", 0);  // between prompts: leave the CPU to others
  for (int64_t i = 0; iterations == 0 || i < iterations; ++i) {
    if (!stop_file.empty() && access(stop_file.c_str(), F_OK) == 0) break;
    if (pause_us > 0) usleep(static_cast<useconds_t>(pause_us));
    auto prompt = w.Prompt(pool, i);
    if (!prompt.ok()) return Fail("prompt", prompt.status());
    const Tenant& tenant = w.tenant(i % w.prompts);
    auto hit = CheckPrefix(pool, tenant, *prompt);
    if (!hit.ok()) return Fail("prompt " + std::to_string(i) + " before publishing", hit.status());
    hits += *hit;
    if (g_hold_at == "mid-write") {
      auto r = pool.Reserve(tenant.namespace_hash, prompt->keys);
      if (!r.ok()) return Fail("reserve", r.status());
      for (size_t k = 0; k < r->size(); ++k) {
        if ((*r)[k].outcome != ReserveOutcome::kReserved) continue;
        const int64_t page = (*r)[k].page;
        std::vector<int64_t> slots = pool.PageSlots({&page, 1});
        const int64_t p = pool.page_size();
        // Half the page's tokens written, the rest still whatever the page held before.
        Status s = FillKvPattern(pool.region(), std::span<const int64_t>(slots).first(p / 2),
                                 std::span<const uint64_t>(prompt->hashes).subspan(k * p, p / 2));
        if (!s.ok()) return Fail("fill", s);
        StopHere();
      }
      continue;
    }
    Status s = Publish(pool, tenant, *prompt, &stats);
    if (!s.ok()) return Fail("publish prompt " + std::to_string(i), s);
    if (g_hold_at == "mid-read") {
      auto pages = pool.PinPrefix(tenant.namespace_hash, prompt->keys);
      if (!pages.ok()) return Fail("pin", pages.status());
      if (!pages->empty()) StopHere();
    }
    hit = CheckPrefix(pool, tenant, *prompt);
    if (!hit.ok()) return Fail("prompt " + std::to_string(i) + " after publishing", hit.status());
    hits += *hit;
  }
  std::printf("hits=%lld published=%lld\n", static_cast<long long>(hits),
              static_cast<long long>(stats.reserved));
  return 0;
}

int RunGpu(SharedHostPool& pool, const Workload& w) {
  if (CudaDeviceCount() == 0) return 3;
  auto engine = MakeTransferEngine(TransferBackend::kKernel);
  if (!engine.ok()) return engine.status().IsUnavailable() ? 3 : Fail("engine", engine.status());
  if (!pool.cuda_registered()) return Fail("pool", Status::Internal("not registered with CUDA"));
  const int64_t p = pool.page_size();
  const int64_t slots = w.max_pages * p;
  KvGeometry dg = pool.geometry();
  dg.layout = KvLayout::kLayerFirst;
  dg.num_slots = slots;
  auto device = DeviceKvPool::Create(dg, pool.region().mla);
  if (!device.ok()) return Fail("device pool", device.status());
  const KvRegion device_region = device->region();
  KvGeometry hg = dg;
  HostRegion staging(hg, pool.region().mla);  // pattern in, and the checked copy back out
  // The kernel backend reads and writes pinned host memory only.
  std::vector<PinnedRegistration> pinned;
  for (int b = 0; b < staging.region().num_buffers(); ++b) {
    auto reg = PinnedRegistration::Register(staging.region().LayerBase(b, 0), hg.buffer_bytes());
    if (!reg.ok()) return Fail("pinning the staging region", reg.status());
    pinned.push_back(std::move(*reg));
  }
  auto stream = CudaStreamHandle::Create();
  if (!stream.ok()) return Fail("stream", stream.status());
  TransferOptions options;
  options.stream = stream->get();
  const auto copy = [&](const KvRegion& src, const KvRegion& dst, const std::vector<int64_t>& s,
                        const std::vector<int64_t>& d) -> Status {
    KVTIER_RETURN_IF_ERROR((*engine)->Transfer(
        TransferRequest::AllLayers(src, dst, SlotIndices::Host(s), SlotIndices::Host(d)), options));
    return (*engine)->Synchronize(stream->get());
  };
  std::vector<int64_t> identity(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) identity[i] = i;

  std::vector<bool> loaded(static_cast<size_t>(w.prompts), false);
  int64_t remaining = w.prompts;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int64_t loaded_pages = 0;
  for (int64_t i = 0; remaining > 0; i = (i + 1) % w.prompts) {
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail("gpu", Status::Unavailable("not every prompt was published within 60 s"));
    }
    auto prompt = w.Prompt(pool, i);
    if (!prompt.ok()) return Fail("prompt", prompt.status());
    const Tenant& tenant = w.tenant(i);
    const int64_t n = static_cast<int64_t>(prompt->keys.size());
    if (i % 2 == IntArg("parity", 0)) {
      // Publish through the GPU: pattern -> staging -> device -> reserved shared pages.
      auto r = pool.Reserve(tenant.namespace_hash, prompt->keys);
      if (!r.ok()) return Fail("reserve", r.status());
      std::vector<int64_t> pages, dev_slots;
      for (int64_t k = 0; k < n; ++k) {
        if ((*r)[k].outcome != ReserveOutcome::kReserved) continue;
        pages.push_back((*r)[k].page);
        for (int64_t o = 0; o < p; ++o) dev_slots.push_back(k * p + o);
      }
      if (!pages.empty()) {
        std::vector<int64_t> first(identity.begin(), identity.begin() + n * p);
        Status s = FillKvPattern(staging.region(), first, prompt->hashes);
        if (s.ok()) s = copy(staging.region(), device_region, first, first);
        if (s.ok()) s = copy(device_region, pool.region(), dev_slots, pool.PageSlots(pages));
        if (s.ok()) s = pool.Commit(pages);
        if (!s.ok()) return Fail("gpu publish", s);
      }
    }
    if (loaded[i]) continue;
    // Load the cached prefix to the GPU (poisoned first), copy it back, check it.
    auto pages = pool.PinPrefix(tenant.namespace_hash, prompt->keys);
    if (!pages.ok()) return Fail("pin", pages.status());
    const int64_t hit = static_cast<int64_t>(pages->size());
    staging.Fill(kPoison);
    std::vector<int64_t> dst(identity.begin(), identity.begin() + hit * p);
    Status s = copy(staging.region(), device_region, identity, identity);  // poison the device
    if (s.ok() && hit > 0) s = copy(pool.region(), device_region, pool.PageSlots(*pages), dst);
    Status unpinned = pool.Unpin(*pages);
    if (s.ok()) s = unpinned;
    if (s.ok()) s = copy(device_region, staging.region(), identity, identity);
    if (s.ok() && hit > 0) {
      s = VerifyKvPattern(staging.region(), dst,
                          std::span<const uint64_t>(prompt->hashes).first(hit * p));
    }
    if (!s.ok()) return Fail("gpu load of prompt " + std::to_string(i), s);
    loaded_pages += hit;
    if (hit == n) {
      loaded[i] = true;
      --remaining;
    }
  }
  std::printf("gpu loaded_pages=%lld\n", static_cast<long long>(loaded_pages));
  return 0;
}

}  // namespace

int RunSharedHostPoolWorker(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "shared_host_pool_worker: argument '%s' is not key=value\n", argv[i]);
      return 2;
    }
    g_args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  const std::string mode = Arg("mode", "mixed");
  SharedHostPoolAttachOptions options;
  if (g_args.count("pages") != 0) {
    options.expected_geometry = SmallSharedGeometry(IntArg("pages", 0));
  }
  auto pool = SharedHostPool::Attach(Arg("name", ""), options);
  if (!pool.ok()) return Fail("attach", pool.status());
  if (mode == "hold") (void)!write(STDOUT_FILENO, "A", 1);  // attached
  Workload w{static_cast<uint64_t>(IntArg("seed", 1)), IntArg("prompts", 64),
             static_cast<int>(IntArg("families", 4)), IntArg("max_pages", 6)};
  if (mode == "hold") {
    g_hold_at = Arg("hold", "");
    if (g_hold_at.find(':') != std::string::npos) shm::SetInLockHook(HoldHook);
    return RunMixed(**pool, w, 0);
  }
  if (mode == "gpu") return RunGpu(**pool, w);
  return RunMixed(**pool, w, IntArg("iterations", 100));
}

}  // namespace kvtier::testing

#if !defined(KVTIER_SHM_WORKER_IN_TEST)
int main(int argc, char** argv) { return kvtier::testing::RunSharedHostPoolWorker(argc, argv); }
#endif
