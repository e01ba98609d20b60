// Page keys (chained SHA-256, SGLang HiCache's scheme) and the deployment namespace.
//
// Hashing goes through OpenSSL's EVP interface with the SHA-256 implementation fetched once and
// one digest context per thread, reused for every page: a prompt of 512 pages costs 512 small
// digests and no allocation beyond the result vector.
//
// Thread safety: pure functions; the per-thread digest context is thread_local.
#include "kvtier/page_key.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <bit>
#include <cstring>
#include <memory>

namespace kvtier {
namespace {

constexpr int64_t kMaxPageSize = int64_t{1} << 20;
constexpr char kHexDigits[] = "0123456789abcdef";

// The SHA-256 implementation, fetched once for the process (the explicit fetch avoids a provider
// lookup per digest).
const EVP_MD* Sha256() {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

// A digest context per thread, reused across calls.
EVP_MD_CTX* ThreadDigestContext() {
  thread_local std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  return ctx.get();
}

// SHA-256 of a ‖ b into `out`. Returns false only if OpenSSL fails (no SHA-256 provider, OOM).
bool Sha256Of(std::span<const uint8_t> a, std::span<const uint8_t> b, uint8_t* out) {
  EVP_MD_CTX* ctx = ThreadDigestContext();
  const EVP_MD* md = Sha256();
  if (ctx == nullptr || md == nullptr) return false;
  unsigned int len = 0;
  return EVP_DigestInit_ex(ctx, md, nullptr) == 1 &&
         (a.empty() || EVP_DigestUpdate(ctx, a.data(), a.size()) == 1) &&
         (b.empty() || EVP_DigestUpdate(ctx, b.data(), b.size()) == 1) &&
         EVP_DigestFinal_ex(ctx, out, &len) == 1 && len == 32;
}

// Stores `value` little-endian at `out`.
inline void StoreLe32(uint32_t value, uint8_t* out) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out, &value, 4);
  } else {
    out[0] = static_cast<uint8_t>(value);
    out[1] = static_cast<uint8_t>(value >> 8);
    out[2] = static_cast<uint8_t>(value >> 16);
    out[3] = static_cast<uint8_t>(value >> 24);
  }
}

template <typename TokenT>
Result<std::vector<PageKey>> ComputeKeys(std::span<const TokenT> tokens, int64_t page_size,
                                         const std::optional<PageKey>& previous) {
  if (page_size < 1 || page_size > kMaxPageSize) {
    return Status::InvalidArgument(
        fmt::format("page_size must be in [1, {}], got {}", kMaxPageSize, page_size));
  }
  const int64_t num_pages = static_cast<int64_t>(tokens.size()) / page_size;
  // Check every keyed token first, so a bad token anywhere fails the call before any hashing.
  for (int64_t i = 0; i < num_pages * page_size; ++i) {
    const int64_t t = static_cast<int64_t>(tokens[static_cast<size_t>(i)]);
    if (t < 0 || t > int64_t{0xFFFFFFFF}) {
      return Status::InvalidArgument(
          fmt::format("token {} at position {} is outside [0, 2^32)", t, i));
    }
  }
  std::vector<PageKey> keys(static_cast<size_t>(num_pages));
  std::vector<uint8_t> page_bytes(static_cast<size_t>(page_size) * 4);
  const PageKey* prev = previous ? &*previous : nullptr;
  for (int64_t p = 0; p < num_pages; ++p) {
    const TokenT* page_tokens = tokens.data() + p * page_size;
    for (int64_t j = 0; j < page_size; ++j) {
      StoreLe32(static_cast<uint32_t>(page_tokens[j]), page_bytes.data() + j * 4);
    }
    std::span<const uint8_t> chain;
    if (prev != nullptr) chain = std::span<const uint8_t>(prev->bytes);
    PageKey& key = keys[static_cast<size_t>(p)];
    if (!Sha256Of(chain, page_bytes, key.bytes.data())) {
      return Status::Internal("OpenSSL SHA-256 failed (no SHA256 provider?)");
    }
    prev = &key;
  }
  return keys;
}

}  // namespace

std::string PageKey::Hex() const {
  std::string hex(64, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    hex[2 * i] = kHexDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kHexDigits[bytes[i] & 0xF];
  }
  return hex;
}

Result<PageKey> PageKey::FromHex(std::string_view hex) {
  if (hex.size() != 64) {
    return Status::InvalidArgument(
        fmt::format("a page key is 64 hex characters, got {} characters", hex.size()));
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  PageKey key;
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]);
    const int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument(fmt::format("page key has a non-hex character at position {}",
                                                 hi < 0 ? 2 * i : 2 * i + 1));
    }
    key.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return key;
}

size_t PageKeyHash::operator()(const PageKey& key) const noexcept {
  uint64_t h;
  std::memcpy(&h, key.bytes.data(), sizeof(h));
  return static_cast<size_t>(h);
}

std::optional<PageKey> ChainSeed(std::string_view salt) {
  if (salt.empty()) return std::nullopt;
  PageKey seed;
  const std::span<const uint8_t> salt_bytes(reinterpret_cast<const uint8_t*>(salt.data()),
                                            salt.size());
  if (!Sha256Of(salt_bytes, {}, seed.bytes.data())) {
    // Cannot happen with a working libcrypto; an all-zero seed still differs from the unsalted
    // chain (which has no seed at all), so tenants stay apart from SGLang's keys.
    seed.bytes.fill(0);
  }
  return seed;
}

Result<std::vector<PageKey>> ComputePageKeys(std::span<const int32_t> tokens, int64_t page_size,
                                             const std::optional<PageKey>& previous) {
  return ComputeKeys(tokens, page_size, previous);
}

Result<std::vector<PageKey>> ComputePageKeys(std::span<const int64_t> tokens, int64_t page_size,
                                             const std::optional<PageKey>& previous) {
  return ComputeKeys(tokens, page_size, previous);
}

Result<std::vector<PageKey>> ComputePromptPageKeys(std::span<const int32_t> tokens,
                                                   int64_t page_size, std::string_view salt) {
  return ComputeKeys(tokens, page_size, ChainSeed(salt));
}

// ---- StorageNamespace --------------------------------------------------------------------------

Status StorageNamespace::Validate() const {
  // Bounds keep page_bytes() far from overflow (2 * 2^16 * 2^8 * 2^30 < 2^63).
  auto in_range = [](const char* field, int64_t value, int64_t lo, int64_t hi) -> Status {
    if (value < lo || value > hi) {
      return Status::InvalidArgument(
          fmt::format("storage namespace: {} must be in [{}, {}], got {}", field, lo, hi, value));
    }
    return Status::OK();
  };
  if (static_cast<int>(layout) >= kNumLayouts) {
    return Status::InvalidArgument(
        fmt::format("storage namespace: layout {} is not a layout", static_cast<int>(layout)));
  }
  KVTIER_RETURN_IF_ERROR(in_range("num_layers", num_layers, 1, int64_t{1} << 16));
  KVTIER_RETURN_IF_ERROR(in_range("slot_bytes", slot_bytes, 1, int64_t{1} << 30));
  KVTIER_RETURN_IF_ERROR(ValidatePageSize(page_size, "storage namespace: page_size"));
  KVTIER_RETURN_IF_ERROR(in_range("head_num", head_num, 1, int64_t{1} << 16));
  if (slot_bytes % head_num != 0) {
    return Status::InvalidArgument(fmt::format(
        "storage namespace: slot_bytes {} is not a multiple of head_num {}", slot_bytes, head_num));
  }
  KVTIER_RETURN_IF_ERROR(in_range("tp_size", tp_size, 1, int64_t{1} << 16));
  KVTIER_RETURN_IF_ERROR(in_range("tp_rank", tp_rank, 0, tp_size - 1));
  return Status::OK();
}

int64_t StorageNamespace::page_bytes() const {
  return (mla ? 1 : 2) * num_layers * page_size * slot_bytes;
}

uint64_t StorageNamespace::Hash() const {
  // The canonical text form: every field, length-prefixed strings so no two namespaces collide
  // by concatenation. Version the form ("ns1") so a future field changes every hash on purpose.
  const std::string text = fmt::format(
      "ns1|model:{}:{}|dtype:{}:{}|layout:{}|mla:{}|layers:{}|slot_bytes:{}|page_size:{}|"
      "heads:{}|tp:{}/{}",
      model_id.size(), model_id, kv_dtype.size(), kv_dtype, static_cast<int>(layout), mla ? 1 : 0,
      num_layers, slot_bytes, page_size, head_num, tp_rank, tp_size);
  uint8_t digest[32];
  if (!Sha256Of({reinterpret_cast<const uint8_t*>(text.data()), text.size()}, {}, digest)) {
    return 0;
  }
  uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = h << 8 | digest[i];  // big-endian: Name() reads as the digest
  return h;
}

std::string StorageNamespace::Name() const { return fmt::format("kv{:016x}", Hash()); }

StorageNamespace StorageNamespaceOf(const KvGeometry& pages, bool mla, const StorageOwner& owner) {
  StorageNamespace ns;
  ns.model_id = owner.model_id;
  ns.kv_dtype = owner.kv_dtype;
  ns.layout = pages.layout;
  ns.mla = mla;
  ns.num_layers = pages.num_layers;
  ns.slot_bytes = pages.slot_bytes;
  ns.page_size = pages.page_size;
  ns.head_num = pages.head_num;
  ns.tp_rank = owner.tp_rank;
  ns.tp_size = owner.tp_size;
  return ns;
}

std::string StorageNamespace::Describe() const {
  return fmt::format(
      "model={} dtype={} layout={} mla={} layers={} slot_bytes={} page_size={} heads={} tp={}/{}",
      model_id.empty() ? "\"\"" : model_id, kv_dtype, LayoutName(layout), mla ? 1 : 0, num_layers,
      slot_bytes, page_size, head_num, tp_rank, tp_size);
}

}  // namespace kvtier
