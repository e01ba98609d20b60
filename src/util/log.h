// Internal: one-line diagnostics to stderr ("kvtier: warning: ...").
//
// The level comes from the environment variable KVTIER_LOG_LEVEL (debug, info, warning, error,
// off; default warning).
//
// Warnings and errors are rate-limited per message key, the call's format string (one call site,
// or several that share a text): at most `max_lines` lines of one key per `interval`; the rest
// are counted, and one line per key ("kvtier: warning: 412 more line(s) like this one in the
// last 10.0 s (rate-limited), the last: storage file:///x: cannot write ...", quoting the last
// line suppressed, never the format string) reports them when its interval has ended, at the next
// line logged or at FlushSuppressedLogLines (called at exit). A failing disk thus costs a few
// lines, not one per page. Debug and info lines are not limited.
//
// Thread safety: Log may be called from any thread; lines are not interleaved.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string_view>
#include <utility>

namespace kvtier::util {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

bool LogEnabled(LogLevel level);
// Writes `message` unless the rate limit of `key` (a format string) suppresses it.
void LogLine(LogLevel level, std::string_view key, std::string_view message);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (LogEnabled(level)) {
    const fmt::string_view key = format;
    LogLine(level, std::string_view(key.data(), key.size()),
            fmt::format(format, std::forward<Args>(args)...));
  }
}

struct LogRateLimit {
  int64_t max_lines = 10;  // per key and interval; >= 1
  std::chrono::milliseconds interval{10'000};
};
// Sets the limit for lines logged from now on; returns the previous one (tests).
LogRateLimit SetLogRateLimit(LogRateLimit limit);
// Writes the count line of every key with suppressed lines now, whether or not its interval has
// ended, and starts their intervals afresh.
void FlushSuppressedLogLines();

}  // namespace kvtier::util
