// tools/replay/replay_tp_janitor.h — what `kvtier replay --tp N`'s rank 0 leaves behind if it
// dies without cleaning up (SIGKILL, an abort, the OOM killer): its decision ring's segment
// (/dev/shm) and its passes' file stores (TMPDIR). The follower ranks die with rank 0
// (PR_SET_PDEATHSIG), so none of them can remove these either.
//
// A TpJanitor is a small process (/bin/sh) that rank 0 starts first and tells, over a socket
// whose other end only rank 0 holds, what it has made. When that socket closes without a "done"
// from rank 0 — rank 0 ended, however it ended — the janitor removes every directory and ring
// it was told of, then exits; it ignores the terminal's signals (a Ctrl-C kills rank 0 and must
// not kill its cleanup). Rank 0's normal path removes them itself and says "done"; the
// janitor then exits removing nothing. Each thing is registered right after it is made, so the
// window in which a death leaves it is the registration's one send.
//
// Thread safety: one TpJanitor, used from rank 0's main thread.
#pragma once

#include <sys/types.h>

#include <string>

#include "kvtier/status.h"

namespace kvtier::tools {

class TpJanitor {
 public:
  // Starts the janitor. `kvtier` is this program's path (the janitor removes a ring with
  // `kvtier shm destroy NAME`, the library's own way of removing a segment by name).
  static Result<TpJanitor> Start(const std::string& kvtier);
  TpJanitor() = default;
  TpJanitor(TpJanitor&& other) noexcept;
  TpJanitor& operator=(TpJanitor&& other) noexcept;
  TpJanitor(const TpJanitor&) = delete;
  TpJanitor& operator=(const TpJanitor&) = delete;
  // Says "done" (nothing to remove), closes the socket and reaps the janitor.
  ~TpJanitor();

  // The janitor removes the directory tree `path` if rank 0 dies. InvalidArgument for a path
  // with a newline (the protocol's separator); IOError when the janitor is gone.
  Status RemoveDirOnDeath(const std::string& path);
  // The same for the shared-memory segment `name` (the decision ring).
  Status RemoveSegmentOnDeath(const std::string& name);

 private:
  Status Send(const std::string& line);
  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace kvtier::tools
