// Where the file store's page reads spend their time (read_profile.h).
#include "storage/file/read_profile.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>

#include "storage/file/file_io.h"

namespace kvtier::storage {

namespace {
// This thread's run delay so far (ns), from /proc/thread-self/schedstat ("<on a core>
// <runnable, no core> <slices>"), read through a file the thread keeps open (closed at its
// exit); -1 where it cannot be read (no procfs, a kernel without schedstat).
int64_t RunDelayNs() {
  thread_local const Fd schedstat(::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC));
  if (!schedstat.ok()) return -1;
  char text[96];
  const ssize_t n = ::pread(schedstat.get(), text, sizeof(text) - 1, 0);
  if (n <= 0) return -1;
  text[n] = '\0';
  char* end = nullptr;
  std::strtoll(text, &end, 10);  // time on a core
  if (end == text) return -1;
  const char* delay = end;
  const long long ns = std::strtoll(delay, &end, 10);
  return end == delay ? -1 : static_cast<int64_t>(ns);
}
}  // namespace

ThreadTimes ThreadTimes::Now(bool start) {
  ThreadTimes t;
  if (start) t.wall = Clock::now();
  t.run_delay_ns = RunDelayNs();
  rusage ru;
  if (::getrusage(RUSAGE_THREAD, &ru) == 0) {
    t.sleeps = ru.ru_nvcsw;
    t.preemptions = ru.ru_nivcsw;
  }
  timespec cpu;
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
    t.cpu_ns = int64_t{cpu.tv_sec} * 1'000'000'000 + cpu.tv_nsec;
  }
  if (!start) t.wall = Clock::now();
  return t;
}

void ReadProfile::Fill(StorageStats& stats) const {
  const Totals t = Get();
  stats.get_profiled_pages = t.pages;
  stats.get_profiled_seconds = static_cast<double>(t.wall_ns) / 1e9;
  stats.get_profiled_cpu_seconds = static_cast<double>(t.cpu_ns) / 1e9;
  // Scaled up to every profiled page from those whose run delay was read (all, or none); -1
  // only once pages were profiled and none had it (0 pages: 0, so a difference across a pass
  // that starts with none is right).
  stats.get_profiled_core_wait_seconds = t.pages == 0 ? 0.0
                                         : t.run_delay_pages == 0
                                             ? -1.0
                                             : static_cast<double>(t.run_delay_ns) / 1e9 *
                                                   static_cast<double>(t.pages) /
                                                   static_cast<double>(t.run_delay_pages);
}

}  // namespace kvtier::storage
