// tools/replay/workload.h — the request streams `kvtier replay` serves: Mooncake traces and
// seeded synthetic generators, and the token ids of a request's prompt.
//
// Every workload is a list of requests in the Mooncake trace shape: an arrival time, an input and
// an output length, and one block id per `kBlockTokens`-token block of the input. Equal ids mean
// equal blocks: the tokens of block `h` are a fixed pseudo-random function of `h` (BlockTokens),
// so two prompts that start with the same k ids share their first k * kBlockTokens tokens. The
// last block of a prompt may be partial: it holds `input_length - kBlockTokens * (n - 1)` tokens,
// the first ones of its block. Synthetic generators emit the same shape, so every workload goes
// through one code path.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::tools {

// Tokens per block id (the Mooncake traces' block size).
inline constexpr int64_t kBlockTokens = 512;
// Token ids are drawn from [0, kVocabularySize) (Llama-3's vocabulary).
inline constexpr int64_t kVocabularySize = 128256;

struct WorkloadRequest {
  double arrival_ms = 0;  // from the start of the workload
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;  // ceil(input_length / kBlockTokens) block ids, each >= 0
};

struct Workload {
  std::string name;  // "mooncake:<file>", "chat", ...
  std::vector<WorkloadRequest> requests;
  int64_t input_tokens() const;
};

// Bounds of a trace: a line (a prompt of 2^24 tokens needs about 700 KB) and the requests read.
inline constexpr size_t kMaxTraceLineBytes = size_t{1} << 20;
inline constexpr int64_t kMaxTraceRequests = 10'000'000;

// Reads a Mooncake JSONL trace (one object per line with `timestamp` in ms, `input_length`,
// `output_length`, `hash_ids`). At most `max_requests` lines (0 = all). InvalidArgument naming
// the file, the line and the field for anything malformed (a field missing or of the wrong type,
// a negative length, hash_ids not matching input_length, timestamps going backwards, a line
// longer than kMaxTraceLineBytes, more than kMaxTraceRequests requests); NotFound when the file
// cannot be opened. Memory is bounded by one line plus the requests read.
Result<Workload> LoadMooncakeTrace(const std::string& path, int64_t max_requests = 0);

// One line of a trace (without its newline) as a request; `where` ("file:line") starts every
// message. Checks everything LoadMooncakeTrace does except the order of timestamps.
Result<WorkloadRequest> ParseMooncakeTraceLine(std::string_view line, std::string_view where);

// The requests that a prefix-affinity router over `shards` engines sends to engine `shard` (in
// [0, shards)): those whose conversation key is `shard` modulo `shards`. The key is a request's
// second block id (the first after the system prompt every conversation of the Mooncake traces
// shares), or its only one. Turns of one conversation start with the same blocks, so they stay on
// one engine, in their order; the arrival times are kept.
Workload ShardWorkload(const Workload& workload, int64_t shard, int64_t shards);

// Synthetic workloads. Arrivals are a Poisson process of `rate_per_s` requests per second.
enum class SyntheticKind : uint8_t {
  kChat = 0,          // multi-turn conversations: each turn's prompt extends the previous one
  kSystemPrompt = 1,  // one shared system prompt followed by a distinct question per request
  kDocQa = 2,         // questions about long documents (Zipf-popular), a new question each time
};
const char* SyntheticKindName(SyntheticKind kind);  // "chat", "system-prompt", "doc-qa"
Result<SyntheticKind> ParseSyntheticKind(std::string_view name);

struct SyntheticOptions {
  SyntheticKind kind = SyntheticKind::kChat;
  int64_t requests = 1000;
  uint64_t seed = 1;
  double rate_per_s = 2.0;
  // InvalidArgument naming the field: requests in [1, 10^7], rate in (0, 10^6].
  Status Validate() const;
};
Result<Workload> MakeSyntheticWorkload(const SyntheticOptions& options);

// The prompt of `request`: input_length tokens, block by block.
std::vector<int32_t> PromptTokens(const WorkloadRequest& request);
// `count` output tokens of request number `index` (distinct per request; for --insert-output).
std::vector<int32_t> OutputTokens(int64_t index, int64_t count);
// Token `position` (< kBlockTokens) of block `block_id`.
int32_t BlockToken(int64_t block_id, int64_t position);

}  // namespace kvtier::tools
