// Where a rank's pieces are: its GPU's PCI bus id and NUMA node, its host pool's NUMA node, the
// CPU node its thread runs on (see replay_tp_report.h).
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>

#include "replay_tp_report.h"

#if defined(KVTIER_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace kvtier::tools {

std::string GpuPciBusId(int device) {
#if defined(KVTIER_WITH_CUDA)
  char id[32] = {};
  if (device < 0 || cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) return "";
  std::string s(id);
  // sysfs names are lower case ("0000:18:00.0"); CUDA's may not be.
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
#else
  (void)device;
  return "";
#endif
}

int PciNumaNode(const std::string& bus_id) {
  if (bus_id.empty()) return -1;
  std::ifstream f("/sys/bus/pci/devices/" + bus_id + "/numa_node");
  int node = -1;
  if (!(f >> node)) return -1;
  return node;  // -1 where the platform has no NUMA information
}

int MemoryNumaNode(const void* p) {
  if (p == nullptr) return -1;
  // get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR): the node of the page at `p` (it must be touched).
  constexpr unsigned long kNode = 1, kAddr = 2;
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0UL, const_cast<void*>(p), kNode | kAddr) != 0) {
    return -1;
  }
  return node;
}

int CpuNumaNode() {
  unsigned cpu = 0, node = 0;
  if (syscall(SYS_getcpu, &cpu, &node, nullptr) != 0) return -1;
  return static_cast<int>(node);
}

}  // namespace kvtier::tools
