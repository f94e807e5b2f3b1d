// The corpus pipeline: read documents in batches, encode each batch on every core (long documents
// cut at points that provably do not change the tokens), then append them in input order to the
// train or val stream, which are cut into llm.c shards.
#include "stableflash/data/prepare.hpp"

#include <omp.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/data/documents.hpp"
#include "stableflash/data/file_checks.hpp"
#include "stableflash/data/shards.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::data {
namespace fs = std::filesystem;

namespace {

// A batch holds about this much text per thread; documents longer than kChunkBytes * 2 are cut
// into chunks of about kChunkBytes so one huge file still keeps every core busy.
constexpr std::size_t kBatchBytesPerThread = 4 << 20;
constexpr std::size_t kChunkBytes = 1 << 20;

class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, std::uint64_t shard_tokens)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens) {}

  void append(const std::uint32_t* t, std::size_t n) {
    while (n > 0) {
      const std::size_t take = std::min<std::uint64_t>(n, shard_tokens_ - buf_.size());
      for (std::size_t i = 0; i < take; ++i) buf_.push_back(static_cast<std::uint16_t>(t[i]));  // GPT-2 ids < 2^16
      t += take, n -= take, tokens_ += take;
      if (buf_.size() == shard_tokens_) flush();
    }
  }
  void flush() {
    if (buf_.empty()) return;
    char name[32];
    std::snprintf(name, sizeof name, "_%06zu.bin", paths_.size());
    paths_.push_back((fs::path(dir_) / (split_ + name)).string());
    write_shard(paths_.back(), buf_);
    buf_.clear();
  }
  std::uint64_t tokens() const { return tokens_; }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::string dir_, split_;
  std::uint64_t shard_tokens_;
  std::vector<std::uint16_t> buf_;
  std::vector<std::string> paths_;
  std::uint64_t tokens_ = 0;
};

void check_options(const PrepareOptions& o) {
  if (o.out_dir.empty()) throw std::invalid_argument("prepare: no output folder given (-o OUTDIR)");
  if (!(o.val_fraction >= 0.0 && o.val_fraction <= 1.0))
    throw std::invalid_argument("prepare: --val-fraction must be in [0, 1], got " + std::to_string(o.val_fraction));
  if (o.shard_tokens < 1 || o.shard_tokens > std::uint64_t(INT32_MAX))
    throw std::invalid_argument("prepare: --shard-tokens must be in [1, 2^31-1] (the llm.c header count is int32)");
}

// Refuses an output folder that would overwrite or be read as an input, and one that is a file.
void check_out_dir(const PrepareOptions& o) {
  std::error_code ec;
  const auto st = fs::status(o.out_dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw std::runtime_error("-o " + o.out_dir + ": exists and is not a folder (prepare writes a folder of shards)");
  refuse_output_folder_over_inputs(o.out_dir, o.inputs, "-o");
}

// Refuses to mix new shards with shards of an earlier run, unless told to replace them.
void prepare_out_dir(const PrepareOptions& o) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) throw std::runtime_error("-o " + o.out_dir + ": cannot create the output folder: " + ec.message());
  std::vector<std::string> old = list_shards(o.out_dir, "train");
  for (auto& p : list_shards(o.out_dir, "val")) old.push_back(p);
  if (old.empty()) return;
  if (!o.overwrite)
    throw std::runtime_error(o.out_dir + ": already holds " + std::to_string(old.size()) +
                             " shards (e.g. " + old.front() + "); pass --overwrite to replace them");
  for (const auto& p : old) fs::remove(p);
  fs::remove(fs::path(o.out_dir) / "prepare.json");
}

struct Unit {
  std::size_t doc, begin, end;
};

}  // namespace

bool is_val_document(std::uint64_t seed, std::uint64_t index, double val_fraction) {
  if (val_fraction <= 0) return false;
  SplitMix64 rng(seed, index);
  return rng.uniform() < val_fraction;
}

PrepareSummary prepare_shards(std::shared_ptr<const Gpt2Tokenizer> tokenizer, const PrepareOptions& o,
                              const std::function<void(const PrepareProgress&)>& progress) {
  check_options(o);
  check_out_dir(o);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<InputFile> files = expand_inputs(o.inputs);
  prepare_out_dir(o);
  const int threads = o.threads > 0 ? o.threads : omp_get_num_procs();
  std::vector<Gpt2Encoder> encoders;
  for (int i = 0; i < threads; ++i) encoders.emplace_back(tokenizer);

  DocumentReader reader(files);
  ShardWriter train(o.out_dir, "train", o.shard_tokens), val(o.out_dir, "val", o.shard_tokens);
  PrepareSummary sum;
  sum.threads = threads;
  PrepareProgress& p = sum.totals;
  p.bytes_total = reader.total_bytes();

  std::vector<RawDocument> docs;
  std::vector<Unit> units;
  std::vector<std::vector<std::uint32_t>> unit_tokens;
  const std::size_t batch_bytes = kBatchBytesPerThread * std::size_t(threads);
  for (;;) {
    std::size_t n_docs = 0, bytes = 0;
    while (bytes < batch_bytes) {
      if (docs.size() == n_docs) docs.emplace_back();
      if (!reader.next_raw(docs[n_docs])) break;
      bytes += docs[n_docs++].bytes.size();
    }
    if (n_docs == 0) break;

    // JSON decoding is as slow as encoding on one core: done in parallel too.
    std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 64) num_threads(threads)
    for (std::size_t d = 0; d < n_docs; ++d) {
      try {
        reader.decode_json_line(docs[d]);
      } catch (...) {
#pragma omp critical
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    bytes = 0;
    for (std::size_t d = 0; d < n_docs; ++d) bytes += docs[d].bytes.size();

    units.clear();
    for (std::size_t d = 0; d < n_docs; ++d) {
      const std::string& doc = docs[d].bytes;
      std::size_t begin = 0;
      // Cutting is exact only for valid UTF-8 (invalid bytes make the rest of a document one piece).
      if (doc.size() > 2 * kChunkBytes && utf8_valid_prefix(doc) == doc.size())
        for (const std::size_t cut : parallel_cut_points(doc, kChunkBytes)) units.push_back({d, begin, cut}), begin = cut;
      units.push_back({d, begin, doc.size()});
    }
    if (unit_tokens.size() < units.size()) unit_tokens.resize(units.size());

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (std::size_t u = 0; u < units.size(); ++u) {
      try {
        unit_tokens[u].clear();
        const Unit& un = units[u];
        encoders[std::size_t(omp_get_thread_num())].encode(std::string_view(docs[un.doc].bytes).substr(un.begin, un.end - un.begin),
                                                           unit_tokens[u]);
      } catch (...) {
#pragma omp critical
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);

    // In input order: <|endoftext|> before each document (llm.c), then its tokens.
    for (std::size_t u = 0; u < units.size(); ++u) {
      const std::uint64_t index = p.documents + units[u].doc;
      ShardWriter& w = is_val_document(o.seed, index, o.val_fraction) ? val : train;
      if (units[u].begin == 0) {
        w.append(&kEndOfText, 1);
        ++(&w == &val ? sum.val_documents : sum.train_documents);
      }
      w.append(unit_tokens[u].data(), unit_tokens[u].size());
    }
    p.documents += n_docs;
    p.text_bytes += bytes;
    p.tokens = train.tokens() + val.tokens();
    p.bytes_consumed = reader.bytes_consumed();
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (progress) progress(p);
  }
  train.flush();
  val.flush();
  sum.train_tokens = train.tokens(), sum.val_tokens = val.tokens();
  sum.train_shards = train.paths(), sum.val_shards = val.paths();
  p.bytes_consumed = reader.bytes_consumed();
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (progress) progress(p);

  // The manifest holds only what determines the shards and what they hold (no times), so a rerun
  // with the same inputs and seed writes the same file.
  nlohmann::json m;
  m["format"] = "llm.c token shards (magic 20240520, version 1, uint16 tokens)";
  m["tokenizer"] = "gpt2 (tiktoken encode_ordinary), <|endoftext|> = 50256 before each document";
  m["inputs"] = o.inputs;
  m["input_files"] = files.size();
  m["input_bytes"] = p.bytes_total;
  m["text_bytes"] = p.text_bytes;
  m["seed"] = o.seed;
  m["val_fraction"] = o.val_fraction;
  m["shard_tokens"] = o.shard_tokens;
  m["documents"] = p.documents;
  auto names = [](const std::vector<std::string>& v) {
    std::vector<std::string> n;
    for (const auto& s : v) n.push_back(fs::path(s).filename().string());
    return n;
  };
  m["train"] = {{"documents", sum.train_documents}, {"tokens", sum.train_tokens}, {"shards", names(sum.train_shards)}};
  m["val"] = {{"documents", sum.val_documents}, {"tokens", sum.val_tokens}, {"shards", names(sum.val_shards)}};
  write_file_atomically((fs::path(o.out_dir) / "prepare.json").string(), [&](std::ostream& out) { out << m.dump(2) << '\n'; });
  return sum;
}

}  // namespace stableflash::data
