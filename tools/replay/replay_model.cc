// Model shapes of `kvtier replay` (see replay_model.h).
#include "replay_model.h"

#include <fmt/format.h>

#include <string>

namespace kvtier::tools {

double ReplayModel::LinearFlopsPerToken() const {
  const double h = static_cast<double>(hidden);
  return 2.0 * (h * static_cast<double>(attn_in_cols) + static_cast<double>(q_heads * v_dim) * h +
                3.0 * h * static_cast<double>(mlp_cols));
}

double ReplayModel::LayerFlops(int64_t new_tokens, int64_t cached_tokens) const {
  const double n = static_cast<double>(new_tokens);
  // Query i (0-based among the new tokens) attends to cached_tokens + i + 1 keys.
  const double keys = n * static_cast<double>(cached_tokens) + n * (n + 1) / 2;
  const double attention = 2.0 * keys * static_cast<double>(q_heads * (qk_dim + v_dim));
  return n * LinearFlopsPerToken() + attention;
}

const std::vector<ReplayModel>& ReplayModels() {
  // Shapes from the models' published configurations (config.json): layers, hidden size, heads,
  // head dims, intermediate sizes; bf16 KV.
  static const std::vector<ReplayModel> models = {
      // One layer of a few bytes per token: capacities of 10^7-10^8 tokens fit in a few GiB.
      {"tiny", "kvtier/tiny", 1, false, 4, 1, 64, 1, 2, 2, 64 + 2 * 2, 128},
      // 32 layers, 32 query heads, 8 KV heads x 128, hidden 4096, intermediate 14336.
      {"llama3-8b", "meta-llama/Meta-Llama-3-8B", 32, false, 2048, 8, 4096, 32, 128, 128,
       4096 + 2 * 1024, 14336},
      // 80 layers, 64 query heads, 8 KV heads x 128, hidden 8192, intermediate 28672.
      {"llama3-70b", "meta-llama/Meta-Llama-3-70B", 80, false, 2048, 8, 8192, 64, 128, 128,
       8192 + 2 * 1024, 28672},
      // 24 layers, 14 query heads, 2 KV heads x 64, hidden 896, intermediate 4864.
      {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", 24, false, 256, 2, 896, 14, 64, 64, 896 + 2 * 128,
       4864},
      // 28 layers, 28 query heads, 4 KV heads x 128, hidden 3584, intermediate 18944.
      {"qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, false, 1024, 4, 3584, 28, 128, 128, 3584 + 2 * 512,
       18944},
      // MLA: 61 layers, KV = 512 latent + 64 rope (1152 bytes), 128 heads, qk 192 / v 128,
      // hidden 7168; attention projections q_a 1536, q_b, kv_a 576, kv_b (as columns of one
      // [hidden, cols] GEMM with the same parameter count); MoE: 8 routed + 1 shared expert of
      // 2048 active per token.
      {"deepseek-v3", "deepseek-ai/DeepSeek-V3", 61, true, 1152, 1, 7168, 128, 192, 128, 9704,
       9 * 2048},
      // MLA: 27 layers, 512 + 64 latent, 16 heads, hidden 2048; 6 routed + 2 shared experts of
      // 1408.
      {"deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 27, true, 1152, 1, 2048, 16, 192, 128,
       3072 + 576, 8 * 1408},
  };
  return models;
}

std::string ReplayModelNames() {
  std::string s;
  for (const ReplayModel& m : ReplayModels()) {
    if (!s.empty()) s += ", ";
    s += m.name;
  }
  return s;
}

Result<ReplayModel> FindReplayModel(std::string_view name) {
  for (const ReplayModel& m : ReplayModels()) {
    if (name == m.name) return m;
  }
  return Status::InvalidArgument(
      fmt::format("unknown model '{}' (known: {})", name, ReplayModelNames()));
}

}  // namespace kvtier::tools
