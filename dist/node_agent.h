// dist/node_agent.h — one machine's launcher as a member of the job: the launchers of all
// machines meet at the store that node 0's launcher serves, start each round together, tell one
// another of failures and watch that every launcher is still there. dist/launch.cpp drives it;
// see Note [Launchers together] in dist/launch.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/store.h"

namespace loom::dist {

struct NodeAgentOptions {
  int nnodes = 1, node_rank = 0, nproc_per_node = 1, max_restarts = 0;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;  // 0: any free port (one node)
  std::string secret;        // the job's (Note [Job secret])
  std::string rdzv_id;       // the job's name: launchers of another job are refused
  bool bind_all = false;     // serve on every interface, not only master_addr's
  Milliseconds join_timeout{std::chrono::minutes(5)};   // every launcher at each round's start
  Milliseconds node_timeout{std::chrono::seconds(15)};  // a launcher silent this long is gone
};

class NodeAgent {
 public:
  // Node 0 serves the store; every node connects to it (retrying until join_timeout) and checks
  // that the others run the same job: DistError naming what differs.
  explicit NodeAgent(const NodeAgentOptions& options);
  ~NodeAgent();

  uint16_t port() const { return port_; }
  int node_rank() const { return o_.node_rank; }
  // "node 1 (10.0.0.2)": this machine in messages, with its address toward the master.
  const std::string& name() const { return name_; }

  // Says this launcher is ready to start round `round` (0, then one per restart).
  void arrive(int round);
  // The nodes that have not arrived at `round` yet (empty: start). Also beats.
  std::vector<int> missing(int round);

  // Beats, and returns the round's failure if one is known: reported by a launcher, a launcher
  // that stopped beating (node 0 watches the others), or the store gone (the other nodes).
  std::optional<std::string> poll(int round);
  // Reports this node's failure to every launcher and worker; the first report of a round wins.
  // `final`: the job ends (a launcher was told to stop): no node restarts.
  void report_failure(int round, const std::string& what, bool final = false);
  // How long ago the round's failure was reported (by the clocks of two machines: roughly).
  Milliseconds failure_age(int round);
  bool job_stopped();
  // This node's workers of a failed round are all gone. Node 0, before it stops serving the
  // store at the job's end, waits (up to node_timeout) for every node to have said so.
  void stopped(int round);
  void wait_stopped(int round);
  // This node's workers all succeeded; true once every node's did (node 0 waits for it before
  // it stops serving the store that the others' workers may still use).
  void finish(int round);
  bool all_finished(int round);

 private:
  std::string key(int round, const std::string& name) const;

  NodeAgentOptions o_;
  uint16_t port_ = 0;
  std::string name_;
  std::shared_ptr<Store> store_;
  // Node 0: each other node's last beat count, and when it last changed.
  std::map<int, std::pair<int64_t, std::chrono::steady_clock::time_point>> beats_;
  std::chrono::steady_clock::time_point last_beat_{};
  std::vector<bool> arrived_;  // node 0: the nodes seen at the current round's start
  int arrived_round_ = -1;
};

}  // namespace loom::dist
