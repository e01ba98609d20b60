// tools/replay/replay_model.h — the model shapes `kvtier replay` serves: the KV geometry that
// sizes every tier and every copy, and the prefill arithmetic that sizes the compute.
//
// Prefill of `n` new tokens after `c` cached ones, per layer (GEMMs only; norms, softmax and the
// MoE router are left out, as they are a few percent of the time):
//   attention in   [n, hidden] x [hidden, attn_in_cols]           (q, k, v projections)
//   scores         per head: [n, qk_dim] x [qk_dim, c + i]        (causal: query i sees c + i + 1)
//   values         per head: [n, c + i] x [c + i, v_dim]
//   attention out  [n, q_heads * v_dim] x [q_heads * v_dim, hidden]
//   mlp            [n, hidden] x [hidden, 2 * mlp_cols], then [n, mlp_cols] x [mlp_cols, hidden]
// An MoE layer is modelled by its active experts (mlp_cols = experts per token x expert width).
//
// Thread safety: immutable tables and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::tools {

struct ReplayModel {
  const char* name;
  const char* model_id;  // the storage namespace's model id
  int64_t num_layers;
  bool mla;             // one KV buffer (latent + rope) instead of K and V
  int64_t slot_bytes;   // one buffer, one token, one layer
  int64_t kv_head_num;  // heads within slot_bytes (the page_head host layout)
  int64_t hidden;
  int64_t q_heads;
  int64_t qk_dim;  // per head, scores
  int64_t v_dim;   // per head, values
  int64_t attn_in_cols;
  int64_t mlp_cols;

  int64_t num_buffers() const { return mla ? 1 : 2; }
  // KV bytes of one token over all layers and buffers.
  int64_t kv_bytes_per_token() const { return num_layers * num_buffers() * slot_bytes; }
  // FLOPs of one layer's prefill of `new_tokens` after `cached_tokens` (causal attention).
  double LayerFlops(int64_t new_tokens, int64_t cached_tokens) const;
  // The linear part only (per token, per layer).
  double LinearFlopsPerToken() const;
};

// tiny, llama3-8b, llama3-70b, qwen2.5-0.5b, qwen2.5-7b, deepseek-v3, deepseek-v2-lite.
const std::vector<ReplayModel>& ReplayModels();
// InvalidArgument listing the known names otherwise.
Result<ReplayModel> FindReplayModel(std::string_view name);
// "tiny, llama3-8b, ..." for help texts.
std::string ReplayModelNames();

}  // namespace kvtier::tools
