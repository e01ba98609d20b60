// Test support for the shared host pool: a deterministic workload of prompts with overlapping
// prefixes, publishing a prompt's pages (pattern bytes) and checking a prompt's cached prefix
// byte for byte. Shared by the tests and the worker process (shared_host_pool_worker.cc).
//
// Thread safety: the functions use only their arguments (and the pool's own locking).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/status.h"
#include "kvtier/testing/kv_pattern.h"

namespace kvtier::testing {

// The small geometry every multi-process test uses: page_first, K and V, 2 layers of 32-byte
// slots, pages of 4 tokens, `num_pages` pages.
inline KvGeometry SmallSharedGeometry(int64_t num_pages) {
  KvGeometry g;
  g.layout = KvLayout::kPageFirst;
  g.num_layers = 2;
  g.slot_bytes = 32;
  g.page_size = 4;
  g.head_num = 1;
  g.num_slots = num_pages * g.page_size;
  return g;
}

// A segment name unique to this process and call, removed (if it exists) on destruction.
class ScopedSegmentName {
 public:
  explicit ScopedSegmentName(const std::string& tag) {
    static std::atomic<int> counter{0};
    name_ = "kvtier-test-" + tag + "-" + std::to_string(getpid()) + "-" +
            std::to_string(counter.fetch_add(1));
  }
  ScopedSegmentName(const ScopedSegmentName&) = delete;
  ScopedSegmentName& operator=(const ScopedSegmentName&) = delete;
  ~ScopedSegmentName() { (void)SharedHostPool::Destroy(name_); }
  const std::string& get() const { return name_; }

 private:
  std::string name_;
};

// A tenant: the salt of its key chain and pattern, and the deployment namespace hash.
struct Tenant {
  std::string salt;
  uint64_t namespace_hash = 0;
};

// Prompt `index` of a workload: one of `families` shared base sequences, cut at a random whole
// number of pages, followed by a random tail; 1 to `max_pages` whole pages in all. A pure
// function of (seed, index), so another process can regenerate every prompt a worker used.
inline std::vector<Token> WorkloadPrompt(uint64_t seed, int64_t index, int families,
                                         int64_t max_pages, int64_t page_size) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(index));
  const int family = static_cast<int>(rng() % static_cast<uint64_t>(families));
  const int64_t pages = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_pages));
  const int64_t shared_pages = static_cast<int64_t>(rng() % static_cast<uint64_t>(pages + 1));
  std::mt19937_64 base(0xBA5E + static_cast<uint64_t>(family));
  std::vector<Token> tokens(static_cast<size_t>(pages * page_size));
  for (int64_t i = 0; i < pages * page_size; ++i) {
    const uint64_t b = base();
    tokens[i] = static_cast<Token>((i < shared_pages * page_size ? b : rng()) % 50000);
  }
  return tokens;
}

struct PromptPages {
  std::vector<PageKey> keys;     // one per whole page
  std::vector<uint64_t> hashes;  // one per token (the pattern)
};

inline Result<PromptPages> PagesOf(std::span<const Token> tokens, int64_t page_size,
                                   const Tenant& tenant) {
  PromptPages out;
  KVTIER_ASSIGN_OR_RETURN(out.keys, ComputePromptPageKeys(tokens, page_size, tenant.salt));
  out.hashes = KvPatternHashes(tokens, KvPatternSalt(tenant.salt));
  return out;
}

// Checks host page `page` against prompt page `k`: Corruption naming both on a mismatch.
inline Status VerifyPage(const SharedHostPool& pool, int64_t page, const PromptPages& prompt,
                         size_t k) {
  const int64_t p = pool.page_size();
  const std::vector<int64_t> slots = pool.PageSlots(std::span<const int64_t>(&page, 1));
  return VerifyKvPattern(pool.region(), slots,
                         std::span<const uint64_t>(prompt.hashes).subspan(k * p, p))
      .WithContext("host page " + std::to_string(page) + " (prompt page " + std::to_string(k) +
                   ")");
}

struct PublishStats {
  int64_t reserved = 0, already_ready = 0, being_written = 0, no_space = 0;
};

// Reserves every page of the prompt (each with its parent, the page before it), writes the
// reserved ones and commits them.
inline Status Publish(SharedHostPool& pool, const Tenant& tenant, const PromptPages& prompt,
                      PublishStats* stats) {
  std::vector<std::optional<PageKey>> parents(prompt.keys.size());
  for (size_t k = 1; k < prompt.keys.size(); ++k) parents[k] = prompt.keys[k - 1];
  KVTIER_ASSIGN_OR_RETURN(std::vector<PageReservation> reservations,
                          pool.Reserve(tenant.namespace_hash, prompt.keys, parents));
  std::vector<int64_t> written;
  const int64_t p = pool.page_size();
  for (size_t k = 0; k < reservations.size(); ++k) {
    switch (reservations[k].outcome) {
      case ReserveOutcome::kReserved: {
        ++stats->reserved;
        const int64_t page = reservations[k].page;
        const std::vector<int64_t> slots = pool.PageSlots(std::span<const int64_t>(&page, 1));
        KVTIER_RETURN_IF_ERROR(FillKvPattern(
            pool.region(), slots, std::span<const uint64_t>(prompt.hashes).subspan(k * p, p)));
        written.push_back(page);
        break;
      }
      case ReserveOutcome::kAlreadyReady:
        ++stats->already_ready;
        break;
      case ReserveOutcome::kBeingWritten:
        ++stats->being_written;
        break;
      case ReserveOutcome::kNoSpace:
      case ReserveOutcome::kNoParent:  // an earlier page found no room
        ++stats->no_space;
        break;
    }
  }
  return pool.Commit(written);
}

// Pins the cached prefix of the prompt, checks every byte of it, unpins; returns its pages.
inline Result<int64_t> CheckPrefix(SharedHostPool& pool, const Tenant& tenant,
                                   const PromptPages& prompt,
                                   std::vector<int64_t>* seen_pages = nullptr) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> pages,
                          pool.PinPrefix(tenant.namespace_hash, prompt.keys));
  Status verified;
  for (size_t k = 0; k < pages.size() && verified.ok(); ++k) {
    verified = VerifyPage(pool, pages[k], prompt, k);
  }
  if (seen_pages != nullptr) seen_pages->insert(seen_pages->end(), pages.begin(), pages.end());
  KVTIER_RETURN_IF_ERROR(pool.Unpin(pages));
  KVTIER_RETURN_IF_ERROR(verified);
  return static_cast<int64_t>(pages.size());
}

// The two tenants of the workload: an unsalted one and a salted one, in two namespaces.
inline std::vector<Tenant> WorkloadTenants() {
  return {Tenant{"", 0x1111222233334444ULL}, Tenant{"tenant-b", 0x5555666677778888ULL}};
}

// Checks every READY page that any prompt (seed, 0..prompts-1) of the workload names, one key at
// a time (so pages behind an evicted one are checked too); adds the checked pages to `seen`.
inline Status CheckEveryPage(SharedHostPool& pool, uint64_t seed, int64_t prompts, int families,
                             int64_t max_pages, std::set<int64_t>* seen) {
  const std::vector<Tenant> tenants = WorkloadTenants();
  for (int64_t i = 0; i < prompts; ++i) {
    const Tenant& tenant = tenants[static_cast<size_t>(i % 2)];
    const std::vector<Token> tokens =
        WorkloadPrompt(seed, i, families, max_pages, pool.page_size());
    KVTIER_ASSIGN_OR_RETURN(PromptPages prompt, PagesOf(tokens, pool.page_size(), tenant));
    for (size_t k = 0; k < prompt.keys.size(); ++k) {
      KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> page,
                              pool.PinPrefix(tenant.namespace_hash,
                                             std::span<const PageKey>(prompt.keys).subspan(k, 1)));
      Status s = page.empty() ? Status::OK() : VerifyPage(pool, page[0], prompt, k);
      KVTIER_RETURN_IF_ERROR(pool.Unpin(page));
      KVTIER_RETURN_IF_ERROR(
          s.WithContext("seed " + std::to_string(seed) + " prompt " + std::to_string(i)));
      if (!page.empty()) seen->insert(page[0]);
    }
  }
  return Status::OK();
}

}  // namespace kvtier::testing
