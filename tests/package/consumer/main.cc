// Copies two slots with the cpu backend through the installed headers and library.
#include <kvtier/transfer.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  using namespace kvtier;
  KvGeometry g{KvLayout::kPageFirst, 2, 8, 16, 4, 1};
  std::vector<std::byte> src(static_cast<size_t>(g.buffer_bytes()), std::byte{7});
  std::vector<std::byte> dst(src.size(), std::byte{0});
  KvRegion from{.geometry = g, .mla = true, .k = src.data()};
  KvRegion to{.geometry = g, .mla = true, .k = dst.data()};
  const std::vector<int64_t> s = {1, 2}, d = {5, 6};
  auto engine = MakeTransferEngine(TransferBackend::kCpu);
  if (!engine.ok()) return std::puts(engine.status().ToString().c_str()), 1;
  const Status st = (*engine)->Transfer(
      TransferRequest::AllLayers(from, to, SlotIndices::Host(std::span<const int64_t>(s)),
                                 SlotIndices::Host(std::span<const int64_t>(d))));
  const bool ok = st.ok() && dst[static_cast<size_t>(g.SlotOffset(1, 6))] == std::byte{7} &&
                  dst[0] == std::byte{0};
  std::puts(ok ? "kvtier package: ok" : st.ToString().c_str());
  return ok ? 0 : 1;
}
