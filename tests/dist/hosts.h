// tests/dist/hosts.h — several "hosts" on one machine for the multi-host tests: each host is a
// network namespace with its own loopback and one end of a veth pair, host i at 10.77.0.(i+1)/24
// (the namespaces of one test reach each other and nothing else). Making namespaces needs root
// and iproute2; where either is missing, Hosts::available() says why and the tests skip.
// A command runs on host i as `ip netns exec <name> <command>`: the processes share the
// machine's files (checkpoints are on "shared storage") but not its network.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace loom::test {

class Hosts {
 public:
  // Two hosts joined by a veth pair (the interface of host i is named "veth<i>").
  Hosts() {
    const std::string tag = std::to_string(::getpid());
    names_ = {"loomt" + tag + "a", "loomt" + tag + "b"};
    if (::geteuid() != 0) {
      why_not_ = "making network namespaces needs root";
      return;
    }
    if (std::system("command -v ip > /dev/null 2>&1") != 0) {
      why_not_ = "iproute2's ip is not installed";
      return;
    }
    for (const std::string& n : names_) {
      if (!sh("ip netns add " + n)) {
        why_not_ = "ip netns add failed (no CAP_SYS_ADMIN, or no namespace support)";
        return;
      }
      made_.push_back(n);
      sh("ip -n " + n + " link set lo up");
    }
    if (!sh("ip link add veth0 netns " + names_[0] + " type veth peer name veth1 netns " +
            names_[1])) {
      why_not_ = "ip link add ... type veth failed (no veth support)";
      return;
    }
    for (int i = 0; i < 2; ++i) {
      sh("ip -n " + names_[i] + " addr add " + address(i) + "/24 dev veth" + std::to_string(i));
      sh("ip -n " + names_[i] + " link set veth" + std::to_string(i) + " up");
    }
    ok_ = true;
  }
  ~Hosts() {
    for (const std::string& n : made_) {
      // Whatever a failed test left running in the namespace goes with it.
      sh("ip netns pids " + n + " 2> /dev/null | xargs -r kill -9");
      sh("ip netns del " + n);
    }
  }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  bool available() const { return ok_; }
  const std::string& why_not() const { return why_not_; }
  static std::string address(int host) { return "10.77.0." + std::to_string(host + 1); }

  // Starts `command` (a shell command line) on `host` with its output in `log`; the pid is the
  // command's own (the shell and ip exec it).
  pid_t spawn(int host, const std::string& command, const std::string& log) const {
    const std::string line =
        "exec ip netns exec " + names_[host] + " " + command + " > '" + log + "' 2>&1";
    const char* argv[] = {"/bin/sh", "-c", line.c_str(), nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0)
      return -1;
    return pid;
  }
  // The pids of processes in `host`'s namespace (the launcher's workers among them).
  std::vector<pid_t> pids(int host) const {
    std::vector<pid_t> out;
    std::istringstream in(output("ip netns pids " + names_[host]));
    for (pid_t pid; in >> pid;) out.push_back(pid);
    return out;
  }

 private:
  static bool sh(const std::string& command) {
    return std::system((command + " > /dev/null 2>&1").c_str()) == 0;
  }
  static std::string output(const std::string& command) {
    std::string out;
    if (FILE* pipe = ::popen(command.c_str(), "r")) {
      char buffer[256];
      while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
      ::pclose(pipe);
    }
    return out;
  }

  std::vector<std::string> names_, made_;
  std::string why_not_;
  bool ok_ = false;
};

}  // namespace loom::test
