// libFuzzer target over the storage URL parsers: ParseStorageUrl with every typed Take* (what the
// file:// and memory:// backends run), ParseRedisUrl (redis:// and redis+cluster://),
// ParseRedisEndpoint, ParseByteSize, and RedactUrl.
//
// The input is tried as it is and behind each scheme prefix ("file://", "memory://", "redis://",
// "redis+cluster://"). Properties checked:
//   1. no crash, out-of-bounds access or undefined behaviour (ASan/UBSan);
//   2. RedactUrl never shows what the redis parser took as the user info: for a redis URL with a
//      password, RedactUrl(url) is the URL with everything between "://" and the user info's '@'
//      replaced by "***";
//   3. no error message (nor RedactUrl) shows the raw user info with its '@';
//   4. a parsed redis URL has 1 endpoint (redis://) or more (cluster), ports in [1, 65535],
//      non-empty hosts; Redacted() has no '@'.
// Any violation aborts (a finding). Run: build-fuzz/tests/fuzz/kvtier_fuzz_storage_url
// -max_total_time=30
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kvtier/storage.h"
#include "storage/redis_url.h"
#include "storage/storage_url.h"

namespace {

namespace storage = kvtier::storage;
using kvtier::RedactUrl;

void Check(bool ok) {
  if (!ok) std::abort();
}

// The URL as RedactUrl must show it, for a redis URL whose user info ends at its last '@' before
// the query.
std::string Visible(const std::string& url) {
  const size_t sep = url.find("://");
  const std::string_view rest = std::string_view(url).substr(sep + 3);
  const size_t at = rest.substr(0, rest.find('?')).rfind('@');
  return url.substr(0, sep + 3) + "***" + std::string(rest.substr(at));
}

void Generic(const std::string& url) {
  const std::string redacted = RedactUrl(url);
  kvtier::Result<storage::StorageUrl> parsed = storage::ParseStorageUrl(url);
  if (!parsed.ok()) return;
  // What the file and memory backends take, in their order; each may fail on its own.
  (void)parsed->TakeByteSize("capacity");
  (void)parsed->TakeInt("shards", 1, 4096);
  (void)parsed->TakeBool("fsync");
  (void)parsed->Take("io");
  (void)parsed->CheckAllTaken(url);
  (void)redacted;
}

void Redis(const std::string& url) {
  const std::string redacted = RedactUrl(url);
  kvtier::Result<storage::RedisUrl> parsed = storage::ParseRedisUrl(url);
  if (!parsed.ok()) return;
  Check(!parsed->endpoints.empty());
  Check(parsed->cluster || parsed->endpoints.size() == 1);
  for (const storage::RedisEndpoint& e : parsed->endpoints) {
    Check(!e.host.empty() && e.port >= 1 && e.port <= 65535);
    Check(storage::ParseRedisEndpoint(e.ToString()).ok());
  }
  Check(parsed->Redacted().find('@') == std::string::npos);
  if (parsed->password.empty()) return;
  Check(redacted == Visible(url));
}

// Error messages of URLs whose user info was parsed must not show it: the raw user info with its
// '@' (5+ bytes: no message has such text of its own) appears in none.
void ErrorsHidePassword(const std::string& url) {
  kvtier::Result<storage::RedisUrl> parsed = storage::ParseRedisUrl(url);
  if (!parsed.ok() || parsed->password.empty()) return;
  const size_t sep = url.find("://");
  const std::string_view rest = std::string_view(url).substr(sep + 3);
  const size_t at = rest.substr(0, rest.find('?')).rfind('@');
  const std::string user_info(rest.substr(0, at + 1));
  if (user_info.size() < 5 || Visible(url).find(user_info) != std::string::npos) return;
  // The same user info in front of a broken host list and a bad parameter.
  for (const std::string& bad : {url + "?nope=1", url.substr(0, sep + 3 + at + 1) + "h:0"}) {
    kvtier::Result<storage::RedisUrl> r = storage::ParseRedisUrl(bad);
    if (!r.ok()) Check(r.status().ToString().find(user_info) == std::string::npos);
    kvtier::Result<storage::StorageUrl> s = storage::ParseStorageUrl(bad);
    if (!s.ok()) Check(s.status().ToString().find(user_info) == std::string::npos);
    Check(RedactUrl(bad).find(user_info) == std::string::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  (void)kvtier::ParseByteSize(input);
  (void)storage::ParseRedisEndpoint(input);
  Generic(input);
  Redis(input);
  for (const char* scheme : {"file://", "memory://"}) Generic(scheme + input);
  for (const char* scheme : {"redis://", "redis+cluster://"}) {
    Redis(scheme + input);
    ErrorsHidePassword(scheme + input);
    Generic(scheme + input);
  }
  return 0;
}
