// dist/node_agent.cpp — NodeAgent (dist/node_agent.h), the launchers' side of Note [Launchers
// together]: their keys in the store are
//   job/config            what every launcher must agree on (set by the first, checked by all)
//   node/<n>/name         "node 1 (10.0.0.2)"; a second launcher claiming the same rank is refused
//   node/<n>/beat         a counter each launcher increments about four times a second
//   round/<r>/joined      launchers ready to start round r
//   round/<r>/failure     the round's first failure report; round/<r>/failures counts them
//   round/<r>/done        launchers whose workers all succeeded
// The workers of round r see the store under "round/<r>/" (their own keys stay apart from the
// launchers' and from an earlier round's), so they read "failures" and "failure" as they are.

#include "dist/node_agent.h"

#include <algorithm>
#include <thread>

#include "dist/net.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

using Clock = std::chrono::steady_clock;

// How long one store call of a launcher may take before the store counts as gone.
constexpr Milliseconds kCallTimeout{5000};
constexpr Milliseconds kBeatEvery{250};

int64_t wall_ms() {
  return std::chrono::duration_cast<Milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

NodeAgent::NodeAgent(const NodeAgentOptions& o) : o_(o) {
  TCPStoreOptions store;
  store.host = o.master_addr;
  store.port = o.master_port;
  store.is_server = o.node_rank == 0;
  store.timeout = o.join_timeout;  // the first connection waits for node 0 to come up
  store.secret = o.secret;
  store.bind_all = o.bind_all;
  auto tcp = std::make_shared<TCPStore>(store);
  port_ = tcp->port();
  tcp->set_timeout(kCallTimeout);
  store_ = tcp;

  std::string address = local_address_toward(o.master_addr);
  if (address.empty()) address = "?";
  name_ = "node " + std::to_string(o.node_rank) + " (" + address + ")";

  const std::string config = "rdzv-id " + o.rdzv_id + ", " + std::to_string(o.nnodes) + " nodes, " +
                             std::to_string(o.nproc_per_node) + " workers per node, max restarts " +
                             std::to_string(o.max_restarts);
  // Node 0, which serves the store, states the job; the others read it (waiting for node 0 if
  // they come first) and compare. Were the first writer to state it, a stranger that connected
  // between node 0's store coming up and its write would define the job, and node 0 would be
  // the one refused.
  std::string agreed;
  if (o.node_rank == 0)
    agreed = text(store_->compare_set("job/config", {}, bytes(config)));
  else
    agreed = text(store_->get("job/config", o.join_timeout));
  LOOM_CHECK(agreed == config, DistError, "launcher of ", name_, ": the launchers at ",
             o.master_addr, ":", port_, " run another job (", agreed, ") than this one (", config,
             "): give every node the same --nnodes, --nproc-per-node, --max-restarts and "
             "--rdzv-id");
  const std::string key = "node/" + std::to_string(o.node_rank) + "/name";
  const std::string holder = text(store_->compare_set(key, {}, bytes(name_)));
  LOOM_CHECK(holder == name_, DistError, "launcher of ", name_, ": ", holder,
             " already runs as --node-rank ", o.node_rank, " of this job");
}

NodeAgent::~NodeAgent() = default;

std::string NodeAgent::key(int round, const std::string& name) const {
  return "round/" + std::to_string(round) + "/" + name;
}

void NodeAgent::arrive(int round) {
  store_->add(key(round, "node/" + std::to_string(o_.node_rank)), 1);
  store_->add(key(round, "joined"), 1);
}

std::vector<int> NodeAgent::missing(int round) {
  if (arrived_round_ != round) {
    arrived_.assign(o_.nnodes, false);
    arrived_round_ = round;
    beats_.clear();
  }
  std::vector<int> out;
  const bool all = store_->add(key(round, "joined"), 0) >= o_.nnodes;
  for (int n = 0; n < o_.nnodes; ++n) {
    if (arrived_[n]) continue;
    if (all || store_->add(key(round, "node/" + std::to_string(n)), 0) > 0) {
      arrived_[n] = true;
    } else {
      out.push_back(n);
    }
  }
  return out;
}

std::optional<std::string> NodeAgent::poll(int round) {
  const auto now = Clock::now();
  try {
    if (now - last_beat_ >= kBeatEvery) {
      store_->add("node/" + std::to_string(o_.node_rank) + "/beat", 1);
      last_beat_ = now;
    }
    if (store_->add(key(round, "failures"), 0) > 0)
      return text(store_->get(key(round, "failure"), kCallTimeout));
    if (o_.node_rank != 0) return std::nullopt;
    // Node 0 watches the other launchers (those whose workers have not all finished).
    for (int n = 1; n < o_.nnodes; ++n) {
      const std::string node = "node/" + std::to_string(n);
      if (arrived_round_ != round || !arrived_[n]) continue;  // not started: join_timeout's
      if (store_->add(key(round, "done/" + std::to_string(n)), 0) > 0) continue;
      const int64_t beats = store_->add(node + "/beat", 0);
      auto [it, fresh] = beats_.try_emplace(n, beats, now);
      if (fresh || it->second.first != beats) {
        it->second = {beats, now};
      } else if (now - it->second.second > o_.node_timeout) {
        const std::string name = text(store_->get(node + "/name", kCallTimeout));
        const std::string what = detail::str(
            name, " stopped answering: its launcher sent no heartbeat for ",
            std::chrono::duration_cast<Milliseconds>(now - it->second.second).count() / 1000.0,
            " s (the host is down or cut off, or its launcher was killed)");
        report_failure(round, what);
        return text(store_->get(key(round, "failure"), kCallTimeout));
      }
    }
    return std::nullopt;
  } catch (const DistError& e) {
    return detail::str("the job's store at ", o_.master_addr, ":", port_,
                       " (served by the launcher of node 0) does not answer: ", e.what());
  }
}

void NodeAgent::report_failure(int round, const std::string& what, bool final) {
  try {
    if (final) store_->set("job/stopped", what);
    if (text(store_->compare_set(key(round, "failure"), {}, bytes(what))) == what)
      store_->set(key(round, "failure-at"), std::to_string(wall_ms()));
    store_->add(key(round, "failures"), 1);
  } catch (const DistError&) {
    // The store is gone: the other nodes learn it from the store itself.
  }
}

Milliseconds NodeAgent::failure_age(int round) {
  try {
    const std::string at = text(store_->get(key(round, "failure-at"), Milliseconds(500)));
    return Milliseconds(std::max<int64_t>(0, wall_ms() - std::stoll(at)));
  } catch (const std::exception&) {
    return Milliseconds(0);
  }
}

bool NodeAgent::job_stopped() {
  try {
    // A compare_set that expects what no report is reads the key without waiting.
    return !store_->compare_set("job/stopped", {0xff}, {0xff}).empty();
  } catch (const DistError&) {
    return true;  // no store, no restart
  }
}

void NodeAgent::stopped(int round) {
  try {
    store_->add(key(round, "stopped"), 1);
  } catch (const DistError&) {
  }
}

void NodeAgent::wait_stopped(int round) {
  if (o_.node_rank != 0) return;
  const auto end = Clock::now() + o_.node_timeout;
  try {
    while (store_->add(key(round, "stopped"), 0) < o_.nnodes && Clock::now() < end)
      std::this_thread::sleep_for(Milliseconds(50));
  } catch (const DistError&) {
  }
}

void NodeAgent::finish(int round) {
  store_->add(key(round, "done/" + std::to_string(o_.node_rank)), 1);
  store_->add(key(round, "done"), 1);
}

bool NodeAgent::all_finished(int round) { return store_->add(key(round, "done"), 0) >= o_.nnodes; }

}  // namespace loom::dist
