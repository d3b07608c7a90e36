// tests/dist/store_test.cpp — TCPStore (every op, blocking get and wait, timeouts, a dead address,
// the server going away, several threads and several processes), PrefixStore, rendezvous from
// PyTorch's launch environment, and the store's defences (Note [Store security]): HMAC-SHA256
// against RFC 4231, the secret's handshake both ways, size caps checked before allocating,
// connection caps, stalls and garbage dropped without touching other clients, the listening
// address, and what a port in use says. Connections made by hand (RawConnection) speak the
// protocol wrongly on purpose.
#include "dist/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "dist/multiprocess.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::ms_since;

std::shared_ptr<TCPStore> make_server(Milliseconds timeout = 5s) {
  TCPStoreOptions options;
  options.is_server = true;
  options.port = 0;
  options.timeout = timeout;
  return std::make_shared<TCPStore>(options);
}

std::shared_ptr<TCPStore> make_client(uint16_t port, Milliseconds timeout = 5s) {
  TCPStoreOptions options;
  options.port = port;
  options.timeout = timeout;
  return std::make_shared<TCPStore>(options);
}

// A port nothing listens on, below the kernel's ephemeral range (32768 and up) so that no other
// test's port-0 socket takes it meanwhile; `span` consecutive ports are free.
uint16_t closed_port(int span = 1) {
  static std::atomic<unsigned> salt{static_cast<unsigned>(::getpid()) * 7919u};
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const auto port = static_cast<uint16_t>(20000 + (salt.fetch_add(104729u) % 12000));
    bool free = true;
    for (int k = 0; k < span && free; ++k) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port + k));
      free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      ::close(fd);
    }
    if (free) return port;
  }
  ADD_FAILURE() << "no free port found";
  return 1;
}

Bytes bytes(std::initializer_list<int> values) {
  Bytes b;
  for (int v : values) b.push_back(static_cast<uint8_t>(v));
  return b;
}

TEST(TCPStore, ServerPicksAFreePortAndClientsShareItsKeys) {
  auto server = make_server();
  ASSERT_NE(server->port(), 0);
  auto client = make_client(server->port());
  EXPECT_EQ(client->port(), server->port());
  EXPECT_EQ(client->host(), "127.0.0.1");
  server->set("a", std::string("from the server"));
  EXPECT_EQ(client->get_string("a"), "from the server");
  client->set("b", std::string("from a client"));
  EXPECT_EQ(server->get_string("b"), "from a client");
}

TEST(TCPStore, ValuesAreBinarySafe) {
  auto server = make_server();
  auto client = make_client(server->port());
  const Bytes odd = bytes({0, 255, 0, 10, 13, 0});
  client->set("odd", odd);
  EXPECT_EQ(server->get("odd"), odd);
  client->set("empty", Bytes{});
  EXPECT_EQ(server->get("empty"), Bytes{});
  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  client->set("big", big);
  EXPECT_EQ(server->get("big"), big);
  client->set("big", std::string("overwritten"));
  EXPECT_EQ(server->get_string("big"), "overwritten");
}

TEST(TCPStore, GetBlocksOnTheServerUntilTheKeyIsSet) {
  auto server = make_server();
  auto client = make_client(server->port());
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(150ms);
    server->set("late", std::string("here"));
  });
  EXPECT_EQ(client->get_string("late"), "here");
  EXPECT_GE(ms_since(start), 100);
  setter.join();
}

TEST(TCPStore, GetTimesOutNamingTheStoreAndTheKey) {
  auto server = make_server();
  auto client = make_client(server->port());
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  const auto start = Clock::now();
  EXPECT_LOOM_ERROR(client->get("missing", 200ms), DistError,
                    {address, "get('missing')", "timed out after 200 ms"});
  EXPECT_GE(ms_since(start), 150);
  EXPECT_LT(ms_since(start), 2000);
  client->set_timeout(100ms);  // get(key) uses the store's timeout
  EXPECT_LOOM_ERROR(client->get("missing"), DistError, {"timed out after 100 ms"});
  client->set("missing", std::string("now"));  // the connection is still good
  EXPECT_EQ(client->get_string("missing"), "now");
}

TEST(TCPStore, AddCountsFromZeroAndRefusesNonIntegers) {
  auto server = make_server();
  auto client = make_client(server->port());
  EXPECT_EQ(client->add("n", 5), 5);
  EXPECT_EQ(server->add("n", -7), -2);
  EXPECT_EQ(client->get_string("n"), "-2");
  EXPECT_EQ(client->add("n", 0), -2);
  client->set("word", std::string("seven"));
  EXPECT_LOOM_ERROR(client->add("word", 1), DistError, {"add('word', 1)", "not a decimal integer"});
  EXPECT_EQ(client->add("n", 1), -1);  // still usable
}

TEST(TCPStore, CompareSetFollowsTheNote) {
  auto server = make_server();
  auto client = make_client(server->port());
  const Bytes none;
  const Bytes one = bytes({1}), two = bytes({2}), three = bytes({3});
  // Absent and expected empty: set.
  EXPECT_EQ(client->compare_set("k", none, one), one);
  // Present and expected differs: unchanged.
  EXPECT_EQ(client->compare_set("k", two, three), one);
  EXPECT_EQ(server->get("k"), one);
  // Present and expected matches: swapped.
  EXPECT_EQ(client->compare_set("k", one, two), two);
  EXPECT_EQ(server->get("k"), two);
  // Absent and expected not empty: nothing is set, nothing is held.
  EXPECT_EQ(client->compare_set("absent", one, two), none);
  EXPECT_EQ(client->num_keys(), 1);
}

TEST(TCPStore, WaitReturnsOnceEveryKeyExistsAndNamesTheMissingOnes) {
  auto server = make_server();
  auto client = make_client(server->port());
  server->set("a", std::string("1"));
  client->wait({"a"}, 100ms);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    server->set("b", std::string("2"));
  });
  client->wait({"a", "b"});
  setter.join();
  const auto start = Clock::now();
  try {
    client->wait({"a", "c", "d"}, 150ms);
    ADD_FAILURE() << "wait should have timed out";
  } catch (const DistError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("keys still missing: 'c', 'd'"), std::string::npos) << message;
    EXPECT_EQ(message.find("missing: 'a'"), std::string::npos) << message;
    EXPECT_NE(message.find("150 ms"), std::string::npos) << message;
  }
  EXPECT_GE(ms_since(start), 100);
}

TEST(TCPStore, DeleteAndNumKeys) {
  auto server = make_server();
  auto client = make_client(server->port());
  EXPECT_EQ(client->num_keys(), 0);
  client->set("x", std::string("1"));
  client->set("y", std::string("2"));
  EXPECT_EQ(server->num_keys(), 2);
  EXPECT_TRUE(client->delete_key("x"));
  EXPECT_FALSE(client->delete_key("x"));
  EXPECT_EQ(client->num_keys(), 1);
  EXPECT_LOOM_ERROR(client->get("x", 10ms), DistError, {"get('x')"});
}

TEST(TCPStore, ConnectingToADeadAddressFailsQuicklyNamingIt) {
  const uint16_t port = closed_port();
  const auto start = Clock::now();
  EXPECT_LOOM_ERROR(make_client(port, 300ms), DistError,
                    {"127.0.0.1:" + std::to_string(port), "300 ms", "connect"});
  EXPECT_GE(ms_since(start), 250);  // it retried until the deadline
  EXPECT_LT(ms_since(start), 2000);
  TCPStoreOptions options;
  options.host = "no-such-host.invalid";
  options.port = 29500;
  options.timeout = 100ms;
  EXPECT_LOOM_ERROR(TCPStore{options}, DistError, {"no-such-host.invalid:29500"});
}

TEST(TCPStore, AClientStartedBeforeTheServerWaitsForIt) {
  const uint16_t port = closed_port();
  std::shared_ptr<TCPStore> server;
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    TCPStoreOptions options;
    options.is_server = true;
    options.port = port;
    server = std::make_shared<TCPStore>(options);
  });
  auto client = make_client(port, 5s);
  later.join();
  client->set("hello", std::string("world"));
  EXPECT_EQ(server->get_string("hello"), "world");
}

TEST(TCPStore, TwoServersCannotShareAPortAndTheErrorSaysWhatToDo) {
  auto server = make_server();
  TCPStoreOptions options;
  options.is_server = true;
  options.port = server->port();
  const std::string port = std::to_string(server->port());
  EXPECT_LOOM_ERROR(
      TCPStore{options}, DistError,
      {"127.0.0.1:" + port, "already in use", "earlier run", "ss -ltnp 'sport = :" + port + "'",
       "fuser " + port + "/tcp", "another --master-port"});
  // Held by another program on every interface: the same.
  const uint16_t other = closed_port();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(other);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  options.port = other;
  EXPECT_LOOM_ERROR(TCPStore{options}, DistError,
                    {"127.0.0.1:" + std::to_string(other), "already in use",
                     "fuser " + std::to_string(other) + "/tcp"});
  ::close(fd);
}

TEST(TCPStore, DestroyingTheServerWakesBlockedClientsWithAnError) {
  auto server = make_server();
  auto client = make_client(server->port(), 5s);
  client->set("k", std::string("v"));
  std::atomic<bool> failed{false};
  std::string message;
  std::thread blocked([&] {
    try {
      client->get("never", 30s);
    } catch (const DistError& e) {
      message = e.what();
      failed = true;
    }
  });
  std::this_thread::sleep_for(100ms);  // let the get reach the server
  const auto start = Clock::now();
  server.reset();
  blocked.join();
  EXPECT_LT(ms_since(start), 2000);
  EXPECT_TRUE(failed);
  EXPECT_NE(message.find("get('never')"), std::string::npos) << message;
  EXPECT_NE(message.find("closed the connection"), std::string::npos) << message;
  // Later calls fail at once.
  const auto again = Clock::now();
  EXPECT_LOOM_ERROR(client->set("k", std::string("v")), DistError, {"closed the connection"});
  EXPECT_LT(ms_since(again), 1000);
}

TEST(TCPStore, ABlockedGetDoesNotHoldUpOtherThreads) {
  auto server = make_server();
  auto client = make_client(server->port());
  std::thread waiter([&] { EXPECT_EQ(client->get_string("signal"), "go"); });
  std::this_thread::sleep_for(50ms);
  // Same client object, other threads: they get their own connections from the pool.
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t)
    adders.emplace_back([&] {
      for (int i = 0; i < 50; ++i) client->add("count", 1);
    });
  for (auto& t : adders) t.join();
  EXPECT_EQ(client->add("count", 0), 200);
  client->set("signal", std::string("go"));
  waiter.join();
}

TEST(TCPStore, WorksAcrossProcesses) {
  test::run_ranks(3, [](test::Rank& r) {
    EXPECT_GE(r.store->add("arrived", 1), 1);
    r.store->set("rank/" + std::to_string(r.rank), std::to_string(r.rank * 10));
    r.store->wait({"rank/0", "rank/1", "rank/2"});
    for (int other = 0; other < r.world_size; ++other)
      EXPECT_EQ(r.store->get_string("rank/" + std::to_string(other)), std::to_string(other * 10));
    EXPECT_GE(r.store->add("arrived", 0), 3);
  });
}

TEST(PrefixStore, KeysLiveUnderThePrefix) {
  auto server = make_server();
  auto prefixed = std::make_shared<PrefixStore>("job1", server);
  EXPECT_EQ(prefixed->timeout(), server->timeout());
  prefixed->set("k", std::string("v"));
  EXPECT_EQ(server->get_string("job1/k"), "v");
  EXPECT_EQ(prefixed->get_string("k"), "v");
  EXPECT_EQ(prefixed->add("n", 3), 3);
  EXPECT_EQ(server->get_string("job1/n"), "3");
  EXPECT_EQ(prefixed->compare_set("k", Bytes{'v'}, Bytes{'w'}), Bytes{'w'});
  EXPECT_EQ(prefixed->num_keys(), 2);  // the whole store's
  server->set("k", std::string("outside"));
  EXPECT_EQ(prefixed->get_string("k"), "w");
  prefixed->wait({"k", "n"}, 100ms);
  EXPECT_LOOM_ERROR(prefixed->wait({"k", "zz"}, 50ms), DistError, {"'job1/zz'"});
  EXPECT_TRUE(prefixed->delete_key("k"));
  EXPECT_EQ(server->get_string("k"), "outside");
  // Nested prefixes compose.
  PrefixStore nested("inner", prefixed);
  nested.set("x", std::string("1"));
  EXPECT_EQ(server->get_string("job1/inner/x"), "1");
}

// ---------------------------------------------------------------- HMAC-SHA256

std::string hex(const store_internal::Mac& mac) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : mac) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

TEST(HmacSha256, TheVectorsOfRfc4231) {
  using store_internal::hmac_sha256;
  // Test cases 1-7 of RFC 4231, section 4.
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  EXPECT_EQ(hex(hmac_sha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Case 5 gives only the first 128 bits.
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0c'), "Test With Truncation")).substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
  // Cases 6 and 7: a key longer than the block is hashed first.
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "This is a test using a larger than block-size key and a larger than "
                            "block-size data. The key needs to be hashed before being used by the "
                            "HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // An empty key (a store without a secret) and a key of exactly one block (Python's hmac).
  EXPECT_EQ(hex(hmac_sha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  EXPECT_EQ(hex(hmac_sha256(std::string(64, 'a'), "x")),
            "b65ca3a3235f948bc0e6bd747532c54a983b54ddad1a4d1bd8b958e065b1cab4");
}

TEST(HmacSha256, MacsCompareWholeAndNoncesDiffer) {
  using store_internal::equal_in_constant_time;
  store_internal::Mac a{}, b{};
  EXPECT_TRUE(equal_in_constant_time(a, b));
  b[0] = 1;
  EXPECT_FALSE(equal_in_constant_time(a, b));
  b[0] = 0;
  b[31] = 0x80;
  EXPECT_FALSE(equal_in_constant_time(a, b));
  EXPECT_NE(store_internal::random_nonce(), store_internal::random_nonce());
}

// ---------------------------------------------------------------- the protocol by hand

constexpr uint32_t kMagic = 0x4c4f4f4d, kVersion = 2;
constexpr uint8_t kSet = 1, kGet = 2, kNumKeys = 7;

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
  Wire& i64(int64_t v) {
    for (int i = 0; i < 8; ++i)
      bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  Wire& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  template <size_t N>
  Wire& raw(const std::array<uint8_t, N>& b) {
    bytes.insert(bytes.end(), b.begin(), b.end());
    return *this;
  }
};

store_internal::Mac client_proof(const std::string& secret, const store_internal::Nonce& server,
                                 const store_internal::Nonce& client, const char* side) {
  std::string t(server.begin(), server.end());
  t.append(client.begin(), client.end());
  return store_internal::hmac_sha256(secret, t + side);
}

// A TCP connection to a store made by hand, to misbehave on purpose.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port, const char* host = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, host, &addr.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  void send(const Bytes& bytes) {
    [[maybe_unused]] ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // Up to n bytes, fewer when the server closes or `timeout` passes.
  Bytes read(size_t n, Milliseconds timeout = 2s) {
    Bytes out;
    const auto end = Clock::now() + timeout;
    while (out.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<Milliseconds>(end - Clock::now()).count();
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) break;
      uint8_t buffer[4096];
      const ssize_t got = ::recv(fd_, buffer, std::min(sizeof buffer, n - out.size()), 0);
      if (got <= 0) {
        eof_ = true;
        break;
      }
      out.insert(out.end(), buffer, buffer + got);
    }
    return out;
  }
  // True when the server ends the connection within `timeout` (end-of-file or a reset).
  bool closed_by_server(Milliseconds timeout = 2s) {
    while (!eof_) {
      if (read(1 << 20, timeout).empty() && !eof_) return false;
    }
    return true;
  }
  // The handshake of Note [Store security]; the server's status byte (0 ok, 3 refused).
  int handshake(const std::string& secret, uint32_t version = kVersion) {
    store_internal::Nonce mine{};
    mine[0] = 42;
    send(Wire().u32(kMagic).u32(version).raw(mine).bytes);
    const Bytes hello = read(40);
    if (hello.size() != 40) return -1;
    store_internal::Nonce theirs;
    std::copy(hello.begin() + 8, hello.end(), theirs.begin());
    send(Wire().raw(client_proof(secret, theirs, mine, "client")).bytes);
    const Bytes status = read(1);
    if (status.size() != 1) return -1;
    if (status[0] == 0) {
      const Bytes proof = read(32);
      store_internal::Mac server{};
      std::copy(proof.begin(), proof.end(), server.begin());
      EXPECT_EQ(server, client_proof(secret, theirs, mine, "server"));
    }
    return status[0];
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
};

// stderr into a file while it lives, so that a test can wait for the server's log lines.
class CapturedStderr {
 public:
  CapturedStderr() {
    char path[] = "/tmp/loom-store-stderr-XXXXXX";
    file_ = ::mkstemp(path);
    path_ = path;
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(file_, 2);
  }
  ~CapturedStderr() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    ::close(file_);
    ::unlink(path_.c_str());
  }
  std::string text() const {
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Waits up to 2 s for every fragment to appear; the whole text.
  std::string wait_for(const std::vector<std::string>& fragments) const {
    const auto end = Clock::now() + 2s;
    while (true) {
      const std::string all = text();
      const bool found = std::all_of(fragments.begin(), fragments.end(), [&](const auto& f) {
        return all.find(f) != std::string::npos;
      });
      if (found || Clock::now() > end) {
        for (const auto& f : fragments)
          EXPECT_NE(all.find(f), std::string::npos) << "the log lacks \"" << f << "\":\n" << all;
        return all;
      }
      std::this_thread::sleep_for(10ms);
    }
  }

 private:
  int file_ = -1, saved_ = -1;
  std::string path_;
};

std::shared_ptr<TCPStore> make_secret_server(const std::string& secret,
                                             TCPStoreLimits limits = {}) {
  TCPStoreOptions options;
  options.is_server = true;
  options.port = 0;
  options.timeout = 5s;
  options.secret = secret;
  options.limits = limits;
  return std::make_shared<TCPStore>(options);
}

std::shared_ptr<TCPStore> make_secret_client(uint16_t port, const std::string& secret,
                                             const std::string& host = "127.0.0.1") {
  TCPStoreOptions options;
  options.host = host;
  options.port = port;
  options.timeout = 5s;
  options.secret = secret;
  return std::make_shared<TCPStore>(options);
}

int64_t rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// ---------------------------------------------------------------- the secret

TEST(StoreSecurity, ProcessesWithTheJobsSecretUseTheStore) {
  auto server = make_secret_server("the job's secret");
  auto client = make_secret_client(server->port(), "the job's secret");
  client->set("k", std::string("v"));
  EXPECT_EQ(server->get_string("k"), "v");
  RawConnection raw(server->port());
  EXPECT_EQ(raw.handshake("the job's secret"), 0);
  raw.send(Wire().u8(kNumKeys).bytes);
  EXPECT_EQ(raw.read(9), Wire().u8(0).i64(1).bytes);
}

TEST(StoreSecurity, AWrongOrMissingSecretIsRefusedAndBothSidesSaySo) {
  CapturedStderr log;
  auto server = make_secret_server("the job's secret");
  const std::string at = "the store at 127.0.0.1:" + std::to_string(server->port());
  const auto start = Clock::now();
  EXPECT_LOOM_ERROR(make_secret_client(server->port(), "another secret"), DistError,
                    {at + " refused this process: LOOM_JOB_SECRET differs from the job's"});
  EXPECT_LOOM_ERROR(make_secret_client(server->port(), ""), DistError,
                    {at + " refused this process", "this process has none"});
  EXPECT_LT(ms_since(start), 2000);  // final: no retrying until the timeout
  log.wait_for(
      {"loom store: refused a connection from 127.0.0.1:", ": it did not prove the job's secret"});
  // A store without a secret takes only clients without one.
  auto open = make_server();
  EXPECT_LOOM_ERROR(make_secret_client(open->port(), "a secret"), DistError,
                    {"refused this process: LOOM_JOB_SECRET differs"});
  make_secret_client(open->port(), "")->set("k", std::string("v"));
  // Nothing a refused peer sent reached the store.
  EXPECT_EQ(server->num_keys(), 0);
}

TEST(StoreSecurity, AServerThatCannotProveTheSecretIsNotTrusted) {
  // An impostor on the port: it speaks the protocol and accepts any proof, but cannot make its
  // own.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread impostor([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    uint8_t buffer[40];
    [[maybe_unused]] ssize_t n = ::recv(fd, buffer, 40, MSG_WAITALL);
    const Bytes hello = Wire().u32(kMagic).u32(kVersion).raw(store_internal::Nonce{}).bytes;
    n = ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    n = ::recv(fd, buffer, 32, MSG_WAITALL);
    const Bytes ok = Wire().u8(0).raw(store_internal::Mac{}).bytes;
    n = ::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
    ::close(fd);
  });
  EXPECT_LOOM_ERROR(make_secret_client(ntohs(addr.sin_port), "the job's secret"), DistError,
                    {"did not prove the job's secret", "not this job's store"});
  impostor.join();
  ::close(listener);
}

TEST(StoreSecurity, AnotherProtocolVersionIsNamed) {
  CapturedStderr log;
  auto server = make_server();
  RawConnection old(server->port());
  old.send(Wire().u32(kMagic).u32(1).bytes);  // version 1's handshake: magic and version
  const Bytes hello = old.read(40);
  ASSERT_EQ(hello.size(), 40u);
  EXPECT_EQ(Bytes(hello.begin(), hello.begin() + 8), Wire().u32(kMagic).u32(kVersion).bytes);
  EXPECT_TRUE(old.closed_by_server());
  log.wait_for({"speaks store protocol version 1; this store speaks 2"});
}

// ---------------------------------------------------------------- sizes

TEST(StoreSecurity, OversizeFieldsAreRefusedBeforeAnythingIsAllocated) {
  CapturedStderr log;
  TCPStoreLimits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 1024;
  auto server = make_secret_server("s", limits);
  // At the limits: fine.
  {
    RawConnection raw(server->port());
    ASSERT_EQ(raw.handshake("s"), 0);
    raw.send(Wire().u8(kSet).str(std::string(16, 'k')).str(std::string(1024, 'v')).bytes);
    EXPECT_EQ(raw.read(1), Bytes{0});
  }
  // One byte over: dropped as soon as the length arrives, the bytes never sent.
  {
    RawConnection raw(server->port());
    ASSERT_EQ(raw.handshake("s"), 0);
    raw.send(Wire().u8(kSet).u32(17).bytes);
    EXPECT_TRUE(raw.closed_by_server());
  }
  {
    RawConnection raw(server->port());
    ASSERT_EQ(raw.handshake("s"), 0);
    raw.send(Wire().u8(kSet).str("k").u32(1u << 30).bytes);
    EXPECT_TRUE(raw.closed_by_server());
  }
  // One line for both: the log says a kind of refusal once per address per interval.
  log.wait_for({"loom store: dropped a connection from 127.0.0.1:",
                "it announced a key of 17 bytes, over the store's limit of 16"});
  EXPECT_EQ(server->num_keys(), 1);
  // The client refuses what the server would, naming the call and the sizes.
  auto client = make_secret_client(server->port(), "s");
  EXPECT_LOOM_ERROR(client->set(std::string(5000, 'k'), std::string("v")), DistError,
                    {"set('kkk", "the key is 5000 bytes", "limit of 4096"});
  EXPECT_LOOM_ERROR(
      client->set("k", Bytes((64 << 20) + 1)), DistError,
      {"set('k')", "67108865 bytes", "limit of 67108864", "LOOM_STORE_MAX_VALUE_BYTES"});
}

TEST(StoreSecurity, AnnouncedGigabytesCostTheServerNothing) {
  auto server = make_secret_server("s");  // the default limits: 64 MiB values
  const int64_t before = rss_bytes();
  // 8 connections announce 1 GiB values (dropped at once) and 8 more announce values just
  // within the limit and send 10 bytes of them: the server keeps what arrived, not what was
  // announced (8 x 64 MiB if it reserved).
  std::vector<std::unique_ptr<RawConnection>> over, within;
  for (int i = 0; i < 8; ++i) {
    over.push_back(std::make_unique<RawConnection>(server->port()));
    ASSERT_EQ(over.back()->handshake("s"), 0);
    over.back()->send(Wire().u8(kSet).str("k").u32(1u << 30).bytes);
    within.push_back(std::make_unique<RawConnection>(server->port()));
    ASSERT_EQ(within.back()->handshake("s"), 0);
    within.back()->send(Wire().u8(kSet).str("k").u32(64u << 20).bytes);
    within.back()->send(Bytes(10, 'v'));
  }
  for (auto& raw : over) EXPECT_TRUE(raw->closed_by_server());
  std::this_thread::sleep_for(100ms);
  EXPECT_LT(rss_bytes() - before, 16 << 20)
      << "VmRSS grew from " << before << " to " << rss_bytes();
  // Before authentication nothing of size is read at all: a stranger's 1 GiB field is only
  // 32 bytes of a wrong proof.
  RawConnection stranger(server->port());
  stranger.send(Wire().u32(kMagic).u32(kVersion).raw(store_internal::Nonce{}).bytes);
  EXPECT_EQ(stranger.read(40).size(), 40u);
  stranger.send(Wire().u8(kSet).str("k").u32(1u << 30).raw(store_internal::Mac{}).bytes);
  EXPECT_EQ(stranger.read(1), Bytes{3});  // refused
  EXPECT_TRUE(stranger.closed_by_server());
  server->set("still", std::string("works"));
  EXPECT_EQ(server->get_string("still"), "works");
}

// ---------------------------------------------------------------- connections

TEST(StoreSecurity, ConnectionsOverTheCapsAreClosedAtOnce) {
  CapturedStderr log;
  TCPStoreLimits limits;
  limits.max_connections_per_peer = 4;  // the server's own client holds one
  auto server = make_secret_server("s", limits);
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<RawConnection>(server->port()));
  for (auto& raw : held) EXPECT_FALSE(raw->closed_by_server(200ms));
  RawConnection extra(server->port());
  const auto start = Clock::now();
  EXPECT_TRUE(extra.closed_by_server());
  EXPECT_LT(ms_since(start), 1000);
  log.wait_for({"loom store: refused a connection from 127.0.0.1:",
                "4 connections from 127.0.0.1 are open, the most this store takes from one "
                "address"});
  // Once the stranger lets go, clients get in (a client retries while the server is full).
  std::thread release([&] {
    std::this_thread::sleep_for(200ms);
    held.clear();
  });
  auto client = make_secret_client(server->port(), "s");
  release.join();
  client->set("k", std::string("v"));
  EXPECT_EQ(server->get_string("k"), "v");

  TCPStoreLimits total;
  total.max_connections = 2;
  auto small = make_secret_server("s", total);
  RawConnection first(small->port());
  EXPECT_FALSE(first.closed_by_server(200ms));
  RawConnection second(small->port());
  EXPECT_TRUE(second.closed_by_server());
  log.wait_for({"2 connections are open, the most this store takes"});
}

TEST(StoreSecurity, AStalledHandshakeIsDroppedWhileOtherClientsGoOn) {
  CapturedStderr log;
  TCPStoreLimits limits;
  limits.handshake_timeout = 300ms;
  auto server = make_secret_server("s", limits);
  auto client = make_secret_client(server->port(), "s");
  RawConnection silent(server->port()), halfway(server->port());
  halfway.send(Wire().u32(kMagic).u32(kVersion).u8(1).bytes);  // 9 of the hello's 40 bytes
  const auto start = Clock::now();
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::thread busy([&] {
    while (!stop) {
      client->add("n", 1);
      ++calls;
    }
  });
  EXPECT_TRUE(silent.closed_by_server(2s));
  EXPECT_TRUE(halfway.closed_by_server(2s));
  EXPECT_GE(ms_since(start), 250);
  stop = true;
  busy.join();
  EXPECT_GT(calls.load(), 10);
  EXPECT_EQ(client->add("n", 0), calls.load());
  log.wait_for({"loom store: refused a connection from 127.0.0.1:",
                "it did not finish the handshake within 300 ms"});
}

TEST(StoreSecurity, AStalledRequestIsDroppedButIdleAndWaitingConnectionsAreNot) {
  CapturedStderr log;
  TCPStoreLimits limits;
  limits.request_timeout = 300ms;
  auto server = make_secret_server("s", limits);
  RawConnection stalled(server->port()), idle(server->port()), waiting(server->port());
  ASSERT_EQ(stalled.handshake("s"), 0);
  ASSERT_EQ(idle.handshake("s"), 0);
  ASSERT_EQ(waiting.handshake("s"), 0);
  stalled.send(Wire().u8(kSet).u32(8).u8('k').bytes);  // 1 of the key's 8 bytes
  waiting.send(Wire().u8(kGet).str("late").i64(5000).bytes);
  EXPECT_TRUE(stalled.closed_by_server(2s));
  std::this_thread::sleep_for(300ms);  // idle and waiting: past the request timeout
  idle.send(Wire().u8(kNumKeys).bytes);
  EXPECT_EQ(idle.read(9), Wire().u8(0).i64(0).bytes);
  server->set("late", std::string("here"));
  EXPECT_EQ(waiting.read(9), Wire().u8(0).str("here").bytes);
  log.wait_for({"loom store: dropped a connection from 127.0.0.1:",
                "it did not finish a request within 300 ms"});
}

TEST(StoreSecurity, GarbageIsDroppedWithoutTouchingOthers) {
  CapturedStderr log;
  auto server = make_secret_server("s");
  auto client = make_secret_client(server->port(), "s");
  RawConnection http(server->port());
  http.send(Wire().str("GET / HTTP/1.1\r\nHost: x\r\n\r\n").bytes);
  EXPECT_TRUE(http.closed_by_server());
  log.wait_for({"loom store: refused a connection from 127.0.0.1:",
                "it does not speak loom's store protocol (its first 4 bytes were 0x0000001b"});
  auto other = make_secret_server("s");  // a log of its own
  RawConnection unknown(other->port());
  ASSERT_EQ(unknown.handshake("s"), 0);
  unknown.send(Wire().u8(99).bytes);
  EXPECT_TRUE(unknown.closed_by_server());
  client->set("k", std::string("v"));
  EXPECT_EQ(client->get_string("k"), "v");
  log.wait_for(
      {"loom store: dropped a connection from 127.0.0.1:", "it sent an unknown request (op 99)"});
}

TEST(StoreSecurity, AFloodOfRefusalsIsOneLine) {
  CapturedStderr log;
  auto server = make_secret_server("s");
  for (int i = 0; i < 50; ++i) {
    RawConnection raw(server->port());
    EXPECT_EQ(raw.handshake("wrong"), 3);
  }
  std::this_thread::sleep_for(200ms);
  const std::string all = log.wait_for({"it did not prove the job's secret"});
  size_t lines = 0;
  for (size_t at = all.find("loom store:"); at != std::string::npos;
       at = all.find("loom store:", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << all;
}

// ---------------------------------------------------------------- where the server listens

TEST(StoreSecurity, TheServerListensOnlyOnTheAddressTheJobNames) {
  // 127.0.0.2 is loopback too on Linux, but another address than 127.0.0.1.
  auto server = make_server();  // host 127.0.0.1
  TCPStoreOptions elsewhere;
  elsewhere.host = "127.0.0.2";
  elsewhere.port = server->port();
  elsewhere.timeout = 200ms;
  EXPECT_LOOM_ERROR(TCPStore{elsewhere}, DistError,
                    {"127.0.0.2:" + std::to_string(server->port())});
  RawConnection raw(server->port(), "127.0.0.2");
  EXPECT_FALSE(raw.connected());

  TCPStoreOptions options;
  options.is_server = true;
  options.port = 0;
  options.host = "127.0.0.2";
  auto second = std::make_shared<TCPStore>(options);  // its own client connects to 127.0.0.2
  EXPECT_FALSE(RawConnection(second->port(), "127.0.0.1").connected());
  EXPECT_TRUE(RawConnection(second->port(), "127.0.0.2").connected());

  options.host = "127.0.0.1";
  options.bind_address = "127.0.0.2";  // an explicit address wins over host's
  auto third = std::make_shared<TCPStore>(options);
  EXPECT_FALSE(RawConnection(third->port(), "127.0.0.1").connected());

  options.bind_address.clear();
  options.bind_all = true;
  auto everywhere = std::make_shared<TCPStore>(options);
  EXPECT_TRUE(RawConnection(everywhere->port(), "127.0.0.1").connected());
  EXPECT_TRUE(RawConnection(everywhere->port(), "127.0.0.2").connected());
  elsewhere.port = everywhere->port();
  TCPStore{elsewhere}.set("via", std::string("127.0.0.2"));
  EXPECT_EQ(everywhere->get_string("via"), "127.0.0.2");
}

TEST(StoreSecurity, AnAddressOfAnotherMachineSaysHowToServeAnyway) {
  TCPStoreOptions options;
  options.is_server = true;
  options.port = 0;
  options.host = "192.0.2.1";  // TEST-NET-1 (RFC 5737): no machine's
  EXPECT_LOOM_ERROR(TCPStore{options}, DistError,
                    {"cannot serve on 192.0.2.1:0", "192.0.2.1 is not an address of this machine",
                     "--master-addr", "LOOM_STORE_BIND_ALL=1"});
  options.host = "no-such-host.invalid";
  EXPECT_LOOM_ERROR(TCPStore{options}, DistError, {"cannot resolve 'no-such-host.invalid'"});
}

// ---------------------------------------------------------------- a session without a socket

// What a ServerSession answers to `input`, fed `chunk` bytes at a time.
Bytes session_replies(const std::string& secret, const Bytes& input, size_t chunk,
                      store_internal::ServerSession** out_session = nullptr) {
  static std::unique_ptr<store_internal::ServerSession> keep;
  keep = std::make_unique<store_internal::ServerSession>(store_internal::make_store_data(), secret,
                                                         TCPStoreLimits{}, store_internal::Nonce{});
  store_internal::ServerSession& session = *keep;
  Bytes replies;
  size_t at = 0;
  while (at < input.size() && !session.closed()) {
    if (session.waiting()) session.answer_now();
    const size_t wanted = session.wanted();
    if (wanted == 0) continue;
    EXPECT_GT(wanted, 0u);
    at += session.consume(input.data() + at, std::min({chunk, wanted, input.size() - at}));
    const Bytes out = session.take_output();
    replies.insert(replies.end(), out.begin(), out.end());
  }
  if (session.waiting()) session.answer_now();
  const Bytes out = session.take_output();
  replies.insert(replies.end(), out.begin(), out.end());
  if (out_session) *out_session = &session;
  return replies;
}

TEST(StoreSession, AnswersTheSameWhateverTheChunks) {
  store_internal::Nonce client{};
  client[0] = 7;
  const store_internal::Nonce server{};
  Wire input;
  input.u32(kMagic).u32(kVersion).raw(client).raw(client_proof("s", server, client, "client"));
  input.u8(kSet).str("a").str("1");
  input.u8(kSet).str("").str("");  // empty strings complete without bytes of their own
  input.u8(kGet).str("a").i64(0);
  input.u8(kGet).str("missing").i64(10);
  input.u8(3).str("a").i64(41);                 // ADD
  input.u8(5).u32(2).str("a").str("b").i64(0);  // WAIT: b missing
  input.u8(kNumKeys);
  Wire expected;
  expected.u32(kMagic).u32(kVersion).raw(server);
  expected.u8(0).raw(client_proof("s", server, client, "server"));
  expected.u8(0).u8(0).u8(0).str("1").u8(1).u8(0).i64(42).u8(1).u32(1).str("b").u8(0).i64(2);
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{1000}}) {
    store_internal::ServerSession* session = nullptr;
    EXPECT_EQ(session_replies("s", input.bytes, chunk, &session), expected.bytes)
        << "chunk " << chunk;
    EXPECT_TRUE(session->authenticated());
    EXPECT_FALSE(session->closed());
    EXPECT_FALSE(session->in_request());
  }
}

TEST(StoreSession, AnOversizeLengthClosesBeforeItsBytes) {
  store_internal::Nonce client{};
  const store_internal::Nonce server{};
  Wire input;
  input.u32(kMagic).u32(kVersion).raw(client).raw(client_proof("s", server, client, "client"));
  input.u8(kSet).str("k").u32(1u << 30);
  input.bytes.resize(input.bytes.size() + 100, 'v');
  store_internal::ServerSession* session = nullptr;
  session_replies("s", input.bytes, 1000, &session);
  EXPECT_TRUE(session->closed());
  EXPECT_EQ(session->drop(), store_internal::Drop::kSize);
  EXPECT_EQ(session->wanted(), 0u);
  // It took nothing after the length: feeding more is refused.
  const uint8_t more = 0;
  EXPECT_EQ(session->consume(&more, 1), 0u);
  // A wrong proof: refused, and no request is ever read.
  Wire wrong;
  wrong.u32(kMagic).u32(kVersion).raw(client).raw(client_proof("x", server, client, "client"));
  wrong.u8(kSet).str("k").str("v");
  const Bytes replies = session_replies("s", wrong.bytes, 1, &session);
  EXPECT_EQ(replies.back(), 3);  // kRefused after the server's hello
  EXPECT_EQ(replies.size(), 41u);
  EXPECT_EQ(session->drop(), store_internal::Drop::kSecret);
  EXPECT_FALSE(session->authenticated());
}

// ---------------------------------------------------------------- the launch environment

// Sets the variables for one test and restores them afterwards.
class EnvironmentTest : public ::testing::Test {
 protected:
  void set(const char* name, const char* value) {
    if (saved_.count(name) == 0) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  void SetUp() override {
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_USE_AGENT_STORE", "LOOM_AGENT_STORE", "LOOM_JOB_SECRET",
          "LOOM_STORE_BIND_ALL", "LOOM_STORE_MAX_VALUE_BYTES"})
      set(name, nullptr);
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(EnvironmentTest, ReadsPyTorchsVariables) {
  EXPECT_FALSE(launched_by_launcher());
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  set("MASTER_ADDR", "10.1.2.3");
  set("MASTER_PORT", "29555");
  EXPECT_TRUE(launched_by_launcher());
  const Environment env = environment_from_env();
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 29555);
}

TEST_F(EnvironmentTest, LocalVariablesDefaultToTheGlobalOnes) {
  set("RANK", "1");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "127.0.0.1");
  set("MASTER_PORT", "29500");
  const Environment env = environment_from_env();
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
}

TEST_F(EnvironmentTest, MissingOrMalformedVariablesAreNamed) {
  EXPECT_LOOM_ERROR(environment_from_env(), DistError, {"WORLD_SIZE", "not set"});
  set("WORLD_SIZE", "2");
  EXPECT_LOOM_ERROR(environment_from_env(), DistError, {"RANK", "not set"});
  set("RANK", "one");
  EXPECT_LOOM_ERROR(environment_from_env(), DistError, {"RANK='one'", "not an integer"});
  set("RANK", "2");
  EXPECT_LOOM_ERROR(environment_from_env(), DistError, {"RANK=2", "WORLD_SIZE=2"});
  set("RANK", "1");
  EXPECT_LOOM_ERROR(environment_from_env(), DistError, {"MASTER_ADDR"});
  set("MASTER_ADDR", "127.0.0.1");
  set("MASTER_PORT", "70000");
  EXPECT_LOOM_ERROR(environment_from_env(), DistError, {"MASTER_PORT=70000"});
  set("MASTER_PORT", "29500");
  set("LOCAL_RANK", "4x");
  EXPECT_LOOM_ERROR(environment_from_env(), DistError, {"LOCAL_RANK='4x'"});
  set("LOCAL_RANK", "0");
  EXPECT_NO_THROW(environment_from_env());
}

TEST_F(EnvironmentTest, RendezvousConnectsEveryRankToRankZerosStore) {
  Environment env;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = closed_port();
  std::shared_ptr<Store> store1;
  Environment env1 = env;
  env1.rank = 1;
  std::thread rank1([&] { store1 = rendezvous(env1, 5s); });  // may start first: it retries
  env.rank = 0;
  auto store0 = rendezvous(env, 5s);
  rank1.join();
  store1->set("from1", std::string("hi"));
  EXPECT_EQ(store0->get_string("from1"), "hi");
  EXPECT_EQ(dynamic_cast<TCPStore&>(*store0).port(), env.master_port);
  EXPECT_EQ(store1->timeout(), Milliseconds(5s));
}

TEST_F(EnvironmentTest, UnderTorchrunsAgentStoreLoomServesOnePortAbove) {
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  Environment env;
  env.master_port = closed_port(/*span=*/2);
  auto store = rendezvous(env, 2s);
  EXPECT_EQ(dynamic_cast<TCPStore&>(*store).port(), env.master_port + 1);
}

TEST_F(EnvironmentTest, TheStoresVariables) {
  TCPStoreOptions options;
  apply_store_environment(options);
  EXPECT_EQ(options.secret, "");
  EXPECT_FALSE(options.bind_all);
  EXPECT_EQ(options.limits.max_value_bytes, 64u << 20);
  set("LOOM_JOB_SECRET", "0123456789abcdef");
  set("LOOM_STORE_BIND_ALL", "1");
  set("LOOM_STORE_MAX_VALUE_BYTES", "1048576");
  apply_store_environment(options);
  EXPECT_EQ(options.secret, "0123456789abcdef");
  EXPECT_TRUE(options.bind_all);
  EXPECT_EQ(options.limits.max_value_bytes, 1u << 20);
  set("LOOM_STORE_BIND_ALL", "yes");
  EXPECT_LOOM_ERROR(apply_store_environment(options), DistError, {"LOOM_STORE_BIND_ALL='yes'"});
  set("LOOM_STORE_BIND_ALL", "0");
  set("LOOM_STORE_MAX_VALUE_BYTES", "12");
  EXPECT_LOOM_ERROR(apply_store_environment(options), DistError,
                    {"LOOM_STORE_MAX_VALUE_BYTES=12", "between 1024"});
  set("LOOM_STORE_MAX_VALUE_BYTES", "lots");
  EXPECT_LOOM_ERROR(apply_store_environment(options), DistError,
                    {"LOOM_STORE_MAX_VALUE_BYTES='lots'", "not an integer"});
}

TEST_F(EnvironmentTest, RendezvousProvesTheJobsSecret) {
  set("LOOM_JOB_SECRET", "the job's secret");
  Environment env;
  env.world_size = 2;
  env.master_port = closed_port();
  Environment env1 = env;
  env1.rank = 1;
  std::shared_ptr<Store> store1;
  std::thread rank1([&] { store1 = rendezvous(env1, 5s); });
  auto store0 = rendezvous(env, 5s);
  rank1.join();
  store1->set("from1", std::string("hi"));
  EXPECT_EQ(store0->get_string("from1"), "hi");
  EXPECT_LOOM_ERROR(make_client(env.master_port), DistError,
                    {"refused this process: LOOM_JOB_SECRET differs"});
}

}  // namespace
}  // namespace loom::dist
