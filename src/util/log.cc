#include "util/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

namespace kvtier::util {
namespace {

using Clock = std::chrono::steady_clock;

LogLevel LevelFromEnvironment() {
  const char* v = std::getenv("KVTIER_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kWarning;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  if (std::strcmp(v, "off") == 0) return LogLevel::kOff;
  return LogLevel::kWarning;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "?";
}

// One key's interval: lines written in it and lines suppressed.
struct KeyWindow {
  Clock::time_point start;
  int64_t written = 0;
  int64_t suppressed = 0;
  LogLevel level = LogLevel::kWarning;  // of the last suppressed line
  std::string last;                     // the last suppressed line's text
};

// Invariant: windows_ holds only keys that were logged at warning or above; a key's window
// counts from its first line after the previous window ended. Keys are format strings (string
// literals, a bounded set), stored by value.
struct LogState {
  std::mutex mu;
  LogRateLimit limit;
  std::unordered_map<std::string, KeyWindow> windows;
};

LogState& State() {
  // Never destroyed: a thread may log during exit; the atexit flush runs before that.
  static LogState* state = [] {
    auto* s = new LogState;
    std::atexit(FlushSuppressedLogLines);
    return s;
  }();
  return *state;
}

void Write(LogLevel level, std::string_view message) {
  std::fprintf(stderr, "kvtier: %s: %.*s\n", LevelName(level), static_cast<int>(message.size()),
               message.data());
}

// REQUIRES: s.mu held. Reports (and resets) the suppressed lines of `w`.
void WriteSuppressed(std::string_view key, KeyWindow& w, Clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - w.start).count();
  (void)key;
  Write(w.level, fmt::format("{} more line(s) like this one in the last {:.1f} s (rate-limited), "
                             "the last: {}",
                             w.suppressed, seconds, w.last));
  w.suppressed = 0;
  w.last.clear();
}

}  // namespace

bool LogEnabled(LogLevel level) {
  static const LogLevel threshold = LevelFromEnvironment();
  return level != LogLevel::kOff && level >= threshold;
}

void LogLine(LogLevel level, std::string_view key, std::string_view message) {
  LogState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (level < LogLevel::kWarning) {
    Write(level, message);
    return;
  }
  const Clock::time_point now = Clock::now();
  // Ended intervals: report their suppressed lines first, so the counts precede newer lines.
  for (auto& [k, w] : s.windows) {
    if (now - w.start < s.limit.interval) continue;
    if (w.suppressed > 0) WriteSuppressed(k, w, now);
    w.start = now;
    w.written = 0;
  }
  auto [it, fresh] = s.windows.try_emplace(std::string(key));
  KeyWindow& w = it->second;
  if (fresh) w.start = now;
  if (w.written >= s.limit.max_lines) {
    ++w.suppressed;
    w.level = level;
    w.last.assign(message);
    return;
  }
  ++w.written;
  Write(level, message);
}

LogRateLimit SetLogRateLimit(LogRateLimit limit) {
  LogState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (limit.max_lines < 1) limit.max_lines = 1;
  std::swap(s.limit, limit);
  return limit;
}

void FlushSuppressedLogLines() {
  LogState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  const Clock::time_point now = Clock::now();
  for (auto& [k, w] : s.windows) {
    if (w.suppressed > 0) WriteSuppressed(k, w, now);
    w.start = now;
    w.written = 0;
  }
}

}  // namespace kvtier::util
