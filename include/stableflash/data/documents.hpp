// Reading a corpus as a stream of documents: plain text files (one document each) and JSON-lines
// files (one document per line, its "text" field), either possibly zstd-compressed (.zst).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stableflash::data {

struct InputFile {
  enum class Kind { Text, JsonLines };
  std::string path;
  Kind kind = Kind::Text;
  bool zstd = false;
  std::uint64_t size_bytes = 0;  // on disk (compressed size for .zst)
};

// Expands the inputs of `prepare` in order: a file stands for itself; a folder for every regular
// file below it, recursively, in byte order of their paths, skipping names that start with '.'.
// Kind by name: *.jsonl, *.ndjson (optionally + .zst) are JSON lines, everything else text.
// Throws naming an input that does not exist or a folder with no file.
std::vector<InputFile> expand_inputs(const std::vector<std::string>& inputs);

// A document as read: its text, or for JSON lines the raw line (decoded later, in parallel, by
// decode_json_line) and where it came from, for error messages.
struct RawDocument {
  std::string bytes;
  bool json = false;
  std::size_t file = 0;    // index into the reader's files
  std::uint64_t line = 0;  // 1-based line of a JSON-lines document
};

// The documents of the files, in order.
class DocumentReader {
 public:
  explicit DocumentReader(std::vector<InputFile> files);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document, JSON lines left raw; false when all files are read. Errors (unreadable
  // file, corrupt or truncated zstd) name the file.
  bool next_raw(RawDocument& doc);
  // Replaces a raw JSON line by its "text" field; errors name the file and line.
  void decode_json_line(RawDocument& doc) const;
  // next_raw + decode_json_line: the next document's text.
  bool next(std::string& doc);
  // Bytes of the input files consumed so far (compressed bytes for .zst): progress and ETA.
  std::uint64_t bytes_consumed() const;
  std::uint64_t total_bytes() const { return total_; }

 private:
  struct Source;
  bool open_next();
  std::vector<InputFile> files_;
  std::size_t next_file_ = 0;
  std::unique_ptr<Source> src_;
  std::uint64_t done_bytes_ = 0, total_ = 0;
};

}  // namespace stableflash::data
