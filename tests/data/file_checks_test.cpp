// Output paths that must not be replaced (symlinks, FIFOs, inputs) and input paths whose errors
// must name the path and the reason.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/data/file_checks.hpp"
#include "test_files.hpp"

namespace stableflash::data {
namespace {

namespace fs = std::filesystem;
using stableflash::testing::expect_error_mentions;
using stableflash::testing::ScratchDir;

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](std::ostream& o) { o << text; });
}

TEST(OutputPaths, ASymlinkIsWrittenThroughAndStaysALink) {
  ScratchDir dir;
  write_text(dir.file("real.txt"), "old");
  fs::create_symlink("real.txt", dir.file("link.txt"));  // relative, as users make them
  write_text(dir.file("link.txt"), "new");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir.file("link.txt"))));
  EXPECT_EQ(slurp(dir.file("real.txt")), "new");
  // a dangling link: its target is created, the link kept
  fs::create_symlink("later.txt", dir.file("dangling"));
  write_text(dir.file("dangling"), "made");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir.file("dangling"))));
  EXPECT_EQ(slurp(dir.file("later.txt")), "made");
}

TEST(OutputPaths, AFifoIsWrittenInPlaceNotReplaced) {
  ScratchDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A reader opened without blocking lets the writer's open succeed; the few bytes fit the pipe's
  // buffer, so no thread is needed, and a FIFO replaced by a file leaves the reader empty, not hung.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  write_text(fifo, "through the pipe");
  char buf[64] = {};
  const ssize_t n = ::read(reader, buf, sizeof buf);
  ::close(reader);
  EXPECT_EQ(std::string(buf, std::size_t(std::max<ssize_t>(n, 0))), "through the pipe");
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));
}

TEST(OutputPaths, AFolderIsRefusedNotReplaced) {
  ScratchDir dir;
  fs::create_directory(dir.file("sub"));
  expect_error_mentions([&] { write_text(dir.file("sub"), "x"); }, {dir.file("sub"), "is a folder"});
  EXPECT_TRUE(fs::is_directory(dir.file("sub")));
}

TEST(OutputPaths, AnOutputThatIsAnInputIsRefusedHoweverItIsSpelled) {
  ScratchDir dir;
  write_text(dir.file("in.safetensors"), "input");
  fs::create_symlink(dir.file("in.safetensors"), dir.file("alias"));
  fs::create_hard_link(dir.file("in.safetensors"), dir.file("hard"));
  const std::vector<std::string> inputs{dir.file("in.safetensors")};
  for (const std::string& out : {dir.file("in.safetensors"), dir.file("./in.safetensors"), dir.file("alias"), dir.file("hard")})
    expect_error_mentions([&] { refuse_output_over_input(out, inputs, "-o"); }, {"-o " + out, "same file as the input"});
  write_text(dir.file("other"), "x");
  EXPECT_NO_THROW(refuse_output_over_input(dir.file("other"), inputs, "-o"));
  EXPECT_NO_THROW(refuse_output_over_input(dir.file("missing"), inputs, "-o"));
}

TEST(OutputPaths, AnOutputFolderInsideAnInputFolderIsRefused) {
  ScratchDir dir;
  fs::create_directories(dir.file("texts/sub"));
  const std::vector<std::string> inputs{dir.file("texts")};
  expect_error_mentions([&] { refuse_output_folder_over_inputs(dir.file("texts"), inputs, "-o"); }, {"lies inside"});
  expect_error_mentions([&] { refuse_output_folder_over_inputs(dir.file("texts/sub/new/out"), inputs, "-o"); }, {"texts/sub/new/out"});
  EXPECT_NO_THROW(refuse_output_folder_over_inputs(dir.file("out"), inputs, "-o"));
  EXPECT_NO_THROW(refuse_output_folder_over_inputs(dir.file("texts2"), inputs, "-o"));  // a name prefix is not a parent
}

TEST(InputPaths, MissingFilesAndFoldersAreNamedWithTheReason) {
  ScratchDir dir;
  expect_error_mentions([&] { require_readable_file(dir.file("nope"), "text file"); },
                        {dir.file("nope"), "cannot open text file", "No such file or directory"});
  expect_error_mentions([&] { require_readable_file(dir.file(""), "text file"); }, {dir.file(""), "is a folder, not a text file"});
  write_text(dir.file("ok"), "x");
  EXPECT_NO_THROW(require_readable_file(dir.file("ok"), "text file"));
}

}  // namespace
}  // namespace stableflash::data
