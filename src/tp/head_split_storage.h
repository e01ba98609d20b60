// Internal: storage shared across TP sizes (docs/tp.md, "Storage") — a StorageBackend over
// per-head objects.
//
// A rank's page_head host page holds heads [first_head, first_head + H_r) of every buffer, each
// head's P x L x (S/H) bytes contiguous. This adapter stores such a page as H_r objects, one per
// KV head: object (page key, head h) = K bytes of head h ‖ V bytes of head h (MLA: the latent,
// one "head"). So the stored bytes of a page do not depend on the TP size that wrote them: TP=1
// writes heads 0..H-1 of a page, rank r of TP=t writes its H/t of them, and any rank of any TP
// size reads its own heads (as SGLang's tp_lcm_size splits objects, with the finest split).
//
// The inner backend holds the per-head objects; its namespace is HeadObjectNamespace(model): one
// head per slot, layout page_head, tp 0 of 1 — it names the head split, not the TP size. The
// adapter's own namespace describes the rank's pages (what the cache checks against its host
// pool). A page's outcome is its heads' worst (a page is a hit only when every head is).
//
// Thread safety: as every StorageBackend.
#pragma once

#include <memory>

#include "kvtier/page_key.h"
#include "kvtier/storage.h"

namespace kvtier::tp {

// The namespace of per-head objects for pages of `rank_pages` (a rank's page_head pages).
StorageNamespace HeadObjectNamespace(const StorageNamespace& rank_pages);
// The key of head `head` of the page `page`.
PageKey HeadObjectKey(const PageKey& page, int64_t head);

struct HeadSplitOptions {
  int64_t first_head = 0;  // the rank's first KV head (MHA: rank * H / tp; MLA: 0)
  // Sets write nothing (every page kSkipped): MLA followers, whose leader is the one writer.
  bool read_only = false;
  StorageOptions options;  // the adapter's own queue and threads
};

// An adapter for the pages `rank_pages` describes (layout page_head) over `inner`, whose
// namespace must be HeadObjectNamespace(rank_pages). InvalidArgument naming the mismatch.
Result<std::unique_ptr<StorageBackend>> OpenHeadSplitStorage(std::shared_ptr<StorageBackend> inner,
                                                             const StorageNamespace& rank_pages,
                                                             const HeadSplitOptions& options);

}  // namespace kvtier::tp
