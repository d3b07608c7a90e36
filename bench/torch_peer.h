// bench/torch_peer.h — a PyTorch co-process for the benchmarks: a script started with --serve
// behind two pipes, answering one JSON line per request line. Benchmarks alternate their own
// repetitions with the peer's so that load from other processes falls on both alike.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

using nlohmann::json;

// For a benchmark whose calls alternate with the peer's and take a millisecond or so: with
// libgomp's default wait policy each side's threads spin for a while after its work, on the
// cores the other side is about to use (docs/cpu_speed.md, the main job's section). Unless
// OMP_WAIT_POLICY is set, this sets it to PASSIVE for both sides and runs the program again
// (libgomp reads it as it loads); if that fails, the program goes on as it is. Call it first
// in main.
inline void wait_passively(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
}

class TorchPeer {
 public:
  // Runs `python script --serve args...`; false when it cannot start or reports an error
  // (no torch) in its header line.
  bool start(const std::string& python, const std::string& script,
             const std::vector<std::string>& args) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return false;
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      close(to_child[1]);
      close(from_child[0]);
      std::vector<std::string> words = {python, script, "--serve"};
      words.insert(words.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (std::string& w : words) argv.push_back(w.data());
      argv.push_back(nullptr);
      execv(python.c_str(), argv.data());
      std::printf("{\"error\": \"cannot run %s\"}\n", python.c_str());
      std::fflush(stdout);
      _exit(1);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    header_ = read();
    return header_.is_object() && !header_.contains("error");
  }
  const json& header() const { return header_; }
  json request(const std::string& line) {
    std::fprintf(to_, "%s\n", line.c_str());
    std::fflush(to_);
    return read();
  }
  ~TorchPeer() {
    if (to_) std::fclose(to_);
    if (from_) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }

 private:
  json read() {
    std::string line;
    for (int ch; (ch = std::fgetc(from_)) != EOF && ch != '\n';)
      line.push_back(static_cast<char>(ch));
    return json::parse(line, nullptr, /*allow_exceptions=*/false);
  }
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  json header_;
};

}  // namespace loom::bench
