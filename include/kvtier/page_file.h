// kvtier/page_file.h — how the file store (file://) puts a written page file in place, public so
// that whatever measures the store against the file system does the same file-system work
// (`kvtier bench --storage file://…`'s write ceiling) instead of restating it.
//
// Thread safety: a pure function of its arguments (concurrent calls on other names are safe).
#pragma once

namespace kvtier {

// Puts the file `temp` of directory `dirfd` (AT_FDCWD: paths relative to the working directory)
// in place as `name` there: a reader of `name` sees what was there before or the new file, never
// neither. Where a regular file is already at `name` (a page written again), the two are swapped
// (renameat2 RENAME_EXCHANGE) instead of the old one being renamed over: on ext4 (auto_da_alloc,
// its default) a rename over an existing file writes back the new file's data inside rename(2)
// ("replace-via-rename": it waits for the block allocation and the disk's queue; 26.6 ms of an
// 8 MiB page's Set on the H100, 55-80 % of the page). Then `*replaced` is true and the old file is
// at `temp`: the caller unlinks it (the file store does after its index took the new page).
// Without renameat2's flags (EINVAL, ENOSYS: some network and FUSE file systems), or when what is
// at `name` is no regular file, a plain renameat. False with errno on failure (`temp` left as it
// is).
bool PublishFile(int dirfd, const char* temp, const char* name, bool* replaced);

}  // namespace kvtier
