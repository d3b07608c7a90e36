// dist/store.h — the key-value store through which ranks find each other (rendezvous) and
// exchange small facts: gloo's addresses, NCCL's unique id, collective fingerprints, barriers.
// TCPStore is the one implementation: a server thread in rank 0 (or in the launcher) and a
// client in every rank, all speaking a small length-prefixed protocol over TCP. Only the job's
// processes can use it: every connection proves that it knows the job's secret, and the server
// listens only on the address the job names (Note [Store security] in dist/tcp_store.cpp).
//
// Note [Store semantics]
//   set(k, v)                 stores v, waking whoever waits for k
//   get(k[, t])               the value, waiting for k to appear up to t (default timeout());
//                             DistError after t naming the key
//   add(k, d)                 k += d as a decimal integer (0 when absent), returns the new value
//   compare_set(k, exp, new)  sets k to new if its value is exp (or k is absent and exp is
//                             empty); returns the value k holds afterwards
//   wait(keys, t)             blocks until every key exists; DistError after t naming the keys
//                             still missing
//   delete_key(k)             true when k existed
//   num_keys()                how many keys the store holds
// Every failure (the server gone, a timeout, a protocol error) raises DistError naming the
// store's address and what was asked.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::dist {

using Bytes = std::vector<uint8_t>;
using Milliseconds = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  virtual Bytes get(const std::string& key, Milliseconds timeout) = 0;
  Bytes get(const std::string& key) { return get(key, timeout_); }
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  virtual void wait(const std::vector<std::string>& keys, Milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;

  // Strings in and out, for the common case.
  void set(const std::string& key, const std::string& value);
  std::string get_string(const std::string& key);

  Milliseconds timeout() const { return timeout_; }
  void set_timeout(Milliseconds timeout) { timeout_ = timeout; }

 protected:
  Milliseconds timeout_{std::chrono::minutes(5)};
};

// What a store server takes from a connection (Note [Store security]). A field's length is
// checked when its 4 bytes arrive, before anything is allocated; a connection over a cap is closed
// at once. Clients check the sizes too, and raise DistError before sending what would be refused.
struct TCPStoreLimits {
  uint32_t max_key_bytes = 4 << 10;
  // A value, and a wait's keys together; LOOM_STORE_MAX_VALUE_BYTES (apply_store_environment).
  uint32_t max_value_bytes = 64 << 20;
  int max_connections = 1024;          // open at once, from everyone
  int max_connections_per_peer = 512;  // from one address: 64 local ranks, 8 pooled each
  Milliseconds handshake_timeout{std::chrono::seconds(10)};  // from accept to a proven secret
  Milliseconds request_timeout{std::chrono::seconds(60)};    // a request's first byte to its last
};

struct TCPStoreOptions {
  std::string host = "127.0.0.1";  // the server's address (clients connect to it)
  uint16_t port = 29500;           // 0 on the server: any free port (see TCPStore::port())
  bool is_server = false;
  Milliseconds timeout{std::chrono::minutes(5)};  // connecting, get and wait
  // The job's secret (LOOM_JOB_SECRET): each connection proves that it knows it, and the
  // server proves it back; it never crosses the wire. A server with none accepts only clients
  // with none (programs started by torchrun, tests).
  std::string secret;
  // Where the server listens: bind_address when given, else the address `host` resolves to
  // (127.0.0.1: this machine only; this machine's name or address: that interface). bind_all:
  // every interface (0.0.0.0; LOOM_STORE_BIND_ALL=1).
  std::string bind_address;
  bool bind_all = false;
  TCPStoreLimits limits;
};

class TCPStore : public Store {
 public:
  // The server binds and starts serving, then connects its own client. A client retries
  // connecting until the timeout, then raises DistError naming host:port.
  explicit TCPStore(TCPStoreOptions options);
  ~TCPStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Milliseconds timeout) override;
  using Store::get;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::set;

  uint16_t port() const;
  const std::string& host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every key under "<prefix>/": separates process groups, or runs, sharing one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Milliseconds timeout) override;
  using Store::get;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;  // the keys of the whole underlying store
  using Store::set;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

// The launch environment of PyTorch's conventions (DESIGN.md decision 9).
struct Environment {
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
};
// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; DistError naming a
// variable that is missing or malformed (LOCAL_* default to RANK and WORLD_SIZE).
Environment environment_from_env();
// True when WORLD_SIZE is set (the program was started by a launcher).
bool launched_by_launcher();
// Fills what the launch environment says about the store: LOOM_JOB_SECRET (secret),
// LOOM_STORE_BIND_ALL=1 (bind_all), LOOM_STORE_MAX_VALUE_BYTES (limits.max_value_bytes);
// DistError naming a malformed one. Variables that are not set leave their field alone.
void apply_store_environment(TCPStoreOptions& options);
// Rank 0 serves the store at master_addr:master_port, the others connect to it, with the
// options apply_store_environment reads.
std::shared_ptr<Store> rendezvous(const Environment& env, Milliseconds timeout);

// The server's side of one connection without its socket (Note [Store protocol]), so that the
// fuzzer (fuzz/store_protocol_fuzzer.cpp) and tests drive it in-process; the TCP server drives
// one per connection. Not part of the API. (Not named `detail`: loom::dist code calls
// loom::detail::str unqualified.)
namespace store_internal {

using Mac = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 32>;

// HMAC-SHA256 (RFC 2104) over data/sha256.h: the handshake's proof of the secret.
Mac hmac_sha256(std::string_view key, std::string_view message);
// a == b, taking as long whichever bytes differ (a MAC compared byte by byte with an early exit
// would tell an attacker how many of its first bytes were right).
bool equal_in_constant_time(const Mac& a, const Mac& b);
// 32 bytes from the kernel's random source (getrandom, else /dev/urandom).
Nonce random_nonce();

// A server's keys and values, shared by its sessions.
class StoreData;
std::shared_ptr<StoreData> make_store_data();
int64_t num_keys(StoreData& data);

// Why a session ended without the peer simply closing: what the server's log says about it.
enum class Drop { kNone, kSecret, kVersion, kProtocol, kSize, kStall, kCapacity };

class ServerSession {
 public:
  ServerSession(std::shared_ptr<StoreData> data, std::string secret, TCPStoreLimits limits,
                const Nonce& server_nonce);
  ~ServerSession();
  ServerSession(const ServerSession&) = delete;
  ServerSession& operator=(const ServerSession&) = delete;

  // How many bytes the session takes next: never more than the rest of the item it is reading
  // (so a reader reads nothing beyond the current message), 0 when it is closed or waiting.
  size_t wanted() const;
  // Takes up to n bytes (fewer when it closes or starts waiting); returns how many it took.
  size_t consume(const uint8_t* bytes, size_t n);
  // The bytes to send to the peer (handshake messages and replies), taken out.
  Bytes take_output();

  bool authenticated() const;  // the peer proved the secret
  bool in_request() const;     // partway through a request (its deadline runs)
  bool waiting() const;        // a get or wait whose keys are not all there yet
  bool closed() const;
  Drop drop() const;               // kNone unless the session dropped the peer
  const std::string& why() const;  // for the log: "it did not prove the job's secret"

  // Answers a waiting get or wait once its keys are there or its timeout passed; false when
  // the store stops meanwhile (the session is then closed).
  bool wait_and_answer();
  // Answers a waiting get or wait now, with a timeout for keys still missing (the fuzzer's).
  void answer_now();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace store_internal

}  // namespace loom::dist
