// tests/dist/store_stranger_test.cpp — a real training job (loomrun, two resnet18_cifar ranks)
// finishes unharmed while a stranger on the same machine attacks its store (Note [Store
// security] in dist/tcp_store.cpp): the job exits 0, its final weights equal those of the same
// job run in peace, and its log names the refusals. The stranger knows the protocol but not the
// secret. Whoever serves the store (rank 0 or the launcher) does not matter here: only
// MASTER_PORT.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/launch.h"
#include "dist/store.h"
#include "scratch_dir.h"
#include "test_util.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

const std::string kLoomrun = std::string(LOOM_BINARY_DIR) + "/apps/loomrun";
const std::string kApp = std::string(LOOM_BINARY_DIR) + "/apps/resnet18_cifar";
const std::string kSecret = "a secret the stranger does not know";

constexpr uint32_t kMagic = 0x4c4f4f4d, kVersion = 2;
constexpr uint8_t kSet = 1;

struct Wire {
  Bytes bytes;
  Wire& u8(uint8_t v) {
    bytes.push_back(v);
    return *this;
  }
  Wire& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Wire& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Wire& zeros(size_t n) {
    bytes.resize(bytes.size() + n, 0);
    return *this;
  }
};

// The stranger's end of one connection.
class Connection {
 public:
  explicit Connection(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Connection() { ::close(fd_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool connected() const { return connected_; }
  void send(const Bytes& bytes) {
    [[maybe_unused]] ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // Up to n bytes, fewer when the server closes or `timeout` passes.
  Bytes read(size_t n, std::chrono::milliseconds timeout = 3s) {
    Bytes out;
    const auto end = Clock::now() + timeout;
    while (out.size() < n && !eof_) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) != 1) break;
      uint8_t buffer[4096];
      const ssize_t got = ::recv(fd_, buffer, std::min(sizeof buffer, n - out.size()), 0);
      if (got <= 0) {
        eof_ = true;
      } else {
        out.insert(out.end(), buffer, buffer + got);
      }
    }
    return out;
  }
  // True when the server has ended the connection, or ends it within `timeout`.
  bool closed_by_server(std::chrono::milliseconds timeout = 3s) {
    const auto end = Clock::now() + timeout;
    do {
      read(1 << 16, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()));
    } while (!eof_ && Clock::now() < end);
    return eof_;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
};

// What the stranger saw; checked by the test after the job ended.
struct Findings {
  bool found_the_port = false;
  int old_handshake_reply_bytes = -1;  // the server's hello (40 bytes), then closed
  bool old_handshake_closed = false;
  int wrong_secret_status = -1;  // 3: refused
  int no_secret_status = -1;
  int gigabyte_refusals = 0;  // of kGigabyteConnections
  bool garbage_closed = false;
  int flood_opened = 0, flood_closed_at_once = 0;
  bool job_ran_throughout = false;  // the job was still running when the stranger was done
};

constexpr int kGigabyteConnections = 4;
constexpr int kFloodConnections = 560;  // past the server's 512 per address

// The proof a process without the secret can offer: its handshake with `secret`; the server's
// status byte (0 ok, 3 refused; -1 no answer).
int handshake(Connection& c, const std::string& secret) {
  std::array<uint8_t, 32> mine{};
  c.send(Wire().u32(kMagic).u32(kVersion).zeros(32).bytes);
  const Bytes hello = c.read(40);
  if (hello.size() != 40) return -1;
  std::string transcript(hello.begin() + 8, hello.end());
  transcript.append(mine.begin(), mine.end());
  const auto mac = loom::dist::store_internal::hmac_sha256(secret, transcript + "client");
  c.send(Bytes(mac.begin(), mac.end()));
  const Bytes status = c.read(1);
  return status.empty() ? -1 : status[0];
}

// Every attack once, as soon as the store listens; the stalls are kept open in `held` until
// the job has ended.
void attack(uint16_t port, pid_t job, Findings& f, std::vector<std::unique_ptr<Connection>>& held) {
  const auto give_up = Clock::now() + 30s;
  while (Clock::now() < give_up && !f.found_the_port) {
    if (Connection(port).connected()) f.found_the_port = true;
    std::this_thread::sleep_for(2ms);
  }
  if (!f.found_the_port) return;

  // Stalls: a silent connection, and one that stops in the middle of its hello.
  held.push_back(std::make_unique<Connection>(port));
  held.push_back(std::make_unique<Connection>(port));
  held.back()->send(Wire().u32(kMagic).u32(kVersion).u8(7).bytes);

  // Version 1's handshake (magic and version, no secret) and a SET right behind it.
  {
    Connection c(port);
    c.send(Wire().u32(kMagic).u32(1).u8(kSet).str("stranger").str("was here").bytes);
    f.old_handshake_reply_bytes = static_cast<int>(c.read(40).size());
    f.old_handshake_closed = c.closed_by_server();
  }
  // Proofs without the secret.
  {
    Connection c(port);
    f.wrong_secret_status = handshake(c, "a guess");
  }
  {
    Connection c(port);
    f.no_secret_status = handshake(c, "");
  }
  // 1 GiB fields announced right after the hello, on several connections; half of them stall
  // there (5 bytes of the 32 a proof has), the others send a whole proof's worth.
  for (int i = 0; i < kGigabyteConnections; ++i) {
    auto c = std::make_unique<Connection>(port);
    c->send(Wire().u32(kMagic).u32(kVersion).zeros(32).bytes);
    c->read(40);
    c->send(Wire().u8(kSet).u32(1u << 30).bytes);
    if (i % 2 == 0) {
      held.push_back(std::move(c));
      continue;
    }
    c->send(Wire().zeros(27).u32(1u << 30).bytes);
    if (c->read(1) == Bytes{3} && c->closed_by_server()) ++f.gigabyte_refusals;
  }
  // Garbage.
  {
    Connection c(port);
    Bytes noise(300);
    for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<uint8_t>(i * 73 + 11);
    c.send(noise);
    f.garbage_closed = c.closed_by_server();
  }
  // Connections past the cap: those over it are closed at once. The job's own connections
  // count too, so some fewer than 512 of these are held.
  {
    std::vector<std::unique_ptr<Connection>> flood;
    for (int i = 0; i < kFloodConnections; ++i) {
      flood.push_back(std::make_unique<Connection>(port));
      if (flood.back()->connected()) ++f.flood_opened;
    }
    std::this_thread::sleep_for(300ms);
    for (auto& c : flood)
      if (c->closed_by_server(0ms)) ++f.flood_closed_at_once;
  }  // let go: the job's new connections (which retry meanwhile) get in again
  f.job_ran_throughout = ::waitpid(job, nullptr, WNOHANG) == 0;
}

class StoreStranger : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kLoomrun) || !fs::exists(kApp))
      GTEST_SKIP() << kLoomrun << " or " << kApp << " is not built";
    ::setenv("LOOM_JOB_SECRET", kSecret.c_str(), 1);
  }
  void TearDown() override { ::unsetenv("LOOM_JOB_SECRET"); }

  // Starts the job with its output in `log`; its pid.
  pid_t start_job(uint16_t port, const std::string& checkpoints, const std::string& log) {
    // Long enough (~3 s alone on 2 cores) for the stranger to finish while it runs.
    const std::string command =
        "exec " + kLoomrun + " --nproc-per-node 2 --master-port " + std::to_string(port) + " " +
        kApp +
        " --dataset synthetic --synthetic-size 4096 --width 4 --workers 1 --epochs 1 "
        "--max-steps 48 --batch-size 32 --threads 1 --checkpoint-dir " +
        checkpoints + " > " + log + " 2>&1";
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    return pid;
  }
  // Its exit status, or -1 when it outlived `limit` (it is then killed).
  static int wait_for(pid_t pid, std::chrono::seconds limit) {
    const auto end = Clock::now() + limit;
    int status = 0;
    while (Clock::now() < end) {
      if (::waitpid(pid, &status, WNOHANG) == pid)
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::this_thread::sleep_for(20ms);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  static std::string read(const std::string& file) {
    std::ifstream in(file);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  loom::test::ScratchDir dir_;
};

TEST_F(StoreStranger, AJobFinishesUnharmedWhileAStrangerAttacksItsStore) {
  // In peace.
  const std::string peace_log = dir_.file("peace.log");
  const pid_t peace = start_job(loom::dist::find_free_port(), dir_.file("peace"), peace_log);
  ASSERT_EQ(wait_for(peace, 60s), 0) << read(peace_log);

  // Under attack.
  const uint16_t port = loom::dist::find_free_port();
  const std::string log_file = dir_.file("attacked.log");
  const pid_t job = start_job(port, dir_.file("attacked"), log_file);
  Findings f;
  std::vector<std::unique_ptr<Connection>> held;
  std::thread stranger([&] { attack(port, job, f, held); });
  stranger.join();
  const int status = wait_for(job, 60s);
  const std::string log = read(log_file);
  ASSERT_EQ(status, 0) << log;
  for (auto& c : held)
    EXPECT_TRUE(c->closed_by_server(1s)) << "a stalled connection outlived the job";

  ASSERT_TRUE(f.found_the_port) << log;
  EXPECT_TRUE(f.job_ran_throughout)
      << "the job ended before the stranger was done: make it longer\n"
      << log;
  EXPECT_EQ(f.old_handshake_reply_bytes, 40);  // the server's hello says which version it speaks
  EXPECT_TRUE(f.old_handshake_closed);
  EXPECT_EQ(f.wrong_secret_status, 3);
  EXPECT_EQ(f.no_secret_status, 3);
  EXPECT_EQ(f.gigabyte_refusals, kGigabyteConnections / 2);
  EXPECT_TRUE(f.garbage_closed);
  EXPECT_EQ(f.flood_opened, kFloodConnections);
  EXPECT_GE(f.flood_closed_at_once, kFloodConnections - 512);
  EXPECT_LT(f.flood_closed_at_once, kFloodConnections / 2);

  for (const char* line :
       {"refused a connection from 127.0.0.1:", "it did not prove the job's secret",
        "it speaks store protocol version 1; this store speaks 2",
        "it does not speak loom's store protocol",
        "connections from 127.0.0.1 are open, the most this store takes from one address"})
    EXPECT_NE(log.find(line), std::string::npos) << "the log lacks \"" << line << "\":\n" << log;

  // The same weights, bit for bit.
  const loom::SafetensorsFile a = loom::load_safetensors(dir_.file("peace/last.safetensors"));
  const loom::SafetensorsFile b = loom::load_safetensors(dir_.file("attacked/last.safetensors"));
  EXPECT_EQ(a.metadata.at("loom.step"), b.metadata.at("loom.step"));
  int compared = 0;
  for (const auto& [name, t] : a.tensors) {
    if (t.dtype() != loom::kFloat32) continue;
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_EQ(b.at(name).to_vector<float>(), t.to_vector<float>()) << name;
    ++compared;
  }
  EXPECT_GT(compared, 60);
}

}  // namespace
