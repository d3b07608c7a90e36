// apps/loomrun — starts the worker processes of a data-parallel loom program, as torchrun does
// for Python: `loomrun --nproc-per-node 2 build/apps/resnet18_cifar --epochs 1`. The flags are
// torchrun's; everything from the program on goes to the workers untouched. See dist/launch.h.
// `loomrun [--nproc-per-node N] --plan FLAGS` runs loomplan (beside loomrun) with FLAGS instead,
// for a world of N (times --nnodes) unless FLAGS give --world.
// `loomrun --doctor [FLAGS] PROGRAM ARGS...` checks the job instead of running it (dist/doctor.h).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dist/doctor.h"
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

// --nnodes N, or torchrun's MIN:MAX with MIN == MAX (membership is fixed: Note [Launchers
// together]). An error message, or "".
std::string parse_nnodes(const std::string& text, int& nnodes) {
  const size_t colon = text.find(':');
  const std::string low = text.substr(0, colon);
  const std::string high = colon == std::string::npos ? low : text.substr(colon + 1);
  int a = 0, b = 0;
  const auto parse = [](const std::string& t, int& v) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc() && end == t.data() + t.size() && v >= 1;
  };
  if (!parse(low, a) || !parse(high, b))
    return "--nnodes " + text + ": expected a positive number of machines (or N:N)";
  if (a != b)
    return "--nnodes " + text +
           ": elastic membership (MIN:MAX) is not supported; the job runs on a fixed number "
           "of machines (docs/decisions.md)";
  nnodes = a;
  return "";
}

// --rdzv-endpoint HOST:PORT (or [IPv6]:PORT) sets --master-addr and --master-port.
std::string parse_endpoint(const std::string& text, loom::dist::LaunchOptions& o) {
  const size_t colon = text.rfind(':');
  std::string host = colon == std::string::npos ? text : text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = 29500;
  if (colon != std::string::npos) {
    const std::string p = text.substr(colon + 1);
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec != std::errc() || end != p.data() + p.size() || port < 1 || port > 65535)
      return "--rdzv-endpoint " + text + ": the port must be 1 .. 65535";
  }
  if (host.empty()) return "--rdzv-endpoint " + text + ": no host";
  o.master_addr = host;
  o.master_port = static_cast<uint16_t>(port);
  return "";
}

// The job's secret (Note [Job secret]): --secret-file's first line, else LOOM_JOB_SECRET.
std::string read_secret(const std::string& file, std::string& secret) {
  if (file.empty()) {
    const char* env = std::getenv("LOOM_JOB_SECRET");
    secret = env != nullptr ? env : "";
    return "";
  }
  std::ifstream in(file);
  if (!in) return "--secret-file " + file + ": cannot read it: " + std::strerror(errno);
  std::getline(in, secret);
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back())))
    secret.pop_back();
  if (secret.size() < 16)
    return "--secret-file " + file + ": the secret must be at least 16 characters";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // The hidden worker of --doctor: one rank's checks (Note [The doctor] in dist/doctor.h).
  if (argc >= 2 && std::strcmp(argv[1], "--doctor-rank") == 0)
    return loom::dist::run_doctor_rank(std::vector<std::string>(argv + 2, argv + argc));
  CLI::App app{
      "Start the worker processes of a data-parallel loom program (torchrun for loom).\n"
      "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
      "MASTER_PORT, GROUP_RANK and LOOM_RESTART_COUNT. When one fails, the others are\n"
      "stopped; with --max-restarts the group starts again (workers resume from their\n"
      "checkpoint when LOOM_RESTART_COUNT > 0).\n"
      "Usage: loomrun [OPTIONS] PROGRAM [ARGS...]\n"
      "       loomrun [--nproc-per-node N] --plan LOOMPLAN-FLAGS  (the memory planner: "
      "loomplan --help)\n"
      "       loomrun --doctor [OPTIONS] PROGRAM [ARGS...]  (check the job, every host and "
      "rank)\n"};
  loom::dist::LaunchOptions options;
  int port = options.master_port;
  double grace_s = 5, drain_s = 3, heartbeat_s = 15, node_timeout_s = 15, rdzv_timeout_s = 300;
  bool standalone = false, doctor = false;
  std::string nnodes = "1", rdzv_endpoint, rdzv_backend = "static", secret_file;
  app.add_option("--nproc-per-node,--nproc_per_node", options.nproc_per_node,
                 "worker processes on this machine")
      ->check(CLI::PositiveNumber);
  app.add_option("--nnodes", nnodes, "machines taking part (N, or torchrun's N:N)");
  app.add_option("--node-rank,--node_rank", options.node_rank, "this machine's index")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr,--master_addr", options.master_addr,
                 "address of the machine of rank 0 (it serves the store)");
  app.add_option("--master-port,--master_port", port, "its port (0: any free port, one node)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", rdzv_endpoint,
                 "HOST:PORT of the rendezvous (torchrun's name for --master-addr/--master-port)");
  app.add_option("--rdzv-id,--rdzv_id", options.rdzv_id,
                 "the job's name: launchers of another job are refused");
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend,
                 "static or c10d (both: node 0's launcher serves the store)")
      ->check(CLI::IsMember({"static", "c10d"}));
  app.add_option("--rdzv-timeout,--rdzv_timeout", rdzv_timeout_s,
                 "seconds every node's launcher has to arrive, at the start and each restart")
      ->check(CLI::PositiveNumber);
  app.add_option("--secret-file", secret_file,
                 "a file holding the job's secret (default: LOOM_JOB_SECRET; one node makes one)");
  app.add_flag("--store-bind-all", options.store_bind_all,
               "node 0 serves the store on every interface, not only --master-addr's");
  app.add_option("--max-restarts,--max_restarts", options.max_restarts,
                 "restarts of the whole group after a failure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--heartbeat-timeout", heartbeat_s,
                 "seconds a worker that has beaten may stay silent before it counts as hung "
                 "(0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--node-timeout", node_timeout_s,
                 "seconds a node's launcher may stay silent before its node counts as gone")
      ->check(CLI::PositiveNumber);
  app.add_option("--drain", drain_s,
                 "seconds the workers have to raise and exit after another rank's failure, "
                 "before SIGTERM")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace", grace_s, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--standalone", standalone, "one node, any free port (as torchrun's)");
  app.add_flag("--doctor", doctor,
               "check the job on every host and rank instead of running it (store, devices, a "
               "collective, --data, --checkpoint-dir, one build, threads, the LR rule); "
               "exit 0 when all pass");
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
  const auto ms = [](double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  };
  options.grace = ms(grace_s);
  options.drain = ms(drain_s);
  options.heartbeat_timeout = ms(heartbeat_s);
  options.node_timeout = ms(node_timeout_s);
  options.join_timeout = ms(rdzv_timeout_s);
  std::string error = parse_nnodes(nnodes, options.nnodes);
  if (error.empty() && !rdzv_endpoint.empty()) error = parse_endpoint(rdzv_endpoint, options);
  if (error.empty()) error = read_secret(secret_file, options.secret);
  if (!error.empty()) {
    std::fprintf(stderr, "loomrun: %s\n", error.c_str());
    return kUsageError;
  }
  if (standalone) {
    options.nnodes = 1;
    options.node_rank = 0;
    options.master_addr = "127.0.0.1";
    options.master_port = 0;
  }

  try {
    return doctor ? loom::dist::run_doctor(options, command) : loom::dist::launch(options, command);
  } catch (const loom::ValueError& e) {  // bad options, a program that cannot be run
    std::fprintf(stderr, "loomrun: %s\n", without_prefix(e.what()).c_str());
    return kUsageError;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loomrun: %s\n", without_prefix(e.what()).c_str());
    return 1;
  }
}
