// dist/store.h — the key-value store through which ranks find each other (rendezvous) and
// exchange small facts: gloo's addresses, NCCL's unique id, collective fingerprints, barriers.
// TCPStore is the one implementation: a server thread in rank 0 (or in the launcher) and a
// client in every rank, all speaking a small length-prefixed protocol over TCP.
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

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
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

struct TCPStoreOptions {
  std::string host = "127.0.0.1";  // the server's address (clients connect to it)
  uint16_t port = 29500;           // 0 on the server: any free port (see TCPStore::port())
  bool is_server = false;
  Milliseconds timeout{std::chrono::minutes(5)};  // connecting, get and wait
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
// Rank 0 serves the store at master_addr:master_port, the others connect to it.
std::shared_ptr<Store> rendezvous(const Environment& env, Milliseconds timeout);

}  // namespace loom::dist
