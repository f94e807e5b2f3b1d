// `stableflash prepare INPUT... -o OUTDIR`: text -> GPT-2 tokens -> llm.c train/val shards, with
// a progress bar and a summary on stderr.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "commands.hpp"
#include "stableflash/data/prepare.hpp"

namespace stableflash::cli {
namespace {

using namespace stableflash::data;

struct PrepareCommand {
  PrepareOptions opt;
  std::string ranks;
  bool quiet = false;
};

std::string human(double v, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 && i ? "%.2f %s%s" : "%.1f %s%s", v, prefix[i], unit);
  return buf;
}

std::string clock(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  char buf[32];
  const long t = long(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

// A bar redrawn in place on a terminal; on a pipe or log file, one line every ~10% instead.
class ProgressBar {
 public:
  ProgressBar() : tty_(::isatty(STDERR_FILENO) != 0) {}
  void operator()(const PrepareProgress& p) {
    const double frac = p.bytes_total ? double(p.bytes_consumed) / double(p.bytes_total) : 1.0;
    if (!tty_ && ((frac < next_report_ && frac < 1.0) || p.tokens == last_tokens_)) return;  // a log gets ~10 lines
    next_report_ = frac + 0.1, last_tokens_ = p.tokens;
    const double mbps = p.seconds > 0 ? double(p.text_bytes) / p.seconds / 1e6 : 0;
    const double eta = frac > 0 ? p.seconds * (1 - frac) / frac : -1;
    constexpr int kWidth = 30;
    std::string bar(kWidth, ' ');
    for (int i = 0; i < int(frac * kWidth + 1e-9) && i < kWidth; ++i) bar[std::size_t(i)] = '#';
    std::fprintf(stderr, "%s[%s] %5.1f%%  %s / %s  %s tokens  %.1f MB/s  ETA %s%s", tty_ ? "\r" : "", bar.c_str(), 100 * frac,
                 human(double(p.bytes_consumed), "B").c_str(), human(double(p.bytes_total), "B").c_str(),
                 human(double(p.tokens), "").c_str(), mbps, clock(eta).c_str(), tty_ ? "   " : "\n");
    std::fflush(stderr);
  }
  void done() {
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  bool tty_;
  double next_report_ = 0;
  std::uint64_t last_tokens_ = UINT64_MAX;
};

int run(PrepareCommand& c) {
  auto tok = Gpt2Tokenizer::load(resolve_gpt2_ranks_path(c.ranks));
  ProgressBar bar;
  const PrepareSummary s = prepare_shards(tok, c.opt, c.quiet ? std::function<void(const PrepareProgress&)>() : std::ref(bar));
  if (!c.quiet) bar.done();
  const auto& t = s.totals;
  std::fprintf(stderr,
               "prepare: %llu documents, %s of text -> %llu tokens in %.1f s (%.1f MB/s on %d threads)\n"
               "  train: %llu documents, %llu tokens, %zu shards\n"
               "  val:   %llu documents, %llu tokens, %zu shards\n"
               "  wrote %s/{train,val}_NNNNNN.bin and %s/prepare.json\n",
               (unsigned long long)t.documents, human(double(t.text_bytes), "B").c_str(), (unsigned long long)t.tokens, t.seconds,
               t.seconds > 0 ? double(t.text_bytes) / t.seconds / 1e6 : 0.0, s.threads, (unsigned long long)s.train_documents,
               (unsigned long long)s.train_tokens, s.train_shards.size(), (unsigned long long)s.val_documents,
               (unsigned long long)s.val_tokens, s.val_shards.size(), c.opt.out_dir.c_str(), c.opt.out_dir.c_str());
  if (s.val_documents == 0 && c.opt.val_fraction > 0)
    std::fprintf(stderr, "prepare: warning: no document fell into val (%llu documents, --val-fraction %g); "
                         "split the text into more files or raise --val-fraction\n",
                 (unsigned long long)t.documents, c.opt.val_fraction);
  return 0;
}

}  // namespace

Runner add_prepare_command(CLI::App& app) {
  auto c = std::make_shared<PrepareCommand>();
  CLI::App* sub = app.add_subcommand(
      "prepare",
      "Tokenize text (files, folders, JSON lines with a \"text\" field; .zst too) into llm.c train/val shards, "
      "<|endoftext|> before each document");
  sub->add_option("inputs", c->opt.inputs, "Text files, folders (recursive) and .jsonl files; any may end in .zst")->required();
  sub->add_option("-o,--out", c->opt.out_dir, "Output folder for train_NNNNNN.bin, val_NNNNNN.bin, prepare.json")->required();
  sub->add_option("--val-fraction", c->opt.val_fraction, "Probability that a document goes to val")->capture_default_str();
  sub->add_option("--shard-tokens", c->opt.shard_tokens, "Tokens per shard (llm.c FineWeb: 10^8)")->capture_default_str();
  sub->add_option("--seed", c->opt.seed, "Seed of the train/val split")->capture_default_str();
  sub->add_option("--threads", c->opt.threads, "Encoding threads (0: every core)")->capture_default_str();
  sub->add_flag("--overwrite", c->opt.overwrite, "Replace shards an earlier run left in the output folder");
  sub->add_flag("-q,--quiet", c->quiet, "No progress bar");
  sub->add_option("--ranks", c->ranks,
                  "GPT-2 ranks file in tiktoken format (default: $STABLEFLASH_GPT2_RANKS, else the set-up's .deps/gpt2.tiktoken)");
  return [c] { return run(*c); };
}

}  // namespace stableflash::cli
