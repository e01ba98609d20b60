#include "util/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace kvtier::util {
namespace {

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

}  // namespace

bool LogEnabled(LogLevel level) {
  static const LogLevel threshold = LevelFromEnvironment();
  return level != LogLevel::kOff && level >= threshold;
}

void LogLine(LogLevel level, std::string_view message) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "kvtier: %s: %.*s\n", LevelName(level), static_cast<int>(message.size()),
               message.data());
}

}  // namespace kvtier::util
