#include "stableflash/data/shards.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <utility>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "stableflash/data/atomic_file.hpp"

namespace stableflash::data {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) { throw std::runtime_error(path + ": " + what); }

std::int32_t le32(const unsigned char* p) {
  return static_cast<std::int32_t>(std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                   std::uint32_t(p[3]) << 24);
}

void put_le32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Every id must index a real row of the model's embedding. Ids in GPT-2's padding rows
// (50257..50303) would silently train rows no text produces; larger ids would fail only when a
// window holding them is drawn, hours later and without the file. One pass over the mapped shard
// finds the maximum (vectorized, memory-bound); only a bad shard pays for locating the first culprit.
void check_token_ids(const std::string& path, const std::uint16_t* tokens, std::size_t count, std::uint32_t vocab_size) {
  if (vocab_size > 0xFFFF) return;  // every uint16 is a valid id
  std::uint16_t max = 0;
  for (std::size_t i = 0; i < count; ++i) max = std::max(max, tokens[i]);
  if (max < vocab_size) return;
  std::size_t first = 0, bad_count = 0;
  for (std::size_t i = count; i-- > 0;)
    if (tokens[i] >= vocab_size) first = i, ++bad_count;
  bad(path, "token id " + std::to_string(tokens[first]) + " at token offset " + std::to_string(first) + " (byte " +
                std::to_string(kShardHeaderBytes + 2 * first) + ") is outside the vocabulary of " + std::to_string(vocab_size) +
                " ids (0.." + std::to_string(vocab_size - 1) + "); " + std::to_string(bad_count) + " of its " + std::to_string(count) +
                " tokens are. Was the shard made with another tokenizer?");
}

}  // namespace

void write_shard(const std::string& path, std::span<const std::uint16_t> tokens) {
  if (tokens.size() > std::size_t(INT32_MAX)) bad(path, "a shard holds at most 2^31-1 tokens (the header count is int32)");
  unsigned char header[kShardHeaderBytes] = {};
  put_le32(header, std::uint32_t(kShardMagic));
  put_le32(header + 4, std::uint32_t(kShardVersion));
  put_le32(header + 8, std::uint32_t(tokens.size()));
  write_file_atomically(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    // uint16 little-endian: the in-memory layout on every machine we build for
    static_assert(std::endian::native == std::endian::little, "shards are little-endian");
    out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size_bytes()));
  });
}

Shard Shard::open(const std::string& path, std::uint32_t vocab_size) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) bad(path, std::string("cannot open shard: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    bad(path, std::string("cannot stat shard: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    bad(path, S_ISDIR(st.st_mode) ? "is a folder, expected a token shard (a file)" : "is not a regular file, expected a token shard");
  }
  const std::size_t size = std::size_t(st.st_size);
  Shard s;
  s.path_ = path;
  if (size < kShardHeaderBytes) {
    ::close(fd);
    bad(path, "short header: " + std::to_string(size) + " bytes, a shard header is " + std::to_string(kShardHeaderBytes));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) bad(path, std::string("cannot map shard: ") + std::strerror(errno));
  s.map_ = map, s.map_bytes_ = size;
  const auto* bytes = static_cast<const unsigned char*>(map);
  const std::int32_t magic = le32(bytes), version = le32(bytes + 4), count = le32(bytes + 8);
  if (magic != kShardMagic)
    bad(path, "bad magic " + std::to_string(magic) + " (expected " + std::to_string(kShardMagic) + "): not an llm.c token shard");
  if (version != kShardVersion)
    bad(path, "unsupported shard version " + std::to_string(version) + " (expected " + std::to_string(kShardVersion) + ")");
  if (count < 0) bad(path, "negative token count in header");
  const std::size_t body = size - kShardHeaderBytes;
  if (body % 2 != 0) bad(path, "odd byte count in the token body (" + std::to_string(body) + " bytes): tokens are uint16");
  if (body / 2 < std::size_t(count))
    bad(path, "truncated: header says " + std::to_string(count) + " tokens, file holds " + std::to_string(body / 2));
  if (body / 2 > std::size_t(count))
    bad(path, "trailing data: header says " + std::to_string(count) + " tokens, file holds " + std::to_string(body / 2));
  s.tokens_ = reinterpret_cast<const std::uint16_t*>(bytes + kShardHeaderBytes);
  s.count_ = std::size_t(count);
  check_token_ids(path, s.tokens_, s.count_, vocab_size);
  return s;
}

Shard::Shard(Shard&& o) noexcept { *this = std::move(o); }

Shard& Shard::operator=(Shard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
  }
  return *this;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw std::runtime_error(dir + ": not a folder of shards");
  const std::regex name(split + "_[0-9]{6}\\.bin");
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), name)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

ShardSet::ShardSet(const std::vector<std::string>& paths, std::uint32_t vocab_size) {
  if (paths.empty()) throw std::runtime_error("no shards given");
  for (const auto& p : paths) {
    shards_.push_back(Shard::open(p, vocab_size));
    total_tokens_ += shards_.back().tokens().size();
  }
}

std::uint64_t ShardSet::window_count(std::size_t len) const {
  std::uint64_t n = 0;
  for (const auto& s : shards_)
    if (s.tokens().size() >= len) n += s.tokens().size() - len + 1;
  return n;
}

WindowStart ShardSet::sample(SplitMix64& rng, std::size_t len) const {
  const std::uint64_t total = window_count(len);
  if (total == 0) throw std::runtime_error("no shard holds a window of " + std::to_string(len) + " tokens");
  // Lemire-free rejection keeps the draw exactly uniform.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % total;
  std::uint64_t r;
  do r = rng.next();
  while (r >= limit);
  std::uint64_t k = r % total;
  for (std::uint32_t i = 0; i < shards_.size(); ++i) {
    const std::size_t n = shards_[i].tokens().size();
    if (n < len) continue;
    if (k < n - len + 1) return {i, k};
    k -= n - len + 1;
  }
  throw std::logic_error("window sampling ran past the shards");
}

std::span<const std::uint16_t> ShardSet::window(const WindowStart& w, std::size_t len) const {
  if (w.shard >= shards_.size())
    throw std::runtime_error("window names shard " + std::to_string(w.shard) + " but only " + std::to_string(shards_.size()) +
                             " shards are loaded");
  const auto t = shards_[w.shard].tokens();
  if (w.offset + len > t.size())
    throw std::runtime_error(shards_[w.shard].path() + ": window at offset " + std::to_string(w.offset) + " of " +
                             std::to_string(len) + " tokens runs past its " + std::to_string(t.size()) + " tokens");
  return t.subspan(w.offset, len);
}

}  // namespace stableflash::data
