#include "stableflash/data/file_checks.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>

namespace stableflash::data {
namespace fs = std::filesystem;
namespace {

struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator==(const FileId&) const = default;
};

// stat() follows symlinks: a link to the input is the input.
std::optional<FileId> file_id(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// True when `inner` is `outer` or lies somewhere below it, judged by inode on every ancestor of
// `inner`'s absolute path (an output folder need not exist yet: its existing ancestors decide).
bool same_or_inside(const fs::path& inner, const FileId& outer) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(inner, ec), ec);
  if (ec) return false;
  for (;;) {
    if (const auto id = file_id(p); id && *id == outer) return true;
    if (!p.has_relative_path()) return false;  // reached the root
    p = p.parent_path();
  }
}

}  // namespace

void require_readable_file(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open " + what + ": " + std::strerror(errno));
  struct stat st {};
  const bool folder = ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
  ::close(fd);
  if (folder) throw std::runtime_error(path + ": is a folder, not a " + what);
}

void refuse_output_over_input(const std::string& output, const std::vector<std::string>& inputs, const std::string& flag) {
  const auto out = file_id(output);
  if (!out) return;
  for (const auto& in : inputs)
    if (file_id(in) == out)
      throw std::runtime_error(flag + " " + output + " is the same file as the input " + in +
                               "; writing it would destroy the input. Choose another output path");
}

void refuse_output_folder_over_inputs(const std::string& out_dir, const std::vector<std::string>& inputs, const std::string& flag) {
  for (const auto& in : inputs) {
    const auto in_id = file_id(in);
    if (!in_id) continue;  // a missing input is reported by the reader, with its own message
    if (same_or_inside(out_dir, *in_id))
      throw std::runtime_error(flag + " " + out_dir + " is, or lies inside, the input " + in +
                               "; its shards would be read back as text. Choose an output folder outside the inputs");
  }
}

}  // namespace stableflash::data
