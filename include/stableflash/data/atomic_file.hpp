// Writing files so that a crash never leaves a half-written one under the final name: write a
// temporary file beside the target, flush it to disk, rename it over the target, flush the folder.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace stableflash::data {

// Calls `write` with a stream to a temporary file, then atomically replaces `path` with it.
// Throws std::runtime_error naming `path` when any step fails; the old file is then untouched.
// What is at `path` is respected: a symlink is followed and its target replaced (the link stays);
// a FIFO or character device (/dev/null, /dev/stdout) is written in place, not atomically; a
// folder, block device or socket is refused.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace stableflash::data
