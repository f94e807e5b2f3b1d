#include "stableflash/data/documents.hpp"

#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace stableflash::data {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

InputFile classify(const fs::path& p) {
  InputFile f;
  f.path = p.string();
  std::string name = p.filename().string();
  if (ends_with(name, ".zst")) f.zstd = true, name.resize(name.size() - 4);
  if (ends_with(name, ".jsonl") || ends_with(name, ".ndjson")) f.kind = InputFile::Kind::JsonLines;
  std::error_code ec;
  f.size_bytes = fs::file_size(p, ec);
  if (ec) throw std::runtime_error(f.path + ": cannot read its size: " + ec.message());
  return f;
}

}  // namespace

std::vector<InputFile> expand_inputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw std::runtime_error("no input files or folders given");
  std::vector<InputFile> out;
  for (const auto& in : inputs) {
    const fs::path p(in);
    if (fs::is_regular_file(p)) {
      out.push_back(classify(p));
    } else if (fs::is_directory(p)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(p); it != fs::recursive_directory_iterator(); ++it) {
        if (it->path().filename().string().starts_with(".")) {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file()) found.push_back(it->path());
      }
      // Byte order of the path, not the folder's listing order: the same shards on every machine.
      std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
      if (found.empty()) throw std::runtime_error(in + ": folder holds no input file");
      for (const auto& f : found) out.push_back(classify(f));
    } else {
      throw std::runtime_error(in + ": no such file or folder");
    }
  }
  return out;
}

// One input file as a stream of (decompressed) bytes, read in blocks.
struct DocumentReader::Source {
  InputFile file;
  std::FILE* fp = nullptr;
  ZSTD_DStream* zs = nullptr;
  std::vector<char> raw, buf;  // raw: compressed input block; buf: bytes ready for the reader
  ZSTD_inBuffer zin{nullptr, 0, 0};
  std::size_t buf_pos = 0;
  std::uint64_t consumed = 0, line = 0;
  bool eof = false;
  bool frame_open = false;  // a zstd frame started and not yet finished: EOF there is truncation

  explicit Source(InputFile f) : file(std::move(f)) {
    fp = std::fopen(file.path.c_str(), "rb");
    if (!fp) throw std::runtime_error(file.path + ": cannot open: " + std::strerror(errno));
    raw.resize(1 << 20);
    if (file.zstd) {
      zs = ZSTD_createDStream();
      ZSTD_initDStream(zs);
    }
  }
  ~Source() {
    if (fp) std::fclose(fp);
    if (zs) ZSTD_freeDStream(zs);
  }

  // Refills `buf`; false at the end of the file.
  bool fill() {
    buf.clear(), buf_pos = 0;
    while (buf.empty()) {
      if (!file.zstd) {
        if (eof) return false;
        buf.resize(raw.size());
        const std::size_t n = std::fread(buf.data(), 1, buf.size(), fp);
        if (std::ferror(fp)) throw std::runtime_error(file.path + ": read error: " + std::strerror(errno));
        buf.resize(n), consumed += n;
        if (n == 0) eof = true;
        continue;
      }
      if (zin.pos == zin.size) {
        if (eof) {
          if (frame_open) throw std::runtime_error(file.path + ": truncated zstd stream (the last frame is incomplete)");
          return false;
        }
        const std::size_t n = std::fread(raw.data(), 1, raw.size(), fp);
        if (std::ferror(fp)) throw std::runtime_error(file.path + ": read error: " + std::strerror(errno));
        consumed += n;
        zin = {raw.data(), n, 0};
        if (n == 0) eof = true;
        continue;
      }
      buf.resize(ZSTD_DStreamOutSize());
      ZSTD_outBuffer zout{buf.data(), buf.size(), 0};
      const std::size_t r = ZSTD_decompressStream(zs, &zout, &zin);
      if (ZSTD_isError(r)) throw std::runtime_error(file.path + ": not a valid zstd stream: " + ZSTD_getErrorName(r));
      frame_open = r != 0;
      buf.resize(zout.pos);
    }
    return true;
  }

  void read_all(std::string& out) {
    out.clear();
    while (buf_pos < buf.size() || fill()) {
      out.append(buf.data() + buf_pos, buf.size() - buf_pos);
      buf_pos = buf.size();
    }
  }

  // The next line without its '\n'; false at the end.
  bool read_line(std::string& out) {
    out.clear();
    bool any = false;
    while (buf_pos < buf.size() || fill()) {
      any = true;
      const char* start = buf.data() + buf_pos;
      const char* nl = static_cast<const char*>(std::memchr(start, '\n', buf.size() - buf_pos));
      if (nl) {
        out.append(start, nl);
        buf_pos += std::size_t(nl - start) + 1;
        ++line;
        return true;
      }
      out.append(start, buf.size() - buf_pos);
      buf_pos = buf.size();
    }
    if (any) ++line;
    return any;
  }
};

DocumentReader::DocumentReader(std::vector<InputFile> files) : files_(std::move(files)) {
  for (const auto& f : files_) total_ += f.size_bytes;
}

DocumentReader::~DocumentReader() = default;

std::uint64_t DocumentReader::bytes_consumed() const { return done_bytes_ + (src_ ? src_->consumed : 0); }

bool DocumentReader::open_next() {
  if (src_) done_bytes_ += src_->consumed, src_.reset();
  if (next_file_ == files_.size()) return false;
  src_ = std::make_unique<Source>(files_[next_file_++]);
  return true;
}

bool DocumentReader::next_raw(RawDocument& doc) {
  for (;;) {
    if (!src_ && !open_next()) return false;
    doc.file = next_file_ - 1;
    if (src_->file.kind == InputFile::Kind::Text) {
      src_->read_all(doc.bytes);
      doc.json = false, doc.line = 0;
      open_next();  // a text file is one document
      return true;
    }
    while (src_->read_line(doc.bytes)) {
      if (doc.bytes.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines separate nothing
      doc.json = true, doc.line = src_->line;
      return true;
    }
    open_next();
  }
}

void DocumentReader::decode_json_line(RawDocument& doc) const {
  if (!doc.json) return;
  const std::string where = files_[doc.file].path + ":" + std::to_string(doc.line);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(doc.bytes);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(where + ": not a JSON line: " + e.what());
  }
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
    throw std::runtime_error(where + ": expected a JSON object with a string field \"text\"");
  doc.bytes = j["text"].get_ref<const std::string&>();
  doc.json = false;
}

bool DocumentReader::next(std::string& doc) {
  RawDocument raw;
  if (!next_raw(raw)) return false;
  decode_json_line(raw);
  doc = std::move(raw.bytes);
  return true;
}

}  // namespace stableflash::data
