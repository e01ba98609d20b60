// Page key micro-benchmarks: the chained SHA-256 keys of an 8,192-token prompt at page 16
// (512 digests), unsalted and salted, and of a 16-token page continuing a chain.
//
//   kvtier_bench_page_key [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kvtier/page_key.h"

namespace kvtier {
namespace {

std::vector<int32_t> RandomTokens(int64_t n) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> dist(0, 151'935);  // a Llama-3-sized vocabulary
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = dist(rng);
  return tokens;
}

void BM_PromptKeys(benchmark::State& state) {
  const int64_t num_tokens = state.range(0);
  const int64_t page_size = state.range(1);
  const std::vector<int32_t> tokens = RandomTokens(num_tokens);
  const char* salt = state.range(2) != 0 ? "tenant-42" : "";
  for (auto _ : state) {
    auto keys = ComputePromptPageKeys(tokens, page_size, salt);
    if (!keys.ok()) {
      std::fprintf(stderr, "%s\n", keys.status().ToString().c_str());
      std::abort();
    }
    benchmark::DoNotOptimize(keys->data());
  }
  state.SetItemsProcessed(state.iterations() * (num_tokens / page_size));
  state.SetLabel("items = pages");
}
BENCHMARK(BM_PromptKeys)
    ->ArgNames({"tokens", "page", "salted"})
    ->Args({8192, 16, 0})
    ->Args({8192, 16, 1})
    ->Args({8192, 64, 0})
    ->Unit(benchmark::kMicrosecond);

void BM_OnePageContinuingAChain(benchmark::State& state) {
  const std::vector<int32_t> tokens = RandomTokens(16);
  const auto previous = ComputePromptPageKeys(tokens, 16)->front();
  for (auto _ : state) {
    auto keys = ComputePageKeys(std::span<const int32_t>(tokens), 16, previous);
    benchmark::DoNotOptimize(keys->data());
  }
}
BENCHMARK(BM_OnePageContinuingAChain)->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();
