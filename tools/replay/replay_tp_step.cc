// The step of `kvtier replay --tp N`: its message's encoding and one rank's prefill of it
// (replay_tp_step.h).
#include "replay_tp_step.h"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include "kvtier/testing/kv_pattern.h"

namespace kvtier::tools {

std::vector<std::byte> TpStepMessage::Encode() const {
  const int64_t head[7] = {warm,
                           sample,
                           report,
                           cached_tokens,
                           new_tokens,
                           static_cast<int64_t>(hit_slots.size()),
                           static_cast<int64_t>(new_slots.size())};
  std::vector<std::byte> out(sizeof(head) + tokens.size() * 4 +
                             (hit_slots.size() + new_slots.size()) * 8);
  std::byte* p = out.data();
  auto put = [&p](const void* src, size_t n) {
    if (n > 0) std::memcpy(p, src, n);
    p += n;
  };
  put(head, sizeof(head));
  put(tokens.data(), tokens.size() * 4);
  put(hit_slots.data(), hit_slots.size() * 8);
  put(new_slots.data(), new_slots.size() * 8);
  return out;
}

Result<TpStepMessage> TpStepMessage::Decode(std::span<const std::byte> in) {
  int64_t head[7];
  if (in.size() < sizeof(head)) return Status::Corruption("tp step: short message");
  std::memcpy(head, in.data(), sizeof(head));
  TpStepMessage m;
  m.warm = static_cast<uint32_t>(head[0]);
  m.sample = static_cast<uint32_t>(head[1]);
  m.report = static_cast<uint32_t>(head[2]);
  m.cached_tokens = head[3];
  m.new_tokens = head[4];
  const int64_t hits = head[5], fresh = head[6];
  if (hits < 0 || fresh < 0 || hits > (int64_t{1} << 32) || fresh > (int64_t{1} << 32) ||
      in.size() != sizeof(head) + static_cast<size_t>(hits + fresh) * 12) {
    return Status::Corruption("tp step: lengths do not match the message");
  }
  const std::byte* p = in.data() + sizeof(head);
  m.tokens.resize(static_cast<size_t>(hits + fresh));
  m.hit_slots.resize(static_cast<size_t>(hits));
  m.new_slots.resize(static_cast<size_t>(fresh));
  // An empty vector's data() may be null, which memcpy must not get even for 0 bytes.
  auto take = [&p](void* dst, size_t bytes) {
    if (bytes > 0) std::memcpy(dst, p, bytes);
    p += bytes;
  };
  take(m.tokens.data(), m.tokens.size() * 4);
  take(m.hit_slots.data(), m.hit_slots.size() * 8);
  take(m.new_slots.data(), m.new_slots.size() * 8);
  return m;
}

uint64_t TpRankSalt(int rank, bool mla) {
  return KvPatternSalt(mla ? std::string("tp-latent") : fmt::format("tp-rank-{}", rank));
}

Result<double> RunTpStep(PrefillEngine& engine, const TpStepMessage& m, int rank, bool mla,
                         HierarchicalCache* cache, MatchHandle handle, PrefillTiming* timing) {
  const std::vector<uint64_t> hashes = KvPatternHashes(m.tokens, TpRankSalt(rank, mla));
  const std::span<const uint64_t> all(hashes);
  PrefillJob job;
  job.cache = cache;
  job.handle = handle;
  job.hit_slots = m.hit_slots;
  job.hit_hashes = all.first(m.hit_slots.size());
  job.new_slots = m.new_slots;
  job.new_hashes = all.subspan(m.hit_slots.size());
  job.verify_sample = m.sample != 0;
  job.skip_compute = m.warm != 0;
  job.cached_tokens = m.cached_tokens;
  job.new_tokens = m.new_tokens;
  KVTIER_ASSIGN_OR_RETURN(*timing, engine.Prefill(job));
  if (timing->wrong_bytes > 0) {
    return Status::Corruption(fmt::format("tp rank {}: {} wrong bytes; first: {}", rank,
                                          timing->wrong_bytes, timing->first_wrong));
  }
  return timing->total_ms;
}

}  // namespace kvtier::tools
