// Test helper for the file store's tests: a capability dropped from this thread's effective set
// for a scope (raised again after), so a test running as root can see what a process without it
// sees (O_NOATIME on a file of another owner is EPERM without CAP_FOWNER). Threads started in the
// scope inherit the reduced set (Linux capabilities are per thread).
#pragma once

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace kvtier::storage::testing {

class ScopedDropCapability {
 public:
  // Drops `cap` (CAP_...) when this thread has it effective; ok() says whether it did.
  explicit ScopedDropCapability(int cap) : cap_(cap) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    if (::syscall(SYS_capget, &header, data_) != 0) return;
    const uint32_t bit = uint32_t{1} << (cap_ % 32);
    if ((data_[cap_ / 32].effective & bit) == 0) return;
    data_[cap_ / 32].effective &= ~bit;
    ok_ = ::syscall(SYS_capset, &header, data_) == 0;
  }
  ~ScopedDropCapability() {
    if (!ok_) return;
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    data_[cap_ / 32].effective |= uint32_t{1} << (cap_ % 32);
    ::syscall(SYS_capset, &header, data_);
  }
  ScopedDropCapability(const ScopedDropCapability&) = delete;
  ScopedDropCapability& operator=(const ScopedDropCapability&) = delete;

  bool ok() const { return ok_; }

 private:
  const int cap_;
  __user_cap_data_struct data_[_LINUX_CAPABILITY_U32S_3] = {};
  bool ok_ = false;
};

}  // namespace kvtier::storage::testing
