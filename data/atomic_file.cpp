#include "stableflash/data/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace stableflash::data {
namespace fs = std::filesystem;
namespace {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open to flush: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && !directory) throw std::runtime_error(path + ": flush to disk failed: " + std::strerror(errno));
}

// Follows a chain of symlinks to the path that is really written: renaming over a symlink would
// replace the link itself with a regular file. A dangling link yields its (missing) target, which
// is then created, as a shell's `>` does.
fs::path follow_links(const std::string& path) {
  fs::path p(path);
  for (int hops = 0;; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec)) || ec) return p;
    if (hops == 40) throw std::runtime_error(path + ": too many levels of symbolic links");
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) throw std::runtime_error(path + ": cannot read the symbolic link: " + ec.message());
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
}

// FIFOs and character devices (a pipe to another program, /dev/null, /dev/stdout, /dev/full) take
// the bytes in place: they cannot be renamed over, and replacing them would break the pipe or,
// as root, the device node.
void write_through(const std::string& path, const fs::path& target, const std::function<void(std::ostream&)>& write) {
  std::ofstream out(target, std::ios::binary);
  if (!out) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
  write(out);
  out.flush();
  if (!out) throw std::runtime_error(path + ": writing failed: " + std::strerror(errno));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const fs::path target = follow_links(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) return write_through(path, target, write);
    const char* kind = S_ISDIR(st.st_mode) ? "a folder" : S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a regular file";
    throw std::runtime_error(path + ": is " + std::string(kind) + "; refusing to replace it with a file (expected a file name)");
  }
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path tmp = dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw std::runtime_error(path + ": cannot create temporary file " + tmp.string() + ": " + std::strerror(errno));
      write(out);
      out.flush();
      if (!out) throw std::runtime_error(path + ": writing failed: " + std::strerror(errno));
    }
    fsync_path(tmp.string(), false);
    fs::rename(tmp, target);
    fsync_path(dir.string(), true);
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

}  // namespace stableflash::data
