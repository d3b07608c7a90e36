// tests/dist/store_test.cpp — TCPStore (every op, blocking get and wait, timeouts, a dead address,
// the server going away, several threads and several processes), PrefixStore, and rendezvous
// from PyTorch's launch environment.
#include "dist/store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include "dist/multiprocess.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

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

TEST(TCPStore, TwoServersCannotShareAPort) {
  auto server = make_server();
  TCPStoreOptions options;
  options.is_server = true;
  options.port = server->port();
  EXPECT_LOOM_ERROR(TCPStore{options}, DistError, {std::to_string(server->port())});
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
    for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                             "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"})
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

}  // namespace
}  // namespace loom::dist
