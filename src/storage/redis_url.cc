// Parsing of Redis storage URLs (see redis_url.h).
#include "storage/redis_url.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>

#include "kvtier/storage.h"

namespace kvtier::storage {
namespace {

constexpr std::string_view kSingleScheme = "redis://";
constexpr std::string_view kClusterScheme = "redis+cluster://";
constexpr int64_t kMaxTimeoutMs = 600'000;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view text, std::string_view what) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    const bool complete = i + 2 < text.size();
    const int hi = complete ? HexDigit(text[i + 1]) : -1;
    const int lo = complete ? HexDigit(text[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument(fmt::format("redis URL: bad percent escape in the {}", what));
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

Result<int64_t> ParseMillis(std::string_view name, std::string_view value) {
  int64_t ms = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
  if (ec != std::errc() || end != value.data() + value.size() || ms < 1 || ms > kMaxTimeoutMs) {
    return Status::InvalidArgument(fmt::format(
        "redis URL: {}={} is not a number of milliseconds in [1, {}]", name, value, kMaxTimeoutMs));
  }
  return ms;
}

}  // namespace

std::string RedisEndpoint::ToString() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Result<RedisEndpoint> ParseRedisEndpoint(std::string_view text) {
  RedisEndpoint endpoint;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close == 1) {
      return Status::InvalidArgument(fmt::format("redis endpoint '{}': bad [IPv6] host", text));
    }
    endpoint.host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return Status::InvalidArgument(fmt::format("redis endpoint '{}': junk after ']'", text));
      }
      port_text = rest.substr(1);
      if (port_text.empty()) {
        return Status::InvalidArgument(fmt::format("redis endpoint '{}': empty port", text));
      }
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string_view::npos && text.find(':') != colon) {
      return Status::InvalidArgument(
          fmt::format("redis endpoint '{}': write an IPv6 host in brackets", text));
    }
    endpoint.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = text.substr(colon + 1);
      if (port_text.empty()) {
        return Status::InvalidArgument(fmt::format("redis endpoint '{}': empty port", text));
      }
    }
  }
  if (endpoint.host.empty()) {
    return Status::InvalidArgument(fmt::format("redis endpoint '{}': no host", text));
  }
  for (char c : endpoint.host) {
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
    if (!ok) {
      return Status::InvalidArgument(
          fmt::format("redis endpoint '{}': bad character in the host", text));
    }
  }
  if (!port_text.empty()) {
    int port = 0;
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535) {
      return Status::InvalidArgument(
          fmt::format("redis endpoint '{}': port '{}' is not in [1, 65535]", text, port_text));
    }
    endpoint.port = port;
  }
  return endpoint;
}

Result<RedisUrl> ParseRedisUrl(std::string_view url) {
  RedisUrl parsed;
  std::string_view rest;
  if (url.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("redis URL: holds a NUL byte");
  }
  if (url.starts_with(kClusterScheme)) {
    parsed.cluster = true;
    rest = url.substr(kClusterScheme.size());
  } else if (url.starts_with(kSingleScheme)) {
    rest = url.substr(kSingleScheme.size());
  } else {
    return Status::InvalidArgument(
        fmt::format("redis URL: scheme must be redis:// or redis+cluster:// (got '{}')",
                    url.substr(0, url.find("://"))));
  }

  std::string_view query;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  // User info ends at the last '@' before the host list (a password may contain '@' only
  // percent-encoded, but be lenient with one written raw).
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view user_info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = user_info.find(':');
    if (colon == std::string_view::npos) {
      return Status::InvalidArgument(
          "redis URL: user info must be ':password@' or 'user:password@'");
    }
    KVTIER_ASSIGN_OR_RETURN(parsed.user, PercentDecode(user_info.substr(0, colon), "user"));
    KVTIER_ASSIGN_OR_RETURN(parsed.password,
                            PercentDecode(user_info.substr(colon + 1), "password"));
    if (parsed.password.empty()) {
      return Status::InvalidArgument("redis URL: empty password in the user info");
    }
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    if (slash + 1 != rest.size()) {
      return Status::InvalidArgument(fmt::format(
          "redis URL: path '{}' is not supported (no database numbers)", rest.substr(slash)));
    }
    rest = rest.substr(0, slash);
  }
  if (rest.empty()) return Status::InvalidArgument("redis URL: no host");

  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string_view::npos) comma = rest.size();
    KVTIER_ASSIGN_OR_RETURN(RedisEndpoint endpoint,
                            ParseRedisEndpoint(rest.substr(start, comma - start)));
    parsed.endpoints.push_back(std::move(endpoint));
    start = comma + 1;
  }
  if (!parsed.cluster && parsed.endpoints.size() != 1) {
    return Status::InvalidArgument(
        "redis URL: redis:// takes one host:port (use redis+cluster:// for several)");
  }

  while (!query.empty()) {
    size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
    if (name == "timeout_ms") {
      KVTIER_ASSIGN_OR_RETURN(const int64_t ms, ParseMillis(name, value));
      parsed.timeout = std::chrono::milliseconds(ms);
    } else if (name == "connect_timeout_ms") {
      KVTIER_ASSIGN_OR_RETURN(const int64_t ms, ParseMillis(name, value));
      parsed.connect_timeout = std::chrono::milliseconds(ms);
    } else if (name == "header_last_bytes") {
      Result<int64_t> bytes = ParseByteSize(value);
      if (!bytes.ok()) {
        return Status::InvalidArgument(
            fmt::format("redis URL: header_last_bytes: {}", bytes.status().message()));
      }
      parsed.header_last_bytes = *bytes;
    } else {
      return Status::InvalidArgument(
          fmt::format("redis URL: unknown parameter '{}' (known: timeout_ms, connect_timeout_ms, "
                      "header_last_bytes)",
                      name));
    }
  }
  return parsed;
}

std::string RedisUrl::Redacted() const {
  std::string out = cluster ? std::string(kClusterScheme) : std::string(kSingleScheme);
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (i > 0) out += ',';
    out += endpoints[i].ToString();
  }
  return out;
}

}  // namespace kvtier::storage
