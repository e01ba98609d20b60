// Where the file store's page reads spend their time (read_profile.h).
#include "storage/file/read_profile.h"

#include <sys/resource.h>
#include <time.h>

namespace kvtier::storage {

ThreadTimes ThreadTimes::Now(bool start) {
  ThreadTimes t;
  if (!start) t.wall = Clock::now();
  rusage ru;
  if (::getrusage(RUSAGE_THREAD, &ru) == 0) {
    t.sleeps = ru.ru_nvcsw;
    t.preemptions = ru.ru_nivcsw;
  }
  timespec cpu;
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
    t.cpu_ns = int64_t{cpu.tv_sec} * 1'000'000'000 + cpu.tv_nsec;
  }
  if (start) t.wall = Clock::now();
  return t;
}

}  // namespace kvtier::storage
