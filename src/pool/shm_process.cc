// Internal: whether a process that attached to shared memory still runs (shm_process.h).
#include "pool/shm_process.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvtier::shm {

namespace {

// Reads /proc/<pid>/stat: the state letter (field 3) and the start time (field 22).
bool ReadProcStat(int64_t pid, char* state, uint64_t* start_time) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) is in parentheses and may hold spaces or ')': skip to the last.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return false;
  ++p;
  // p -> " S ppid pgrp ..." ; field 3 is the state, field 22 the start time.
  char st = 0;
  if (std::sscanf(p, " %c", &st) != 1) return false;
  int field = 2;
  const char* q = p;
  while (*q != '\0' && field < 21) {
    while (*q == ' ') ++q;
    while (*q != ' ' && *q != '\0') ++q;
    ++field;
  }
  unsigned long long start = 0;
  if (std::sscanf(q, " %llu", &start) != 1) return false;
  *state = st;
  *start_time = start;
  return true;
}

}  // namespace

uint64_t ProcessStartTime(int64_t pid) {
  char state = 0;
  uint64_t start = 0;
  return ReadProcStat(pid, &state, &start) ? start : 0;
}

bool ProcessAlive(int64_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  char state = 0;
  uint64_t start = 0;
  // Without /proc the pid's existence is all there is to go on.
  if (!ReadProcStat(pid, &state, &start)) return true;
  if (state == 'Z' || state == 'X' || state == 'x') return false;  // dead, not yet reaped
  return start_time == 0 || start == start_time;
}

}  // namespace kvtier::shm
