// The environment of a data-parallel run, the local launcher and the rendezvous (distributed.hpp).
#include "stableflash/train/distributed.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

extern char** environ;

namespace stableflash::train {
namespace {

using Clock = std::chrono::steady_clock;

int parse_int(const char* name, const char* value, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  if (!*value || *end || errno || v < lo || v > hi)
    throw std::invalid_argument(std::string("environment variable ") + name + " = '" + value + "': expected an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return int(v);
}

std::string errno_text() { return std::strerror(errno); }

// One message on the liveness channel: a type, the rank it is about and a value.
enum class Msg : std::int32_t { hello = 1, heartbeat = 2, done = 3, abort = 4 };
struct Message {
  Msg type;
  std::int32_t rank;
  std::int64_t value;
};

bool send_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= std::size_t(w);
  }
  return true;
}

bool recv_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= std::size_t(r);
  }
  return true;
}

void send_message(int fd, Msg type, int rank, std::int64_t value) {
  const Message m{type, rank, value};
  send_all(fd, &m, sizeof m);  // a peer that is gone is noticed by the monitor, not here
}

sockaddr_in resolve(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (const int err = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); err != 0 || !res)
    throw std::runtime_error("rendezvous: cannot resolve MASTER_ADDR '" + host + "': " + gai_strerror(err));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(std::uint16_t(port));
  return addr;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "ended (status " + std::to_string(status) + ")";
}

// A TCP port nobody listens on now (the kernel's choice), for the local rendezvous.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("launcher: socket: " + errno_text());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("launcher: cannot find a free port: " + errno_text());
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

volatile sig_atomic_t g_forward_signal = 0;
void remember_signal(int sig) { g_forward_signal = sig; }

}  // namespace

World world_from(const std::function<const char*(const char*)>& getenv) {
  World w;
  const char* rank = getenv("RANK");
  const char* size = getenv("WORLD_SIZE");
  const char* local = getenv("LOCAL_RANK");
  const char *rank_name = "RANK", *size_name = "WORLD_SIZE", *local_name = "LOCAL_RANK";
  if (!rank && !size) {  // Slurm's srun
    rank = getenv("SLURM_PROCID"), size = getenv("SLURM_NTASKS"), local = getenv("SLURM_LOCALID");
    rank_name = "SLURM_PROCID", size_name = "SLURM_NTASKS", local_name = "SLURM_LOCALID";
  }
  if (!rank && !size) return w;
  if (!rank || !size) throw std::invalid_argument(std::string("environment: ") + (rank ? size_name : rank_name) + " is unset but " +
                                                  (rank ? rank_name : size_name) + " is set; a data-parallel run needs both");
  w.size = parse_int(size_name, size, 1, 1 << 20);
  w.rank = parse_int(rank_name, rank, 0, w.size - 1);
  w.local_rank = local ? parse_int(local_name, local, 0, 1 << 16) : w.rank;
  if (w.size > 1) {
    const char* addr = getenv("MASTER_ADDR");
    const char* port = getenv("MASTER_PORT");
    if (!addr || !*addr) throw std::invalid_argument("environment: MASTER_ADDR is unset; the rendezvous needs rank 0's address");
    if (!port) throw std::invalid_argument("environment: MASTER_PORT is unset; the rendezvous needs a port");
    w.master_addr = addr;
    w.master_port = parse_int("MASTER_PORT", port, 1, 65535);
    // Under torchrun its own store listens on MASTER_PORT; ours takes the next port unless told.
    if (const char* own = getenv("STABLEFLASH_RENDEZVOUS_PORT"))
      w.master_port = parse_int("STABLEFLASH_RENDEZVOUS_PORT", own, 1, 65535);
    else if (getenv("TORCHELASTIC_RUN_ID"))
      w.master_port = w.master_port == 65535 ? 65534 : w.master_port + 1;
  }
  return w;
}

World world_from_environment() {
  return world_from([](const char* name) { return std::getenv(name); });
}

int launch_local_ranks(int n, const std::vector<std::string>& argv, double grace_s) {
  if (n < 1) throw std::invalid_argument("--gpus must be >= 1");
  if (argv.empty()) throw std::invalid_argument("launcher: no program to run");
  const int port = free_port();
  std::vector<pid_t> pids(std::size_t(n), -1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = remember_signal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  auto stop_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  for (int r = 0; r < n; ++r) {
    // This process's environment (NCCL settings included) plus the torchrun variables.
    std::vector<std::string> env_strings = {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n), "LOCAL_RANK=" + std::to_string(r),
                                            "LOCAL_WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                                            "MASTER_PORT=" + std::to_string(port)};
    std::vector<char*> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv(*e);
      const std::string key = kv.substr(0, kv.find('='));
      if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" || key == "MASTER_ADDR" || key == "MASTER_PORT")
        continue;
      env.push_back(*e);
    }
    for (auto& s : env_strings) env.push_back(s.data());
    env.push_back(nullptr);
    pid_t pid = -1;
    if (const int err = ::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), env.data()); err != 0) {
      stop_all(SIGTERM);
      throw std::runtime_error("launcher: cannot start rank " + std::to_string(r) + " (" + argv[0] + "): " + std::strerror(err));
    }
    pids[std::size_t(r)] = pid;
  }
  int result = 0, running = n;
  int forwarded = 0;  // the signal passed on to the ranks, if any
  bool kill_pending = false;  // SIGKILL the rest at kill_deadline
  Clock::time_point kill_deadline{};
  while (running > 0) {
    if (g_forward_signal) {
      std::fprintf(stderr, "stableflash: passing signal %d on to the %d ranks\n", int(g_forward_signal), n);
      stop_all(int(g_forward_signal));
      forwarded = int(g_forward_signal);
      g_forward_signal = 0;
      if (!kill_pending) kill_pending = true, kill_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(4 * grace_s));
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (int r = 0; r < n; ++r) {
        if (pids[std::size_t(r)] != done) continue;
        pids[std::size_t(r)] = -1;
        --running;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        // A rank that stopped as asked (130/143 after a signal) is no failure: rank 0 may still be
        // writing the checkpoint, and a SIGTERM now would end it half-way.
        if (forwarded && WIFEXITED(status) && (WEXITSTATUS(status) == 128 + SIGINT || WEXITSTATUS(status) == 128 + SIGTERM)) {
          if (result == 0) result = WEXITSTATUS(status);
          continue;
        }
        if (!ok && result == 0) {
          result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          std::fprintf(stderr, "stableflash: rank %d (pid %d) %s; stopping the other ranks\n", r, int(done), describe_status(status).c_str());
          stop_all(SIGTERM);
          kill_pending = true;
          kill_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
        }
      }
      continue;
    }
    if (kill_pending && Clock::now() > kill_deadline) {
      std::fprintf(stderr, "stableflash: ranks still running %.0f s after being asked to stop; killing them\n", grace_s);
      stop_all(SIGKILL);
      kill_pending = false;
    }
    ::usleep(20000);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

Rendezvous::Rendezvous(const World& world, std::vector<char> payload, double connect_timeout_s, double hang_timeout_s)
    : world_(world), hang_timeout_s_(hang_timeout_s) {
  const sockaddr_in addr = resolve(world.master_addr, world.master_port);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(connect_timeout_s));
  const std::string where = world.master_addr + ":" + std::to_string(world.master_port);
  if (world.rank == 0) {
    payload_ = std::move(payload);
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // Bound to the given address only: the rendezvous is not reachable from elsewhere.
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, world.size) != 0)
      throw std::runtime_error("rendezvous: rank 0 cannot listen on " + where + ": " + errno_text());
    peers_.assign(std::size_t(world.size), -1);
    for (int joined = 1; joined < world.size;) {
      pollfd p{listen_fd_, POLLIN, 0};
      const int left_ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (left_ms <= 0 || ::poll(&p, 1, left_ms) <= 0) {
        std::string missing;
        for (int r = 1; r < world.size; ++r)
          if (peers_[std::size_t(r)] < 0) missing += " " + std::to_string(r);
        throw std::runtime_error("rendezvous: ranks" + missing + " did not connect to " + where + " within " +
                                 std::to_string(int(connect_timeout_s)) + " s");
      }
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      Message hello{};
      if (!recv_all(fd, &hello, sizeof hello) || hello.type != Msg::hello || hello.rank < 1 || hello.rank >= world.size ||
          peers_[std::size_t(hello.rank)] >= 0) {
        ::close(fd);  // not one of ours, or a rank twice
        continue;
      }
      const std::uint64_t n = payload_.size();
      if (!send_all(fd, &n, sizeof n) || !send_all(fd, payload_.data(), payload_.size())) {
        ::close(fd);
        continue;
      }
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      peers_[std::size_t(hello.rank)] = fd;
      ++joined;
    }
  } else {
    int fd = -1;
    while (true) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
      ::close(fd);
      if (Clock::now() > deadline)
        throw std::runtime_error("rendezvous: rank " + std::to_string(world.rank) + " could not reach rank 0 at " + where + " within " +
                                 std::to_string(int(connect_timeout_s)) + " s (" + errno_text() + ")");
      ::usleep(100000);
    }
    const Message hello{Msg::hello, world.rank, 0};
    std::uint64_t n = 0;
    if (!send_all(fd, &hello, sizeof hello) || !recv_all(fd, &n, sizeof n) || n > (1u << 20)) {
      ::close(fd);
      throw std::runtime_error("rendezvous: rank 0 at " + where + " closed the connection during the handshake");
    }
    payload_.resize(n);
    if (!recv_all(fd, payload_.data(), n)) {
      ::close(fd);
      throw std::runtime_error("rendezvous: rank 0 at " + where + " closed the connection during the handshake");
    }
    peers_ = {fd};
  }
}

Rendezvous::~Rendezvous() {
  stop_ = true;
  if (monitor_.joinable()) monitor_.join();
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void Rendezvous::start_monitor(std::function<void(const std::string&)> on_failure) {
  on_failure_ = std::move(on_failure);
  monitor_ = std::thread([this] { monitor_loop(); });
}

void Rendezvous::heartbeat(std::int64_t step) {
  if (world_.rank != 0) send_message(peers_[0], Msg::heartbeat, world_.rank, step);
  else last_step_self_ = step;
}

void Rendezvous::finish() {
  finishing_ = true;
  if (world_.rank == 0) {
    for (int fd : peers_)
      if (fd >= 0) send_message(fd, Msg::done, 0, 0);
  } else {
    send_message(peers_[0], Msg::done, world_.rank, 0);
  }
}

void Rendezvous::monitor_loop() {
  const int n = int(peers_.size());
  std::vector<std::int64_t> step(std::size_t(world_.size), -1);
  std::vector<bool> done(std::size_t(world_.size), false);
  auto last_progress = Clock::now();
  std::int64_t best = -1;
  auto fail = [&](const std::string& msg, int culprit) {
    if (world_.rank == 0)
      for (int r = 1; r < n; ++r)
        if (peers_[std::size_t(r)] >= 0 && !done[std::size_t(r)]) send_message(peers_[std::size_t(r)], Msg::abort, culprit, 0);
    if (on_failure_) on_failure_(msg);
    stop_ = true;
  };
  while (!stop_) {
    std::vector<pollfd> fds;
    std::vector<int> rank_of;
    for (int i = 0; i < n; ++i)
      if (peers_[std::size_t(i)] >= 0 && !done[std::size_t(world_.rank == 0 ? i : 0)]) {
        fds.push_back({peers_[std::size_t(i)], POLLIN, 0});
        rank_of.push_back(world_.rank == 0 ? i : 0);
      }
    if (fds.empty()) return;
    ::poll(fds.data(), fds.size(), 200);
    for (std::size_t k = 0; k < fds.size() && !stop_; ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int r = rank_of[k];
      Message m{};
      if (!recv_all(fds[k].fd, &m, sizeof m)) {
        if (finishing_ && world_.rank != 0) return;  // rank 0 closes after saying done
        done[std::size_t(r)] = true;
        fail("rank " + std::to_string(r) + " exited without finishing (crashed or was killed); stopping rank " + std::to_string(world_.rank), r);
        return;
      }
      if (m.type == Msg::heartbeat) step[std::size_t(r)] = m.value;
      if (m.type == Msg::done) done[std::size_t(r)] = true;
      if (m.type == Msg::abort) {
        fail("rank " + std::to_string(m.rank) + " failed (its own message says why); stopping rank " + std::to_string(world_.rank), m.rank);
        return;
      }
    }
    if (world_.rank != 0 || finishing_) continue;
    // Rank 0: any rank's step moving on is progress; none for hang_timeout_s is a hang.
    step[0] = last_step_self_;
    std::int64_t now_best = -1, lowest = INT64_MAX;
    for (int r = 0; r < world_.size; ++r) now_best = std::max(now_best, step[std::size_t(r)]), lowest = std::min(lowest, step[std::size_t(r)]);
    std::int64_t total = 0;
    for (auto s : step) total += s;
    if (total != best) best = total, last_progress = Clock::now();
    if (std::chrono::duration<double>(Clock::now() - last_progress).count() > hang_timeout_s_) {
      std::string behind;
      for (int r = 0; r < world_.size; ++r)
        if (step[std::size_t(r)] == lowest && lowest < now_best) behind += " " + std::to_string(r);
      fail("no rank made progress for " + std::to_string(int(hang_timeout_s_)) + " s (ranks at step " + std::to_string(lowest) + "-" +
               std::to_string(now_best) + (behind.empty() ? "; every rank is stuck in the same step" : "; behind:" + behind) +
               "): a rank hangs or a collective stalled",
           behind.empty() ? -1 : std::stoi(behind.substr(1)));
      return;
    }
  }
}

}  // namespace stableflash::train
