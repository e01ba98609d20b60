// Multi-process tests of SharedHostPool, with worker processes (fork + exec of
// shared_host_pool_worker) on one segment:
// The 4 processes are exec()ed; the 50 victims of the crash test are fork()ed, to keep it to
// seconds under the sanitizers too.
//   - 4 processes inserting and matching overlapping prefixes of two tenants at once: every page
//     any of them reads is byte-exact, and afterwards the index invariants hold and every READY
//     page holds exactly the bytes of its key;
//   - 50 times a worker is SIGKILLed at a chosen or random point (holding the index lock inside
//     each operation, mid-write, mid-read, anywhere): a survivor process and this one keep
//     working throughout, no lock is left dead, the killed process's pages and references are
//     reclaimed, and at the end no READY page has a wrong byte;
//   - process records of dead processes are reused; a fork()ed child must attach again.
// Not run under TSan (TSan does not follow processes); the threads of one process are tested by
// shared_host_pool_concurrency_test.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/shared_host_pool.h"
#include "pool/shared_host_pool_test_util.h"
#include "pool/shared_host_pool_worker_process.h"
#include "pool/shm_page_index.h"
#include "pool/shm_segment.h"
#include "support/kv_test_util.h"

namespace kvtier {
namespace {

using testing::ScopedSegmentName;
using testing::SmallSharedGeometry;
using testing::Tenant;
using testing::Worker;

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::kvtier::Status s_ = (expr);                     \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

constexpr int kFamilies = 4;
constexpr int64_t kMaxPages = 6;

std::unique_ptr<SharedHostPool> MustCreate(const std::string& name, int64_t num_pages) {
  SharedHostPoolConfig c;
  c.name = name;
  c.geometry = SmallSharedGeometry(num_pages);
  c.max_processes = 16;
  c.register_with_cuda = false;
  auto created = SharedHostPool::Create(c);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return created.ok() ? std::move(created).value() : nullptr;
}

std::vector<std::string> WorkerArgs(const std::string& name, const std::string& mode, uint64_t seed,
                                    int64_t prompts) {
  return {"name=" + name,
          "mode=" + mode,
          "seed=" + std::to_string(seed),
          "prompts=" + std::to_string(prompts),
          "families=" + std::to_string(kFamilies),
          "max_pages=" + std::to_string(kMaxPages)};
}

TEST(SharedHostPoolMultiProcessTest, FourProcessesShareOverlappingPrefixesByteExact) {
  ScopedSegmentName name("four");
  auto pool = MustCreate(name.get(), 48);
  ASSERT_NE(pool, nullptr);
  constexpr int64_t kPrompts = 48;
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    std::vector<std::string> args = WorkerArgs(name.get(), "mixed", seed, kPrompts);
    args.push_back("iterations=600");
    args.push_back("pages=48");  // and check the geometry on attach
    workers.push_back(std::make_unique<Worker>(args));
  }
  int64_t hits = 0;
  for (auto& w : workers) {
    std::string out;
    ASSERT_EQ(w->Wait(120000, &out), 0) << "worker " << w->pid() << " printed: " << out;
    long long h = 0, published = 0;
    ASSERT_EQ(std::sscanf(out.c_str(), "hits=%lld published=%lld", &h, &published), 2) << out;
    hits += h;
  }
  EXPECT_GT(hits, 0);  // prefixes were matched across processes, not just written

  ASSERT_OK(pool->CheckInvariants());
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->writing_pages, 0);
  EXPECT_EQ(info->pinned_pages, 0);
  EXPECT_EQ(info->processes.size(), 1u);  // the workers detached
  EXPECT_EQ(info->reaped_processes, 0);
  EXPECT_GT(info->evictions, 0);
  std::set<int64_t> seen;
  for (uint64_t seed = 1; seed <= 4; ++seed)
    ASSERT_OK(testing::CheckEveryPage(*pool, seed, kPrompts, kFamilies, kMaxPages, &seen));
  EXPECT_EQ(static_cast<int64_t>(seen.size()), info->ready_pages);
  ASSERT_OK(pool->CheckInvariants());
}

TEST(SharedHostPoolMultiProcessTest, KilledProcessesCostOnlyTheirOwnPages) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ScopedSegmentName name("crash");
  auto pool = MustCreate(name.get(), 24);
  ASSERT_NE(pool, nullptr);
  constexpr int64_t kPrompts = 16;
  const std::string stop_file = "/tmp/" + name.get() + ".stop";
  // The survivor runs through every kill below.
  std::vector<std::string> survivor_args = WorkerArgs(name.get(), "mixed", 1000, kPrompts);
  survivor_args.push_back("iterations=0");
  survivor_args.push_back("stop_file=" + stop_file);
  survivor_args.push_back("pause_us=200");  // busy, but leaves the CPU to the kills
  Worker survivor(survivor_args, testing::WorkerStart::kFork);

  const std::vector<std::string> kHolds = {"reserve:popped", "reserve:writing", "commit:ready",
                                           "pin:counted",    "evict:unlinked",  "mid-write",
                                           "mid-read",       "random"};
  int lock_holds = 0;
  const std::vector<Tenant> tenants = testing::WorkloadTenants();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) {
    const std::string& hold = kHolds[static_cast<size_t>(i) % kHolds.size()];
    SCOPED_TRACE("kill " + std::to_string(i) + " at " + hold);
    const uint64_t worker_seed = 100 + static_cast<uint64_t>(i);
    std::vector<std::string> args = WorkerArgs(name.get(), "hold", worker_seed, kPrompts);
    args.push_back("hold=" + hold);
    Worker victim(args, testing::WorkerStart::kFork);
    ASSERT_TRUE(victim.WaitFor('A', 60000)) << "the worker did not attach (a hang)";
    if (hold == "random") {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 5000));
    } else {
      ASSERT_TRUE(victim.WaitFor('R', 60000)) << "the worker never reached " << hold << " (a hang)";
      if (hold.find(':') != std::string::npos) ++lock_holds;
    }
    const pid_t dead = victim.pid();
    victim.Kill();

    // This process keeps working (the first lock after a kill inside the lock repairs)...
    const int64_t index = static_cast<int64_t>(rng() % kPrompts);
    auto prompt = testing::PagesOf(testing::WorkloadPrompt(7, index, kFamilies, kMaxPages, 4), 4,
                                   tenants[index % 2]);
    ASSERT_TRUE(prompt.ok());
    testing::PublishStats stats;
    ASSERT_OK(testing::Publish(*pool, tenants[index % 2], *prompt, &stats));
    ASSERT_TRUE(testing::CheckPrefix(*pool, tenants[index % 2], *prompt).ok());
    // ...and what the dead one held is released.
    ASSERT_TRUE(pool->ReapDeadProcesses().ok());
    auto info = pool->Inspect();
    ASSERT_TRUE(info.ok());
    for (const auto& p : info->processes) {
      EXPECT_NE(p.pid, dead);
      EXPECT_TRUE(p.alive) << "pid " << p.pid;
    }
    ASSERT_OK(pool->CheckInvariants());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // The survivor worked through all of it without a wrong byte.
  std::FILE* f = std::fopen(stop_file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  std::string out;
  const int code = survivor.Wait(60000, &out);
  std::remove(stop_file.c_str());
  ASSERT_EQ(code, 0) << out;

  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->writing_pages, 0);
  EXPECT_EQ(info->pinned_pages, 0);
  EXPECT_EQ(info->processes.size(), 1u);
  EXPECT_GE(info->lock_recoveries, lock_holds);
  EXPECT_EQ(info->reaped_processes, 50);
  EXPECT_GT(info->reclaimed_writing_pages, 0);
  EXPECT_GT(info->dropped_refs, 0);
  // No READY page holds a wrong byte: every one is checked against its key's pattern.
  std::set<int64_t> seen;
  ASSERT_OK(testing::CheckEveryPage(*pool, 1000, kPrompts, kFamilies, kMaxPages, &seen));
  ASSERT_OK(testing::CheckEveryPage(*pool, 7, kPrompts, kFamilies, kMaxPages, &seen));
  for (int i = 0; i < 50; ++i)
    ASSERT_OK(testing::CheckEveryPage(*pool, 100 + i, kPrompts, kFamilies, kMaxPages, &seen));
  EXPECT_EQ(static_cast<int64_t>(seen.size()), info->ready_pages);
  ASSERT_OK(pool->CheckInvariants());
  std::printf(
      "50 kills in %.2f s: %lld lock recoveries, %lld processes reaped, %lld WRITING "
      "pages reclaimed, %lld references dropped; %lld of %lld READY pages unreachable (a "
      "parent reclaimed from a killed writer)\n",
      seconds, static_cast<long long>(info->lock_recoveries),
      static_cast<long long>(info->reaped_processes),
      static_cast<long long>(info->reclaimed_writing_pages),
      static_cast<long long>(info->dropped_refs), static_cast<long long>(info->unreachable_pages),
      static_cast<long long>(info->ready_pages));
}

TEST(SharedHostPoolMultiProcessTest, RecordsOfDeadProcessesAreReused) {
  ScopedSegmentName name("records");
  SharedHostPoolConfig c;
  c.name = name.get();
  c.geometry = SmallSharedGeometry(8);
  c.max_processes = 2;
  auto pool = SharedHostPool::Create(c);
  ASSERT_TRUE(pool.ok());
  std::vector<std::string> args = WorkerArgs(name.get(), "hold", 3, 4);
  args.push_back("hold=mid-read");
  Worker victim(args);
  ASSERT_TRUE(victim.WaitFor('R', 60000)) << "the worker never stopped where told (a hang)";
  // Both records held by live processes: a third attach is refused, clearly.
  auto refused = SharedHostPool::Attach(name.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsUnavailable()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("all 2 process records"), std::string::npos);
  victim.Kill();
  auto attached = SharedHostPool::Attach(name.get());
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  auto info = (*attached)->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->reaped_processes, 1);
  EXPECT_GT(info->dropped_refs, 0);
  EXPECT_EQ(info->pinned_pages, 0);
}

TEST(SharedHostPoolMultiProcessTest, ARecordTakenForDeadIsNeverUsedAgain) {
  ScopedSegmentName name("stale");
  auto pool = MustCreate(name.get(), 8);
  ASSERT_NE(pool, nullptr);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // `child` is now a dead pid
  // A record in the dead process's name, made through the index itself (as if that process had
  // attached), then reaped by the pool.
  auto mapping = shm::OpenSegment(name.get());
  ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
  shm::PageIndex index(mapping->data());
  auto slot = index.AttachProcess(child, 0);
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  EXPECT_EQ(pool->ReapDeadProcesses().value(), 1);
  std::vector<PageKey> keys(1);
  auto reserved = index.Reserve(*slot, 1, keys, {});
  ASSERT_FALSE(reserved.ok());
  EXPECT_EQ(reserved.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(reserved.status().message().find("was released as if it had died"), std::string::npos);
  EXPECT_FALSE(index.PinPrefix(*slot, 1, keys).ok());
  // A new attachment may take the record; the stale owner's detach leaves it alone.
  auto other = SharedHostPool::Attach(name.get());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(index.DetachProcess(*slot).ok());
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->processes.size(), 2u);
  ASSERT_OK(pool->CheckInvariants());
}

TEST(SharedHostPoolMultiProcessTest, ForkedChildMustAttachAgain) {
  ScopedSegmentName name("fork");
  auto pool = MustCreate(name.get(), 8);
  ASSERT_NE(pool, nullptr);
  const pid_t child = fork();
  if (child == 0) {
    std::vector<PageKey> keys(1);
    auto inherited = pool->Reserve(1, keys);
    int code = 0;
    if (inherited.ok() || inherited.status().code() != StatusCode::kFailedPrecondition) code = 1;
    auto own = SharedHostPool::Attach(name.get());
    if (!own.ok() || !(*own)->Reserve(1, keys).ok()) code |= 2;
    std::fflush(nullptr);
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The child's own attachment is released after its death (it never detached).
  ASSERT_TRUE(pool->ReapDeadProcesses().ok());
  auto info = pool->Inspect();
  EXPECT_EQ(info->writing_pages, 0);
  EXPECT_EQ(info->processes.size(), 1u);
  ASSERT_OK(pool->CheckInvariants());
}

}  // namespace
}  // namespace kvtier
