// Internal: one-line diagnostics to stderr ("kvtier: warning: ...").
//
// The level comes from the environment variable KVTIER_LOG_LEVEL (debug, info, warning, error,
// off; default warning). Thread safety: Log may be called from any thread; lines are not
// interleaved.
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace kvtier::util {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, std::string_view message);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (LogEnabled(level)) LogLine(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kvtier::util
