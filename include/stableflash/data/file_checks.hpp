// Checks on the paths users hand the tools, so that an error names the path and the reason (the
// system's errno text) instead of a C++ library message, and an output never destroys an input.
#pragma once

#include <string>
#include <vector>

namespace stableflash::data {

// "PATH: cannot open WHAT: <strerror>" or "PATH: is a folder, not a WHAT"; returns
// quietly when `path` can be opened for reading and is not a folder.
void require_readable_file(const std::string& path, const std::string& what);

// Refuses (std::runtime_error naming both paths and `flag`) an output that is the same file as one
// of the inputs: same device and inode, so another spelling, a hard link or a symlink of the input
// is caught too. A missing output is never the same as an input.
void refuse_output_over_input(const std::string& output, const std::vector<std::string>& inputs, const std::string& flag);

// For an output folder: refuses one that is an input folder or lies inside one (the folder walk
// of a later run, or of this one, would read its shards as text).
void refuse_output_folder_over_inputs(const std::string& out_dir, const std::vector<std::string>& inputs, const std::string& flag);

}  // namespace stableflash::data
