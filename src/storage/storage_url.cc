// Storage URLs (storage_url.h) and byte sizes (ParseByteSize in storage.h).
//
// Thread safety: pure functions and plain values.
#include "storage/storage_url.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "kvtier/storage.h"
#include "kvtier/storage_schemes.h"

namespace kvtier {

Result<int64_t> ParseByteSize(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format("byte size '{}': {}", text, why));
  };
  // digits [. digits] [unit]
  size_t i = 0;
  unsigned __int128 mantissa = 0;
  int int_digits = 0, frac_digits = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    mantissa = mantissa * 10 + static_cast<unsigned>(text[i] - '0');
    if (mantissa > (static_cast<unsigned __int128>(1) << 80)) return bad("too large");
    ++i, ++int_digits;
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (frac_digits == 18) return bad("more than 18 decimals");
      mantissa = mantissa * 10 + static_cast<unsigned>(text[i] - '0');
      ++i, ++frac_digits;
    }
  }
  if (int_digits + frac_digits == 0) {
    return bad(text.empty() || text[0] != '-' ? "expected a number (like 64MiB or 1.5GB)"
                                              : "negative");
  }
  std::string unit(text.substr(i));
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  struct Unit {
    const char* name;
    unsigned __int128 bytes;
  };
  constexpr unsigned __int128 kKi = 1024, kK = 1000;
  const Unit units[] = {{"", 1},
                        {"b", 1},
                        {"kb", kK},
                        {"mb", kK * kK},
                        {"gb", kK * kK * kK},
                        {"tb", kK * kK * kK * kK},
                        {"kib", kKi},
                        {"mib", kKi * kKi},
                        {"gib", kKi * kKi * kKi},
                        {"tib", kKi * kKi * kKi * kKi}};
  const Unit* found = nullptr;
  for (const auto& u : units) {
    if (unit == u.name) found = &u;
  }
  if (found == nullptr) {
    return bad("unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  }
  unsigned __int128 scale = 1;
  for (int d = 0; d < frac_digits; ++d) scale *= 10;
  const unsigned __int128 scaled = mantissa * found->bytes;
  if (scaled % scale != 0) return bad("not a whole number of bytes");
  const unsigned __int128 bytes = scaled / scale;
  if (bytes > (static_cast<unsigned __int128>(1) << 60)) return bad("above 2^60 bytes");
  return static_cast<int64_t>(bytes);
}

std::string RedactUrl(std::string_view url) {
  constexpr std::string_view kHidden = "***";
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos) {
    const size_t at = url.rfind('@');
    if (at == std::string_view::npos) return std::string(url);
    return fmt::format("{}{}", kHidden, url.substr(at));
  }
  const std::string_view rest = url.substr(sep + 3);
  const StorageScheme* scheme = FindStorageScheme(url.substr(0, sep));
  const bool hosts = scheme != nullptr && scheme->form == StorageUrlForm::kHosts;
  const std::string_view authority =
      rest.substr(0, hosts ? rest.find('?') : rest.find_first_of("/?"));
  const size_t at = authority.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  return fmt::format("{}{}{}", url.substr(0, sep + 3), kHidden, rest.substr(at));
}

namespace storage {

Result<StorageUrl> ParseStorageUrl(std::string_view url) {
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos || sep == 0) {
    return Status::InvalidArgument(fmt::format("storage URL '{}' has no scheme (expected {})",
                                               RedactUrl(url), StorageSchemeList()));
  }
  // A C string cut at a NUL would name another path (file:///a\0b opens /a).
  if (url.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}' holds a NUL byte", RedactUrl(url.substr(0, url.find('\0')))));
  }
  StorageUrl out;
  out.scheme = std::string(url.substr(0, sep));
  std::string_view rest = url.substr(sep + 3);
  const size_t q = rest.find('?');
  out.rest = std::string(rest.substr(0, q));
  if (q == std::string_view::npos) return out;
  std::string_view query = rest.substr(q + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return Status::InvalidArgument(fmt::format(
          "storage URL parameter '{}' is not name=value (in '{}')", item, RedactUrl(url)));
    }
    std::string name(item.substr(0, eq));
    for (const auto& [n, v] : out.params) {
      if (n == name) {
        return Status::InvalidArgument(
            fmt::format("storage URL parameter '{}' given twice (in '{}')", name, RedactUrl(url)));
      }
    }
    out.params.emplace_back(std::move(name), std::string(item.substr(eq + 1)));
  }
  return out;
}

std::optional<std::string> StorageUrl::Take(std::string_view name) {
  for (auto it = params.begin(); it != params.end(); ++it) {
    if (it->first == name) {
      std::string value = std::move(it->second);
      params.erase(it);
      return value;
    }
  }
  return std::nullopt;
}

Result<std::optional<int64_t>> StorageUrl::TakeByteSize(std::string_view name) {
  auto value = Take(name);
  if (!value) return std::optional<int64_t>();
  auto bytes = ParseByteSize(*value);
  if (!bytes.ok()) return bytes.status().WithContext(fmt::format("storage URL parameter {}", name));
  return std::optional<int64_t>(*bytes);
}

Result<std::optional<int64_t>> StorageUrl::TakeInt(std::string_view name, int64_t min,
                                                   int64_t max) {
  auto value = Take(name);
  if (!value) return std::optional<int64_t>();
  int64_t v = 0;
  const char* end = value->data() + value->size();
  auto [ptr, ec] = std::from_chars(value->data(), end, v);
  if (ec != std::errc() || ptr != end || v < min || v > max) {
    return Status::InvalidArgument(fmt::format(
        "storage URL parameter {}={} must be an integer in [{}, {}]", name, *value, min, max));
  }
  return std::optional<int64_t>(v);
}

Result<std::optional<bool>> StorageUrl::TakeBool(std::string_view name) {
  auto value = Take(name);
  if (!value) return std::optional<bool>();
  if (*value == "1" || *value == "true") return std::optional<bool>(true);
  if (*value == "0" || *value == "false") return std::optional<bool>(false);
  return Status::InvalidArgument(
      fmt::format("storage URL parameter {}={} must be 0, 1, true or false", name, *value));
}

Status StorageUrl::CheckAllTaken(std::string_view url_for_messages) const {
  if (params.empty()) return Status::OK();
  return Status::InvalidArgument(fmt::format("storage URL '{}': unknown parameter '{}'",
                                             RedactUrl(url_for_messages), params.front().first));
}

}  // namespace storage
}  // namespace kvtier
