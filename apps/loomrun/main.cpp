// apps/loomrun — starts the worker processes of a data-parallel loom program, as torchrun does
// for Python: `loomrun --nproc-per-node 2 build/apps/resnet18_cifar --epochs 1`. The flags are
// torchrun's; everything from the program on goes to the workers untouched. See dist/launch.h.
// `loomrun [--nproc-per-node N] --plan FLAGS` runs loomplan (beside loomrun) with FLAGS instead,
// for a world of N (times --nnodes) unless FLAGS give --world.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dist/launch.h"
#include "tensor/error.h"

namespace {

constexpr int kUsageError = 2;

// "launch: no program to run" -> "no program to run": loomrun prefixes its own name.
std::string without_prefix(const std::string& message) {
  const std::string prefix = "launch: ";
  return message.compare(0, prefix.size(), prefix) == 0 ? message.substr(prefix.size()) : message;
}

// `loomrun --plan ...`: replaces this process with loomplan, found beside loomrun (in the build
// tree and in an installed bin/ alike). Returns only when that fails.
int run_planner(std::vector<std::string> args, int world) {
  const bool has_world = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a == "--world" || a == "--nproc" || a.starts_with("--world=") ||
           a.starts_with("--nproc=");
  });
  if (!has_world && world > 1) {
    args.push_back("--world");
    args.push_back(std::to_string(world));
  }
  std::string planner;
  try {
    planner = (std::filesystem::path(loom::dist::current_executable()).parent_path() / "loomplan")
                  .string();
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loomrun: --plan: %s\n", e.what());
    return kUsageError;
  }
  args.insert(args.begin(), planner);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(planner.c_str(), argv.data());
  std::fprintf(stderr, "loomrun: --plan: cannot run %s: %s\n", planner.c_str(),
               std::strerror(errno));
  return kUsageError;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Start the worker processes of a data-parallel loom program (torchrun for loom).\n"
      "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
      "MASTER_PORT, GROUP_RANK and LOOM_RESTART_COUNT. When one fails, the others are\n"
      "stopped; with --max-restarts the group starts again (workers resume from their\n"
      "checkpoint when LOOM_RESTART_COUNT > 0).\n"
      "Usage: loomrun [OPTIONS] PROGRAM [ARGS...]\n"
      "       loomrun [--nproc-per-node N] --plan LOOMPLAN-FLAGS  (the memory planner: "
      "loomplan --help)\n"};
  loom::dist::LaunchOptions options;
  int port = options.master_port;
  double grace_s = 5;
  bool standalone = false;
  app.add_option("--nproc-per-node,--nproc_per_node", options.nproc_per_node,
                 "worker processes on this machine")
      ->check(CLI::PositiveNumber);
  app.add_option("--nnodes", options.nnodes, "machines taking part")->check(CLI::PositiveNumber);
  app.add_option("--node-rank,--node_rank", options.node_rank, "this machine's index")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr,--master_addr", options.master_addr,
                 "address of the machine of rank 0 (it serves the store)");
  app.add_option("--master-port,--master_port", port, "its port (0: any free port, one node)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--max-restarts,--max_restarts", options.max_restarts,
                 "restarts of the whole group after a failure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace", grace_s, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--standalone", standalone, "one node, any free port (as torchrun's)");
  // The first argument that is not one of ours is the program: it and all after it are kept.
  app.prefix_command();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help (code 0) or what was wrong
    return code == 0 ? 0 : kUsageError;
  }
  std::vector<std::string> command = app.remaining();
  if (command.empty()) {
    std::fprintf(stderr, "loomrun: no program to run (run loomrun --help)\n");
    return kUsageError;
  }
  if (command[0] == "--plan")
    return run_planner({command.begin() + 1, command.end()},
                       options.nproc_per_node * options.nnodes);
  if (command[0].size() > 1 && command[0][0] == '-' && command[0] != "--") {
    std::fprintf(stderr, "loomrun: unknown option %s (run loomrun --help)\n", command[0].c_str());
    return kUsageError;
  }
  if (command[0] == "--") command.erase(command.begin());  // `loomrun -- program ...`
  if (command.empty()) {
    std::fprintf(stderr, "loomrun: no program to run (run loomrun --help)\n");
    return kUsageError;
  }
  options.master_port = static_cast<uint16_t>(port);
  options.grace = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
  if (standalone) {
    options.nnodes = 1;
    options.node_rank = 0;
    options.master_addr = "127.0.0.1";
    options.master_port = 0;
  }

  try {
    return loom::dist::launch(options, command);
  } catch (const loom::ValueError& e) {  // bad options, a program that cannot be run
    std::fprintf(stderr, "loomrun: %s\n", without_prefix(e.what()).c_str());
    return kUsageError;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loomrun: %s\n", without_prefix(e.what()).c_str());
    return 1;
  }
}
