// kvtier/page_key.h — the names of cached pages: chained SHA-256 page keys and the deployment
// namespace that keeps incompatible bytes apart.
//
// Page keys are SGLang HiCache's, so a store written by kvtier names pages as SGLang does:
//   key(page 0) = SHA-256(tokens of page 0 as uint32 little-endian)
//   key(page k) = SHA-256(raw 32-byte key(page k-1) ‖ tokens of page k as uint32 LE)
// A key therefore names its whole prefix. A non-empty tenant salt seeds the chain:
//   key(page 0) = SHA-256(SHA-256(salt) ‖ tokens of page 0)
// so two tenants never share a key; an empty salt gives SGLang's keys. Only whole pages are keyed.
// Keys are 32-byte values in memory; hex (64 lowercase characters) only at the edges (file names,
// Redis keys, Python).
//
// A `StorageNamespace` describes what makes stored bytes incompatible (model, KV dtype, layout,
// slot bytes, layers, page size, head split / tensor-parallel rank and size). Every stored object
// is named `<namespace name>/<key hex>` and repeats the namespace hash in its header, so two
// deployments never read each other's pages.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier {

// A 32-byte SHA-256 digest naming one page and, through the chain, its whole prefix.
struct PageKey {
  std::array<uint8_t, 32> bytes{};

  // 64 lowercase hex characters.
  std::string Hex() const;
  // Inverse of Hex(); InvalidArgument unless exactly 64 hex characters (either case).
  static Result<PageKey> FromHex(std::string_view hex);

  friend bool operator==(const PageKey&, const PageKey&) = default;
  friend auto operator<=>(const PageKey&, const PageKey&) = default;
};

// Hash for unordered containers (the key is already uniformly distributed: its first 8 bytes).
struct PageKeyHash {
  size_t operator()(const PageKey& key) const noexcept;
};

// The value that seeds a tenant's chain: nullopt for the empty salt (SGLang's keys), else
// SHA-256(salt). Pass it as `previous` for the first page of a prompt.
std::optional<PageKey> ChainSeed(std::string_view salt);

// Keys of the whole pages of `tokens` (tokens.size() / page_size of them; a trailing partial page
// is not keyed), chained after `previous` (the key of the page before tokens[0], or the chain seed
// for the first page of a prompt, or nullopt for an unsalted chain start).
// InvalidArgument for a page_size outside [1, 2^20] or a token outside [0, 2^32).
Result<std::vector<PageKey>> ComputePageKeys(std::span<const int32_t> tokens, int64_t page_size,
                                             const std::optional<PageKey>& previous);
Result<std::vector<PageKey>> ComputePageKeys(std::span<const int64_t> tokens, int64_t page_size,
                                             const std::optional<PageKey>& previous);
// Convenience: the keys of a prompt from its start under `salt`.
Result<std::vector<PageKey>> ComputePromptPageKeys(std::span<const int32_t> tokens,
                                                   int64_t page_size, std::string_view salt = "");

// What makes the bytes of a stored page incompatible between deployments.
struct StorageNamespace {
  std::string model_id;                    // e.g. "meta-llama/Llama-3-8B"; free text, hashed
  std::string kv_dtype = "bf16";           // free text, hashed ("bf16", "fp8_e4m3", ...)
  KvLayout layout = KvLayout::kPageFirst;  // the host layout the payload is written in
  bool mla = false;                        // one buffer per page instead of K and V
  int64_t num_layers = 0;
  int64_t slot_bytes = 0;  // of one buffer (K, V or MLA), one token, one layer
  int64_t page_size = 0;
  int64_t head_num = 1;  // heads in slot_bytes (the head split of this rank)
  int64_t tp_rank = 0;
  int64_t tp_size = 1;

  // InvalidArgument naming the field: positive sizes, page_size a power of two in [1, 256],
  // 0 <= tp_rank < tp_size, slot_bytes a multiple of head_num.
  Status Validate() const;
  // Bytes of one page's payload: num_buffers * num_layers * page_size * slot_bytes.
  int64_t page_bytes() const;
  // 64-bit hash of every field above (from SHA-256 of a canonical text form); stored in headers.
  uint64_t Hash() const;
  // The object-name prefix: "kv" + 16 lowercase hex digits of Hash(). Path- and key-safe.
  std::string Name() const;
  // Human-readable form of the fields, for logs and `kvtier` output.
  std::string Describe() const;
};

// Whose pages a namespace holds: the fields of a StorageNamespace that no pool's shape gives.
struct StorageOwner {
  std::string model_id;
  std::string kv_dtype = "bf16";
  int64_t tp_rank = 0;
  int64_t tp_size = 1;
};

// The namespace of pages shaped as a pool of geometry `pages` (its layout, num_layers,
// slot_bytes, page_size and head_num; num_slots is not part of it) with `mla`, held by `owner`:
// the one place a StorageNamespace is filled from a pool's shape. Not validated (Validate).
StorageNamespace StorageNamespaceOf(const KvGeometry& pages, bool mla, const StorageOwner& owner);

}  // namespace kvtier
