// Workloads of `kvtier replay` (see workload.h).
#include "workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

namespace kvtier::tools {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Reads an integer field of a trace line; InvalidArgument naming the line and field otherwise.
Result<int64_t> IntField(const nlohmann::json& j, const char* field, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end()) return Status::InvalidArgument(fmt::format("{}: no `{}` field", where, field));
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return Status::InvalidArgument(
        fmt::format("{}: `{}` must be an integer, not {}", where, field, it->dump()));
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0)
    return Status::InvalidArgument(fmt::format("{}: `{}` = {} is negative", where, field, v));
  return v;
}

// Prompts longer than this are refused (a corrupt line, not a prompt).
constexpr int64_t kMaxInputLength = int64_t{1} << 24;

}  // namespace

int64_t Workload::input_tokens() const {
  int64_t n = 0;
  for (const WorkloadRequest& r : requests) n += r.input_length;
  return n;
}

Workload ShardWorkload(const Workload& workload, int64_t shard, int64_t shards) {
  Workload out;
  out.name = workload.name;
  for (const WorkloadRequest& r : workload.requests) {
    if (r.hash_ids.empty()) continue;
    const int64_t key = r.hash_ids[r.hash_ids.size() > 1 ? 1 : 0];
    if (key % shards == shard) out.requests.push_back(r);
  }
  return out;
}

Result<WorkloadRequest> ParseMooncakeTraceLine(std::string_view line, std::string_view where) {
  if (line.size() > kMaxTraceLineBytes) {
    return Status::InvalidArgument(
        fmt::format("{}: the line is longer than {} bytes", where, kMaxTraceLineBytes));
  }
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(fmt::format("{}: not a JSON object", where));
  }
  const std::string at(where);
  WorkloadRequest r;
  auto ts = j.find("timestamp");
  if (ts == j.end() || !ts->is_number()) {
    return Status::InvalidArgument(fmt::format("{}: `timestamp` must be a number", where));
  }
  r.arrival_ms = ts->get<double>();
  if (!std::isfinite(r.arrival_ms) || r.arrival_ms < 0) {
    return Status::InvalidArgument(
        fmt::format("{}: timestamp {} is not a finite number >= 0", where, r.arrival_ms));
  }
  KVTIER_ASSIGN_OR_RETURN(r.input_length, IntField(j, "input_length", at));
  KVTIER_ASSIGN_OR_RETURN(r.output_length, IntField(j, "output_length", at));
  if (r.input_length == 0 || r.input_length > kMaxInputLength) {
    return Status::InvalidArgument(fmt::format("{}: input_length = {} must be in [1, {}]", where,
                                               r.input_length, kMaxInputLength));
  }
  auto ids = j.find("hash_ids");
  if (ids == j.end() || !ids->is_array()) {
    return Status::InvalidArgument(fmt::format("{}: `hash_ids` must be an array", where));
  }
  const int64_t blocks = (r.input_length + kBlockTokens - 1) / kBlockTokens;
  if (static_cast<int64_t>(ids->size()) != blocks) {
    return Status::InvalidArgument(
        fmt::format("{}: {} hash_ids for input_length {} (one per {}-token block: {} expected)",
                    where, ids->size(), r.input_length, kBlockTokens, blocks));
  }
  r.hash_ids.reserve(static_cast<size_t>(blocks));
  for (const nlohmann::json& id : *ids) {
    if (!id.is_number_integer() && !id.is_number_unsigned()) {
      return Status::InvalidArgument(
          fmt::format("{}: hash_ids holds {}, not an integer", where, id.dump()));
    }
    if (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return Status::InvalidArgument(
          fmt::format("{}: hash id {} is above 2^63-1", where, id.get<uint64_t>()));
    }
    const int64_t v = id.get<int64_t>();
    if (v < 0) return Status::InvalidArgument(fmt::format("{}: hash id {} is negative", where, v));
    r.hash_ids.push_back(v);
  }
  return r;
}

Result<Workload> LoadMooncakeTrace(const std::string& path, int64_t max_requests) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(path.c_str(), "re"), &std::fclose);
  if (!in) return Status::NotFound(fmt::format("cannot open the trace file {}", path));
  Workload w;
  w.name = fmt::format("mooncake:{}", std::filesystem::path(path).filename().string());
  std::string line;
  int64_t line_no = 0;
  double last_ms = 0;
  bool more = true;
  while (more) {
    // One line, never more than kMaxTraceLineBytes + 1 bytes of it held (a file without
    // newlines, such as /dev/zero, fails at its first line instead of filling memory).
    line.clear();
    int c;
    while ((c = getc_unlocked(in.get())) != EOF && c != '\n') {
      if (line.size() > kMaxTraceLineBytes) break;
      line.push_back(static_cast<char>(c));
    }
    more = c != EOF;
    if (c == EOF && std::ferror(in.get())) {
      return Status::IOError(
          fmt::format("{}:{}: read failed: {}", path, line_no + 1, std::strerror(errno)));
    }
    if (c == EOF && line.empty()) break;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (max_requests > 0 && static_cast<int64_t>(w.requests.size()) >= max_requests) break;
    const std::string where = fmt::format("{}:{}", path, line_no);
    if (static_cast<int64_t>(w.requests.size()) >= kMaxTraceRequests) {
      return Status::InvalidArgument(
          fmt::format("{}: the trace holds more than {} requests", where, kMaxTraceRequests));
    }
    KVTIER_ASSIGN_OR_RETURN(WorkloadRequest r, ParseMooncakeTraceLine(line, where));
    if (r.arrival_ms < last_ms) {
      return Status::InvalidArgument(fmt::format(
          "{}: timestamp {} is before the previous line's {} (the trace must be in arrival order)",
          where, r.arrival_ms, last_ms));
    }
    last_ms = r.arrival_ms;
    w.requests.push_back(std::move(r));
  }
  if (w.requests.empty()) {
    return Status::InvalidArgument(fmt::format("{}: the trace holds no requests", path));
  }
  return w;
}

const char* SyntheticKindName(SyntheticKind kind) {
  switch (kind) {
    case SyntheticKind::kChat:
      return "chat";
    case SyntheticKind::kSystemPrompt:
      return "system-prompt";
    case SyntheticKind::kDocQa:
      return "doc-qa";
  }
  return "?";
}

Result<SyntheticKind> ParseSyntheticKind(std::string_view name) {
  for (SyntheticKind k :
       {SyntheticKind::kChat, SyntheticKind::kSystemPrompt, SyntheticKind::kDocQa}) {
    if (name == SyntheticKindName(k)) return k;
  }
  return Status::InvalidArgument(
      fmt::format("unknown workload '{}' (chat, system-prompt, doc-qa or a trace file)", name));
}

Status SyntheticOptions::Validate() const {
  if (requests < 1 || requests > 10'000'000) {
    return Status::InvalidArgument(fmt::format("requests = {} must be in [1, 10000000]", requests));
  }
  if (!(std::isfinite(rate_per_s) && rate_per_s > 0 && rate_per_s <= 1e6)) {
    return Status::InvalidArgument(
        fmt::format("rate = {} must be in (0, 1e6] per second", rate_per_s));
  }
  return Status::OK();
}

Result<Workload> MakeSyntheticWorkload(const SyntheticOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  std::mt19937_64 rng(options.seed);
  std::exponential_distribution<double> gap_ms(options.rate_per_s / 1000.0);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Workload w;
  w.name = SyntheticKindName(options.kind);
  int64_t next_id = 0;
  auto fresh = [&](std::vector<int64_t>* ids, int64_t n) {
    for (int64_t i = 0; i < n; ++i) ids->push_back(next_id++);
  };
  // A prompt of whole blocks, its last one cut short by a random amount.
  auto emit = [&](double t, std::vector<int64_t> ids, int64_t output) {
    WorkloadRequest r;
    r.arrival_ms = t;
    r.input_length = static_cast<int64_t>(ids.size()) * kBlockTokens - uniform(0, kBlockTokens - 1);
    r.output_length = output;
    r.hash_ids = std::move(ids);
    w.requests.push_back(std::move(r));
  };

  double t = 0;
  switch (options.kind) {
    case SyntheticKind::kChat: {
      // Conversations share a one-block system prompt; each turn adds the previous answer and a
      // new question (1-3 blocks) to the conversation's prompt; a conversation lasts 2-10 turns.
      std::vector<int64_t> system;
      fresh(&system, 1);
      struct Conversation {
        std::vector<int64_t> ids;
        int64_t turns_left;
      };
      std::vector<Conversation> active;
      for (int64_t i = 0; i < options.requests; ++i) {
        t += gap_ms(rng);
        if (active.size() < 4 || uniform(0, 3) == 0) {
          Conversation c{system, uniform(2, 10)};
          fresh(&c.ids, uniform(1, 4));
          active.push_back(std::move(c));
        }
        const size_t k = static_cast<size_t>(uniform(0, static_cast<int64_t>(active.size()) - 1));
        Conversation& c = active[k];
        if (c.ids.size() > system.size() + 4) fresh(&c.ids, uniform(1, 3));
        emit(t, c.ids, uniform(16, 512));
        if (--c.turns_left == 0) active.erase(active.begin() + static_cast<std::ptrdiff_t>(k));
      }
      break;
    }
    case SyntheticKind::kSystemPrompt: {
      // An 8-block (4,096-token) system prompt, then a 1-2 block question of each request's own.
      std::vector<int64_t> system;
      fresh(&system, 8);
      for (int64_t i = 0; i < options.requests; ++i) {
        t += gap_ms(rng);
        std::vector<int64_t> ids = system;
        fresh(&ids, uniform(1, 2));
        emit(t, std::move(ids), uniform(16, 256));
      }
      break;
    }
    case SyntheticKind::kDocQa: {
      // 64 documents of 16-64 blocks (8k-32k tokens), Zipf(1)-popular; a one-block question each.
      constexpr int kDocuments = 64;
      std::vector<std::vector<int64_t>> docs(kDocuments);
      std::vector<double> weights(kDocuments);
      for (int d = 0; d < kDocuments; ++d) {
        fresh(&docs[static_cast<size_t>(d)], uniform(16, 64));
        weights[static_cast<size_t>(d)] = 1.0 / (d + 1);
      }
      std::discrete_distribution<int> pick(weights.begin(), weights.end());
      for (int64_t i = 0; i < options.requests; ++i) {
        t += gap_ms(rng);
        std::vector<int64_t> ids = docs[static_cast<size_t>(pick(rng))];
        fresh(&ids, 1);
        emit(t, std::move(ids), uniform(16, 256));
      }
      break;
    }
  }
  return w;
}

int32_t BlockToken(int64_t block_id, int64_t position) {
  const uint64_t h = Mix(Mix(static_cast<uint64_t>(block_id)) ^ static_cast<uint64_t>(position));
  return static_cast<int32_t>(h % static_cast<uint64_t>(kVocabularySize));
}

std::vector<int32_t> PromptTokens(const WorkloadRequest& request) {
  std::vector<int32_t> tokens(static_cast<size_t>(request.input_length));
  for (int64_t i = 0; i < request.input_length; ++i) {
    tokens[static_cast<size_t>(i)] =
        BlockToken(request.hash_ids[static_cast<size_t>(i / kBlockTokens)], i % kBlockTokens);
  }
  return tokens;
}

std::vector<int32_t> OutputTokens(int64_t index, int64_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  const uint64_t seed = Mix(static_cast<uint64_t>(index) ^ 0x6F75747075740000ull);  // "output"
  for (int64_t i = 0; i < count; ++i) {
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(Mix(seed ^ static_cast<uint64_t>(i)) %
                                                          static_cast<uint64_t>(kVocabularySize));
  }
  return tokens;
}

}  // namespace kvtier::tools
