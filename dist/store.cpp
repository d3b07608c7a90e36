// dist/store.cpp — what every store shares (string helpers), PrefixStore, and rendezvous from
// PyTorch's launch environment (DESIGN.md decision 9). The TCP store itself is in
// dist/tcp_store.cpp.
#include "dist/store.h"

#include <charconv>
#include <cstdlib>
#include <optional>

#include "tensor/error.h"

namespace loom::dist {

void Store::set(const std::string& key, const std::string& value) {
  set(key, Bytes(value.begin(), value.end()));
}

std::string Store::get_string(const std::string& key) {
  const Bytes value = get(key);
  return std::string(value.begin(), value.end());
}

// ---------------------------------------------------------------- PrefixStore

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  LOOM_CHECK(store_ != nullptr, ValueError, "PrefixStore: the underlying store is null");
  timeout_ = store_->timeout();
}

void PrefixStore::set(const std::string& k, const Bytes& value) { store_->set(key(k), value); }

Bytes PrefixStore::get(const std::string& k, Milliseconds timeout) {
  return store_->get(key(k), timeout);
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return store_->add(key(k), delta); }

Bytes PrefixStore::compare_set(const std::string& k, const Bytes& expected, const Bytes& desired) {
  return store_->compare_set(key(k), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& k : keys) prefixed.push_back(key(k));
  store_->wait(prefixed, timeout);
}

bool PrefixStore::delete_key(const std::string& k) { return store_->delete_key(key(k)); }

int64_t PrefixStore::num_keys() { return store_->num_keys(); }

// ---------------------------------------------------------------- the launch environment

namespace {

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int64_t parse_integer(const char* name, const std::string& text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOOM_CHECK(ec == std::errc() && end == text.data() + text.size(), DistError,
             "environment: ", name, "='", text, "' is not an integer");
  return value;
}

int64_t required_integer(const char* name) {
  const std::optional<std::string> text = env_value(name);
  LOOM_CHECK(text.has_value(), DistError, "environment: ", name,
             " is not set (a launcher such as loomrun or torchrun sets RANK, WORLD_SIZE, "
             "MASTER_ADDR and MASTER_PORT)");
  return parse_integer(name, *text);
}

}  // namespace

Environment environment_from_env() {
  Environment env;
  const int64_t world_size = required_integer("WORLD_SIZE");
  const int64_t rank = required_integer("RANK");
  LOOM_CHECK(world_size >= 1 && world_size <= (1 << 20), DistError,
             "environment: WORLD_SIZE=", world_size, " must be at least 1");
  LOOM_CHECK(rank >= 0 && rank < world_size, DistError, "environment: RANK=", rank,
             " is outside 0 .. WORLD_SIZE-1 (WORLD_SIZE=", world_size, ")");
  env.rank = static_cast<int>(rank);
  env.world_size = static_cast<int>(world_size);

  const std::optional<std::string> local_world = env_value("LOCAL_WORLD_SIZE");
  const std::optional<std::string> local_rank = env_value("LOCAL_RANK");
  env.local_world_size = local_world
                             ? static_cast<int>(parse_integer("LOCAL_WORLD_SIZE", *local_world))
                             : env.world_size;
  env.local_rank =
      local_rank ? static_cast<int>(parse_integer("LOCAL_RANK", *local_rank)) : env.rank;
  LOOM_CHECK(env.local_world_size >= 1 && env.local_world_size <= env.world_size, DistError,
             "environment: LOCAL_WORLD_SIZE=", env.local_world_size,
             " must be between 1 and WORLD_SIZE=", env.world_size);
  LOOM_CHECK(env.local_rank >= 0 && env.local_rank < env.local_world_size, DistError,
             "environment: LOCAL_RANK=", env.local_rank,
             " is outside 0 .. LOCAL_WORLD_SIZE-1 (LOCAL_WORLD_SIZE=", env.local_world_size, ")");

  const std::optional<std::string> addr = env_value("MASTER_ADDR");
  LOOM_CHECK(addr.has_value(), DistError,
             "environment: MASTER_ADDR is not set (the address of the machine of rank 0)");
  env.master_addr = *addr;
  const int64_t port = required_integer("MASTER_PORT");
  LOOM_CHECK(port >= 1 && port <= 65535, DistError, "environment: MASTER_PORT=", port,
             " is not a TCP port (1 .. 65535)");
  env.master_port = static_cast<uint16_t>(port);
  return env;
}

bool launched_by_launcher() { return env_value("WORLD_SIZE").has_value(); }

void apply_store_environment(TCPStoreOptions& options) {
  if (const auto secret = env_value("LOOM_JOB_SECRET")) options.secret = *secret;
  if (const auto bind_all = env_value("LOOM_STORE_BIND_ALL")) {
    LOOM_CHECK(*bind_all == "0" || *bind_all == "1", DistError,
               "environment: LOOM_STORE_BIND_ALL='", *bind_all,
               "' must be 1 (serve the store on every interface) or 0");
    options.bind_all = *bind_all == "1";
  }
  if (const auto max_value = env_value("LOOM_STORE_MAX_VALUE_BYTES")) {
    const int64_t bytes = parse_integer("LOOM_STORE_MAX_VALUE_BYTES", *max_value);
    LOOM_CHECK(bytes >= 1024 && bytes <= (int64_t{1} << 30), DistError,
               "environment: LOOM_STORE_MAX_VALUE_BYTES=", bytes,
               " must be between 1024 and 1073741824 (1 GiB)");
    options.limits.max_value_bytes = static_cast<uint32_t>(bytes);
  }
}

// torchrun's default ("static") rendezvous keeps its own store, in PyTorch's protocol, on
// MASTER_PORT and tells the workers so with TORCHELASTIC_USE_AGENT_STORE=True; loom then serves
// its store one port above. (With --rdzv_backend=c10d or --standalone, MASTER_PORT is free.)
std::shared_ptr<Store> rendezvous(const Environment& env, Milliseconds timeout) {
  TCPStoreOptions options;
  options.host = env.master_addr;
  options.port = env.master_port;
  if (env_value("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    LOOM_CHECK(env.master_port < 65535, DistError, "rendezvous: MASTER_PORT=", env.master_port,
               " is torchrun's agent store and there is no port above it for loom's");
    options.port = static_cast<uint16_t>(env.master_port + 1);
  }
  options.is_server = env.rank == 0;
  options.timeout = timeout;
  apply_store_environment(options);
  // Under loomrun the launcher of node 0 serves the store and every rank connects to it; the
  // ranks of each start of the job see it under "round/<LOOM_RESTART_COUNT>/" (Note [Launchers
  // together] in dist/launch.h).
  if (env_value("LOOM_AGENT_STORE").value_or("") == "1") {
    options.is_server = false;
    const std::string round = env_value("LOOM_RESTART_COUNT").value_or("0");
    return std::make_shared<PrefixStore>("round/" + round, std::make_shared<TCPStore>(options));
  }
  return std::make_shared<TCPStore>(options);
}

}  // namespace loom::dist
