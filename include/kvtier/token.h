// kvtier/token.h — the token id type the cache and the KV pattern helpers index by.
//
// Thread safety: a type alias.
#pragma once

#include <cstdint>

namespace kvtier {

using Token = int32_t;

}  // namespace kvtier
