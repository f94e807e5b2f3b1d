// The trainer under kills, signals, full disks, concurrent starts and damaged run files (issue 13):
// every interruption ends in a run that resumes to exactly the uninterrupted run's losses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/numerics/random.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/distributed.hpp"
#include "stableflash/train/run_files.hpp"
#include "stableflash/train/run_lock.hpp"
#include "stableflash/train/signals.hpp"
#include "stableflash/train/trainer.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

extern char** environ;

namespace stableflash::train {
namespace {

namespace fs = std::filesystem;
using stableflash::testing::expect_error_mentions;
using stableflash::testing::read_bytes;
using stableflash::testing::ScratchDir;
using Clock = std::chrono::steady_clock;

TrainResult train(const TrainConfig& c, const std::string& run_dir, bool resume = false,
                  std::function<void(const StepMetrics&)> on_step = {}) {
  TrainOptions o;
  o.run_dir = run_dir, o.resume = resume, o.progress = false, o.on_step = std::move(on_step);
  o.device = TrainDevice::cpu;
  o.stop_on_signals = true;
  return run_training(c, o);
}

std::vector<double> losses(const TrainResult& r) {
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

// step -> loss (and val_loss) as written in metrics.jsonl; a line cut by a kill is skipped.
std::map<int, std::pair<double, double>> metrics_losses(const std::string& path) {
  std::map<int, std::pair<double, double>> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      out[j.at("step").get<int>()] = {j.at("loss").get<double>(), j.value("val_loss", -1.0)};
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::size_t metrics_count(const std::string& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

// Progress lines ("step N/M ...") the trainer printed into `log` (not a terminal: one every 5%).
std::size_t progress_lines(const std::string& log) {
  std::ifstream in(log);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.starts_with("step ");
  return n;
}

// Every file of a directory tree with its bytes (a failed resume must change none of them).
std::map<std::string, std::vector<unsigned char>> tree(const std::string& dir) {
  std::map<std::string, std::vector<unsigned char>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != ".lock") out[fs::relative(e.path(), dir).string()] = read_bytes(e.path().string());
  return out;
}

// The stableflash binary, with stdout and stderr into `log`; returns its pid.
pid_t spawn_cli(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {STABLEFLASH_BIN};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 2, 1);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) throw std::runtime_error(std::string("cannot start ") + STABLEFLASH_BIN + ": " + std::strerror(err));
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::string read_text(const std::string& path) {
  const auto b = read_bytes(path);
  return {b.begin(), b.end()};
}

class Robustness : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir.file("data"));
    stableflash::testing::write_test_shards(dir.file("data"));
  }
  TrainConfig config() const { return stableflash::testing::small_config(dir.file("data")); }
  // The command line that trains `c` in `run` (every key as --set, so the binary sees exactly c).
  std::vector<std::string> cli_args(const TrainConfig& c, const std::string& run, bool resume, bool quiet = true) const {
    std::vector<std::string> a = {"train", "--device", "cpu", "--run-dir", run};
    if (quiet) a.push_back("--quiet");
    if (resume) a.push_back("--resume");
    for (const auto& [k, v] : c.entries()) a.insert(a.end(), {"--set", k + "=" + v});
    return a;
  }
  ScratchDir dir;
};

// Item 1: the first signal finishes the step, checkpoints it and returns; resuming continues to
// the uninterrupted run's losses bit for bit.
TEST_F(Robustness, SignalStopsAfterTheStepWithACheckpointAndResumesExactly) {
  TrainConfig c = config();
  c.train.checkpoint_every = 0;  // only at the end: the signal's checkpoint is the only one before it
  const auto whole = train(c, dir.file("whole"));
  ASSERT_EQ(whole.stopped_by_signal, 0);

  const auto stopped = train(c, dir.file("split"), false, [](const StepMetrics& m) {
    if (m.step == 1) ::raise(SIGTERM);
  });
  EXPECT_EQ(stopped.stopped_by_signal, SIGTERM);
  ASSERT_EQ(stopped.steps.size(), 2u) << "the step in flight finishes, no further one starts";
  EXPECT_EQ(stopped.last_checkpoint, dir.file("split/checkpoints/step_00000002"));
  EXPECT_EQ(open_checkpoint(latest_checkpoint(dir.file("split"))).state.step, 2);
  auto all = losses(stopped);
  for (double x : losses(train(c, dir.file("split"), true))) all.push_back(x);
  EXPECT_EQ(all, losses(whole));
  EXPECT_EQ(read_bytes(latest_checkpoint(dir.file("split")) + "/model.safetensors"),
            read_bytes(latest_checkpoint(dir.file("whole")) + "/model.safetensors"));
}

// Item 1: a second signal ends the process at once, unless it comes within a second of the first
// (a launcher passing the terminal's Ctrl-C on to a rank that already had it).
TEST_F(Robustness, SecondSignalEndsAtOnceButALaunchersEchoDoesNot) {
  // A forked child that uses only the signal module (no OpenMP after fork).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    StopOnSignals handlers;
    ::raise(SIGINT);
    if (stop_signal() != SIGINT) ::_exit(10);
    ::raise(SIGTERM);  // the echo: still running
    if (stop_signal() != SIGINT) ::_exit(11);
    ::usleep(1'200'000);
    ::raise(SIGINT);  // a second request: the default action
    ::_exit(12);
  }
  const int status = wait_status(pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

// Item 1 through the command line: Ctrl-C after the first step exits 130 with a checkpoint at the
// step it stopped at, says where, and --resume ends with the uninterrupted run's losses.
TEST_F(Robustness, CtrlCOnTheCommandLineExits130AndResumesExactly) {
  TrainConfig c = config();
  c.train.steps = 200, c.train.checkpoint_every = 0, c.train.val_every = 50;
  const std::string whole = dir.file("whole"), run = dir.file("run");
  ASSERT_EQ(wait_status(spawn_cli(cli_args(c, whole, false), dir.file("whole.log"))), 0) << read_text(dir.file("whole.log"));

  const pid_t pid = spawn_cli(cli_args(c, run, false), dir.file("run.log"));
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (metrics_count(run + "/metrics.jsonl") < 1 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGINT);
  const int status = wait_status(pid);
  const std::string log = read_text(dir.file("run.log"));
  ASSERT_TRUE(WIFEXITED(status)) << log;
  ASSERT_EQ(WEXITSTATUS(status), 130) << log;
  const auto done = std::int64_t(metrics_count(run + "/metrics.jsonl"));
  ASSERT_GE(done, 1);
  ASSERT_LT(done, 200) << "the run finished before the signal; nothing was tested";
  EXPECT_EQ(open_checkpoint(latest_checkpoint(run)).state.step, done) << "the checkpoint is at the step it stopped at";
  EXPECT_NE(log.find("stopped by SIGINT after step " + std::to_string(done) + " of 200"), std::string::npos) << log;
  EXPECT_NE(log.find(latest_checkpoint(run)), std::string::npos) << log;
  EXPECT_NE(log.find("--resume --run-dir " + run), std::string::npos) << log;

  ASSERT_EQ(wait_status(spawn_cli(cli_args(c, run, true), dir.file("resume.log"))), 0) << read_text(dir.file("resume.log"));
  EXPECT_EQ(metrics_losses(run + "/metrics.jsonl"), metrics_losses(whole + "/metrics.jsonl"));
  EXPECT_EQ(read_bytes(latest_checkpoint(run) + "/model.safetensors"), read_bytes(latest_checkpoint(whole) + "/model.safetensors"));
}

// The soak: runs killed at random moments (mostly SIGKILL, also SIGTERM and SIGINT; seeded) and
// resumed until they finish, each ending with the uninterrupted run's exact losses, data order
// and weights, and no temporary files left. STABLEFLASH_SOAK_ROUNDS sets the number of runs
// (scripts/soak-train.sh runs many).
TEST_F(Robustness, SoakRandomKillsAndResumesEndWithTheUninterruptedLosses) {
  const char* env = std::getenv("STABLEFLASH_SOAK_ROUNDS");
  const int rounds = env ? std::atoi(env) : 10;
  TrainConfig c = config();
  c.train.steps = 60, c.train.checkpoint_every = 7, c.train.val_every = 20;
  const std::string whole = dir.file("whole");
  const auto t0 = Clock::now();
  ASSERT_EQ(wait_status(spawn_cli(cli_args(c, whole, false), dir.file("whole.log"))), 0) << read_text(dir.file("whole.log"));
  const double run_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto soak_t0 = Clock::now();
  const auto want = metrics_losses(whole + "/metrics.jsonl");
  ASSERT_EQ(want.size(), 60u);
  SplitMix64 rng(2024);
  int kills = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::string run = dir.file("soak" + std::to_string(round));
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 200) << "no progress in " << run;
      const bool resume = fs::exists(run + "/checkpoints/latest");
      const std::string log = run + "-" + std::to_string(attempt) + ".log";
      const pid_t pid = spawn_cli(cli_args(c, run, resume, /*quiet=*/false), log);
      const std::int64_t first = resume ? open_checkpoint(latest_checkpoint(run)).state.step : 0;
      // The last attempts run to the end, so every round finishes.
      const bool interrupt = attempt < 40;
      const double u = rng.uniform();
      const int sig = u < 0.7 ? SIGKILL : u < 0.85 ? SIGTERM : SIGINT;
      int status = 0;
      bool exited = false;
      if (interrupt) {
        // A random moment measured in the attempt's own progress (wall-clock delays would miss the
        // steps on a loaded machine): once its progress output (a line every 3 steps) reaches a
        // random step, plus 0-6 ms (about 3 steps when idle); the first choice kills it while it starts.
        const std::size_t target = std::size_t(rng.next() % std::uint64_t((60 - first) / 3 + 2));  // the last choice: after the end
        while (progress_lines(log) < target && !(exited = ::waitpid(pid, &status, WNOHANG) == pid))
          std::this_thread::sleep_for(std::chrono::microseconds(300));
        std::this_thread::sleep_for(std::chrono::microseconds(rng.next() % 6000));
        ::kill(pid, sig);  // a zombie (exited above) ignores it
      }
      if (!exited) status = wait_status(pid);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
      ++kills;
      // Killed, or stopped cleanly by the signal (130/143); never an error of its own.
      const bool by_signal = (WIFSIGNALED(status) && WTERMSIG(status) == sig) || (WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig);
      ASSERT_TRUE(interrupt && by_signal) << run << " attempt " << attempt << " status " << status << ":\n" << read_text(log);
    }
    EXPECT_EQ(metrics_losses(run + "/metrics.jsonl"), want) << run;
    EXPECT_EQ(BatchLog::read(run + "/batches.log").steps, BatchLog::read(whole + "/batches.log").steps) << run;
    EXPECT_EQ(read_bytes(latest_checkpoint(run) + "/optimizer.safetensors"), read_bytes(latest_checkpoint(whole) + "/optimizer.safetensors"));
    for (const auto& e : fs::directory_iterator(run + "/checkpoints")) {
      const std::string name = e.path().filename().string();
      EXPECT_TRUE(name == "latest" || list_checkpoints(run).end() != std::find(list_checkpoints(run).begin(), list_checkpoints(run).end(), e.path().string()))
          << "left behind: " << e.path();
    }
  }
  std::printf("soak: %d runs, %d interruptions, each ended with the uninterrupted losses in %.1f s (one uninterrupted run: %.2f s)\n",
              rounds, kills, std::chrono::duration<double>(Clock::now() - soak_t0).count(), run_s);
}

// Item 1, data parallel: the --gpus launcher passes a signal on and waits for every rank to stop
// as asked; a rank that exits 130 first does not get rank 0 killed while it writes the checkpoint.
TEST_F(Robustness, LauncherLetsRank0FinishItsCheckpointAfterASignal) {
  const std::string out = dir.file("ranks");
  fs::create_directories(out);
  ::setenv("SOAK_OUT", out.c_str(), 1);
  // Rank 0 takes 0.5 s to "write its checkpoint" after the signal; rank 1 stops at once.
  const std::string script = "trap 'if [ \"$RANK\" = 0 ]; then sleep 0.5; echo saved > \"$SOAK_OUT/rank0\"; fi; exit 130' INT; "
                             "echo > \"$SOAK_OUT/ready$RANK\"; while :; do sleep 0.02; done";
  std::thread interrupt([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!(fs::exists(out + "/ready0") && fs::exists(out + "/ready1")) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(::getpid(), SIGINT);  // the launcher's handler is installed: it passes it on
  });
  const int code = launch_local_ranks(2, {"/bin/sh", "-c", script}, /*grace_s=*/5.0);
  interrupt.join();
  ::unsetenv("SOAK_OUT");
  EXPECT_EQ(code, 130);
  EXPECT_TRUE(fs::exists(out + "/rank0")) << "rank 0 was stopped before it finished";
}

// Item 2: a second trainer in a live run's directory (fresh or --resume) is refused, naming the
// holder's pid; once the holder is gone the run continues.
TEST_F(Robustness, SecondTrainerInTheSameRunDirIsRefusedNamingThePid) {
  TrainConfig c = config();
  c.train.steps = 3;
  train(c, dir.file("run"));
  TrainConfig more = c;
  more.train.steps = 6;
  {
    const RunLock live(dir.file("run"));  // a live run holds it
    const auto before = tree(dir.file("run"));
    const std::string pid = "pid " + std::to_string(::getpid());
    expect_error_mentions([&] { train(more, dir.file("run"), true); }, {dir.file("run"), "in use by another stableflash train", pid});
    expect_error_mentions([&] { train(c, dir.file("run")); }, {"in use by another stableflash train", pid});  // a fresh start too
    EXPECT_EQ(tree(dir.file("run")), before) << "the refused trainer changed the run";
  }
  EXPECT_EQ(train(more, dir.file("run"), true).steps.front().step, 3);
}

// Item 5: a torn last line (a full disk or a kill while logging a step past the checkpoint) does
// not block resume; the resumed run's logs equal the uninterrupted run's.
TEST_F(Robustness, TornBatchLogLinePastTheCheckpointDoesNotBlockResume) {
  const TrainConfig c = config();  // 6 steps, checkpoints every 3
  train(c, dir.file("whole"));
  TrainConfig crash = c;
  crash.train.steps = 5;
  train(crash, dir.file("run"));
  fs::remove_all(dir.file("run/checkpoints/step_00000005"));
  data::write_file_atomically(dir.file("run/checkpoints/latest"), [](std::ostream& o) { o << "step_00000003\n"; });
  std::ofstream(dir.file("run/batches.log"), std::ios::app) << "5 0:123 1:4";  // cut mid-line
  train(c, dir.file("run"), true);
  EXPECT_EQ(BatchLog::read(dir.file("run/batches.log")).steps, BatchLog::read(dir.file("whole/batches.log")).steps);
  EXPECT_EQ(metrics_losses(dir.file("run/metrics.jsonl")), metrics_losses(dir.file("whole/metrics.jsonl")));
}

// Item 5: a resume that fails changes no file of the run; a missing batch log is an error (it
// cannot be replayed), not silently rebuilt; a damaged record before the checkpoint names the line.
TEST_F(Robustness, FailedResumeChangesNothingAndAMissingBatchLogIsAnError) {
  TrainConfig c = config();
  train(c, dir.file("run"));  // checkpoints at 3 and 6
  TrainConfig more = c;
  more.train.steps = 9, more.train.val_every = 2;  // config.json would change
  fs::rename(dir.file("run/batches.log"), dir.file("batches.log.saved"));
  auto before = tree(dir.file("run"));
  expect_error_mentions([&] { train(more, dir.file("run"), true); }, {"batches.log is missing", "first 6 steps", "replayed"});
  EXPECT_EQ(tree(dir.file("run")), before);

  auto text = read_text(dir.file("batches.log.saved"));
  text.replace(text.find("\n2 "), 3, "\n2 x");  // step 2's record damaged: before the checkpoint
  std::ofstream(dir.file("run/batches.log")) << text;
  before = tree(dir.file("run"));
  expect_error_mentions([&] { train(more, dir.file("run"), true); }, {"batches.log:6", "bad window"});
  EXPECT_EQ(tree(dir.file("run")), before);
}

// Item 6: what a kill or a full disk leaves (temporary checkpoint folders, `latest` and other temp
// files) is removed when the run resumes; a folder moved aside is put back when it is the only copy.
TEST_F(Robustness, InterruptedWritesAreCleanedUpWhenTheRunStarts) {
  TrainConfig c = config();
  c.train.steps = 3;
  train(c, dir.file("run"));
  const std::string ck = dir.file("run/checkpoints/");
  fs::create_directories(ck + "step_00000006.tmp-999999");
  std::ofstream(ck + "step_00000006.tmp-999999/model.safetensors") << "partial";
  fs::copy(ck + "step_00000003", ck + "step_00000003.old-4242");  // step_00000003 exists: a stale copy
  std::ofstream(ck + ".latest.tmp.31337") << "step_0000";
  std::ofstream(dir.file("run/.metrics.jsonl.tmp.77")) << "{";
  std::ofstream(ck + "notes.tmp-1") << "not ours: kept";
  TrainConfig more = c;
  more.train.steps = 4;
  train(more, dir.file("run"), true);
  for (const char* gone : {"checkpoints/step_00000006.tmp-999999", "checkpoints/step_00000003.old-4242", "checkpoints/.latest.tmp.31337",
                           ".metrics.jsonl.tmp.77"})
    EXPECT_FALSE(fs::exists(dir.file("run/") + gone)) << gone;
  EXPECT_TRUE(fs::exists(ck + "notes.tmp-1"));

  // Killed between moving step_N aside and renaming the new one in: the old copy comes back.
  fs::rename(ck + "step_00000004", ck + "step_00000004.old-555");
  EXPECT_EQ(clean_up_interrupted_writes(dir.file("run")), std::vector<std::string>{});
  EXPECT_EQ(open_checkpoint(latest_checkpoint(dir.file("run"))).state.step, 4);
}

// Item 6: `latest` naming anything but a checkpoint folder of this run is refused.
TEST_F(Robustness, LatestPointingOutsideTheRunIsRefused) {
  TrainConfig c = config();
  c.train.steps = 3;
  train(c, dir.file("run"));
  fs::create_directories(dir.file("elsewhere"));
  fs::copy(dir.file("run/checkpoints/step_00000003"), dir.file("elsewhere/step_00000003"));
  for (const std::string& bad : {std::string("../../elsewhere/step_00000003"), dir.file("elsewhere/step_00000003"), std::string("step_3/../x"),
                                std::string("step_"), std::string("latest")}) {
    data::write_file_atomically(dir.file("run/checkpoints/latest"), [&](std::ostream& o) { o << bad << "\n"; });
    expect_error_mentions([&] { train(c, dir.file("run"), true); }, {"checkpoints/latest names '" + bad + "'", "step_NNNNNNNN"});
  }
}

// Item 7: the non-finite-loss message names the step of the last checkpoint, not the last step run.
TEST_F(Robustness, NonFiniteLossNamesTheLastCheckpointsStep) {
  TrainConfig c = config();
  // lr 1e7 takes the weights to overflow within the run (at step 13 with today's numerics; the step
  // moves with any change of the model's rounding, so it is read from the run, not written here).
  c.optim.lr = 1e7, c.optim.warmup_steps = 0, c.train.checkpoint_every = 5, c.train.val_every = 0, c.train.steps = 30;
  std::string message;
  try {
    train(c, dir.file("run"));
    FAIL() << "expected lr 1e7 to overflow within " << c.train.steps << " steps";
  } catch (const NonFiniteLoss& e) {
    message = e.what();
  }
  std::smatch at;
  ASSERT_TRUE(std::regex_search(message, at, std::regex("at step ([0-9]+);"))) << message;
  const int failed = std::stoi(at[1]);
  ASSERT_GE(failed, c.train.checkpoint_every) << "the run must pass a checkpoint before it fails: " << message;
  // the last checkpoint before the failing step (written after each checkpoint_every-th step, holding
  // the steps done), named in the message and left current on disk
  const int saved = failed / c.train.checkpoint_every * c.train.checkpoint_every;
  char name[64];
  std::snprintf(name, sizeof name, "step_%08d (step %d)", saved, saved);
  EXPECT_NE(message.find(name), std::string::npos) << message;
  EXPECT_EQ(open_checkpoint(latest_checkpoint(dir.file("run"))).state.step, saved);
}

// A full disk: a checkpoint that cannot be written leaves the previous one intact and current, no
// partial folder behind, and an error naming the file and the reason. Needs root to mount a tmpfs.
TEST_F(Robustness, FullDiskLeavesThePreviousCheckpointCurrent) {
  const std::string mnt = dir.file("small_fs");
  fs::create_directories(mnt);
  // The small model's checkpoint is ~430 KB (weights + two moments); 700 KB holds one, not two.
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=700k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs at " << mnt << " (" << std::strerror(errno) << "; needs root): full-disk test skipped";
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  TrainConfig c = config();
  c.train.keep_checkpoints = 5;
  const std::string run = mnt + "/run";
  try {
    train(c, run);
    FAIL() << "expected the second checkpoint to fill the file system";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step_00000006.tmp-"), std::string::npos) << msg;
  }
  EXPECT_EQ(open_checkpoint(latest_checkpoint(run)).state.step, 3);
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    EXPECT_TRUE(e.path().filename() == "latest" || e.path().filename() == "step_00000003") << "left behind: " << e.path();
}

}  // namespace
}  // namespace stableflash::train
