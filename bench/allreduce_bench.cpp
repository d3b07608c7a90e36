// bench/allreduce_bench.cpp — a process group's allreduce (sum, float32; gloo on CPU tensors by
// default) from 1 KiB to 256 MiB on 2 and 4 ranks of this machine, as nccl-tests prints it: time,
// algbw = bytes / time
// and busbw = algbw * 2(n-1)/n (the bytes each rank must move in a ring allreduce, so that busbw
// compares across rank counts). Beside it, memcpy bandwidth (bytes / time) of the same sizes,
// measured by this binary, the ceiling that busbw on one machine can be held against.
//
// The ranks are real processes: the program re-launches itself through dist::launch with
// --worker (each worker joins the store by dist::rendezvous and a gloo group, 1 thread each);
// rank 0 times each size from a barrier to the allreduce's completion and writes its medians to
// a file that the launching process reads and prints.
//
//   allreduce_bench [--ranks 2,4] [--max-size 256M] [--repeats R (5)] [--check-collectives]
//                   [--backend gloo|nccl] [--device cpu|cuda]
//
// --device cuda puts rank r's tensor on cuda:(r mod GPUs): with nccl, one GPU per rank; with
// gloo, staged through host memory, so ranks may share a GPU (tools/gpu_check.sh uses that on a
// machine with one GPU).
//
// On one host gloo's allreduce goes through shared memory (Note [Shared-memory allreduce] in
// dist/shm_collectives.h); LOOM_SHARED_MEMORY=0 measures its TCP path instead.
//
// --check-collectives keeps Note [Collective checks] (collective_checks.h) on: one store set and
// get per collective, which shows in the small sizes. Off by default, as nccl-tests measure the
// collective alone.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dist/launch.h"
#include "dist/nccl_process_group.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "dist_bench.h"
#include "loom.h"
#include "machine.h"
#include "stats.h"
#include "tensor/accelerator.h"
#include "tensor/copy.h"
#include "tensor/index.h"

namespace {

using loom::bench::median;

namespace dist = loom::dist;
using loom::bench::ForeignLoad;
using loom::bench::launch_quietly;
using loom::bench::ResultFile;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> ranks = {2, 4};
  int64_t max_size = int64_t{256} << 20;
  int repeats = 5;
  bool check_collectives = false;
  std::string backend = "gloo";
  bool cuda = false;  // --device cuda
  bool worker = false;
  std::string result;  // the worker's output file (rank 0 writes it)
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// 1 KiB, 4 KiB, ... up to max_size bytes.
std::vector<int64_t> sizes_up_to(int64_t max_size) {
  std::vector<int64_t> sizes;
  for (int64_t s = 1024; s <= max_size; s *= 4) sizes.push_back(s);
  return sizes;
}

std::string format_size(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// "64M", "256MiB", "4K", "1G" or a byte count.
int64_t parse_size(const std::string& text) {
  size_t used = 0;
  const long long value = std::stoll(text, &used);
  std::string unit = text.substr(used);
  if (unit.size() > 1 && (unit.substr(1) == "iB" || unit.substr(1) == "B"))
    unit = unit.substr(0, 1);
  const int shift = unit.empty()                 ? 0
                    : unit == "K" || unit == "k" ? 10
                    : unit == "M"                ? 20
                    : unit == "G"                ? 30
                                                 : -1;
  LOOM_CHECK(shift >= 0 && value > 0, ValueError,
             "allreduce_bench: --max-size expects a size such as 64M or 4096; got ", text);
  return static_cast<int64_t>(value) << shift;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&] {
      LOOM_CHECK(i + 1 < argc, ValueError, "allreduce_bench: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--ranks") {
      o.ranks.clear();
      std::stringstream list(next());
      for (std::string item; std::getline(list, item, ',');) o.ranks.push_back(std::stoi(item));
    } else if (arg == "--max-size") {
      o.max_size = parse_size(next());
    } else if (arg == "--repeats") {
      o.repeats = std::stoi(next());
    } else if (arg == "--check-collectives") {
      o.check_collectives = true;
    } else if (arg == "--backend") {
      o.backend = next();
      LOOM_CHECK(o.backend == "gloo" || o.backend == "nccl", ValueError,
                 "allreduce_bench: --backend is gloo or nccl; got ", o.backend);
    } else if (arg == "--device") {
      const std::string device = next();
      LOOM_CHECK(device == "cpu" || device == "cuda", ValueError,
                 "allreduce_bench: --device is cpu or cuda; got ", device);
      o.cuda = device == "cuda";
    } else if (arg == "--worker") {
      o.worker = true;
    } else if (arg == "--result") {
      o.result = next();
    } else {
      LOOM_CHECK(false, ValueError, "allreduce_bench: unknown argument ", arg,
                 "; usage: allreduce_bench [--ranks 2,4] [--max-size 256M] [--repeats R] "
                 "[--check-collectives] [--backend gloo|nccl] [--device cpu|cuda]");
    }
  }
  LOOM_CHECK(o.backend == "gloo" || o.cuda, ValueError,
             "allreduce_bench: --backend nccl needs --device cuda");
  LOOM_CHECK(!o.ranks.empty(), ValueError, "allreduce_bench: --ranks is empty");
  for (int n : o.ranks)
    LOOM_CHECK(n >= 2, ValueError, "allreduce_bench: --ranks needs 2 or more; got ", n);
  LOOM_CHECK(o.repeats >= 1, ValueError, "allreduce_bench: --repeats must be >= 1; got ",
             o.repeats);
  LOOM_CHECK(o.max_size >= 1024, ValueError,
             "allreduce_bench: --max-size must be at least 1K; got ", o.max_size);
  return o;
}

// ---------------------------------------------------------------- a worker (one rank)

// Rank 0 writes "bytes median_seconds" per size to o.result.
int run_worker(const Options& o) {
  loom::set_num_threads(1);
  const dist::Environment env = dist::environment_from_env();
  auto store = dist::rendezvous(env, std::chrono::minutes(2));
  dist::ProcessGroupOptions group_options;
  group_options.timeout = std::chrono::minutes(2);
  group_options.check_collectives = o.check_collectives;
  loom::Device device = loom::kCPU;
  if (o.cuda) {
    device = {loom::DeviceType::CUDA, env.local_rank % std::max(1, loom::cuda_device_count())};
    loom::set_cuda_device(device);
  }
  auto group = o.backend == "nccl"
                   ? dist::make_nccl_process_group(store, env.rank, env.world_size, group_options)
                   : dist::make_gloo_process_group(store, env.rank, env.world_size, group_options);
  // A collective is done for the timer when its result is in memory: on a GPU, wait() only
  // orders the current stream after it.
  auto finish = [&](const std::shared_ptr<dist::Work>& work) {
    work->wait();
    if (o.cuda) loom::synchronize(device);
  };

  std::ofstream out;
  if (env.rank == 0) {
    out.open(o.result);
    LOOM_CHECK(out.good(), ValueError, "allreduce_bench: cannot write ", o.result);
    out << group->carrier() << "\n";
  }
  for (const int64_t bytes : sizes_up_to(o.max_size)) {
    const int64_t count = bytes / 4;
    loom::Tensor t = loom::ones({count}, loom::kFloat32, device);
    // Warm-up (connections, pages, scratch buffers): three allreduces, the first of which checks
    // the sum.
    finish(group->allreduce(t));
    const loom::Tensor ends =
        loom::kernels::index_select(t, 0, loom::tensor<int64_t>({0, count - 1}, {2}).to(device));
    const std::vector<double> sums = ends.to_vector<double>();
    LOOM_CHECK(sums[0] == env.world_size && sums[1] == env.world_size, ValueError,
               "allreduce_bench: the sum of ones over ", env.world_size, " ranks came out as ",
               sums[0], " and ", sums[1]);
    loom::kernels::fill_(t, 0.0);  // the timed sums stay at zero: no overflow
    for (int w = 0; w < 2; ++w) finish(group->allreduce(t));
    std::vector<double> seconds;
    for (int r = 0; r < o.repeats; ++r) {
      finish(group->barrier());
      const auto start = Clock::now();
      finish(group->allreduce(t));
      seconds.push_back(seconds_since(start));
    }
    if (env.rank == 0) out << bytes << " " << median(seconds) << "\n";
  }
  if (env.rank == 0) {
    out.close();
    LOOM_CHECK(out.good(), ValueError, "allreduce_bench: cannot write ", o.result);
  }
  finish(group->barrier());  // rank 0 serves the store: it leaves last
  return 0;
}

// ---------------------------------------------------------------- the launching process

// Median of `repeats` samples of bytes / second, each sample copying `bytes` enough times to
// last a while (small sizes stay in cache, as the allreduce's buffers do).
double memcpy_gbps(std::vector<char>& src, std::vector<char>& dst, int64_t bytes, int repeats) {
  const int64_t copies = std::max<int64_t>(1, (int64_t{32} << 20) / bytes);
  std::memcpy(dst.data(), src.data(), bytes);  // warm-up
  std::vector<double> samples;
  for (int r = 0; r < std::max(repeats, 5); ++r) {
    const auto start = Clock::now();
    for (int64_t c = 0; c < copies; ++c) {
      std::memcpy(dst.data(), src.data(), bytes);
      asm volatile("" ::"r"(dst.data()) : "memory");  // every copy happens
    }
    samples.push_back(static_cast<double>(bytes) * copies / seconds_since(start) / 1e9);
  }
  return median(samples);
}

int run_launcher(const Options& o, int argc, char** argv) {
  const std::vector<int64_t> sizes = sizes_up_to(o.max_size);
  const int64_t big = int64_t{256} << 20;
  std::vector<char> src(big, 1), dst(big, 0);
  std::vector<double> memcpy_bw;
  for (const int64_t bytes : sizes) memcpy_bw.push_back(memcpy_gbps(src, dst, bytes, o.repeats));
  const double memcpy_big =
      sizes.back() == big ? memcpy_bw.back() : memcpy_gbps(src, dst, big, o.repeats);
  src = {};
  dst = {};

  const ResultFile result("allreduce_bench");
  const std::string path = result.path;
  std::vector<std::string> command = {dist::current_executable()};
  for (int i = 1; i < argc; ++i) command.push_back(argv[i]);
  command = dist::strip_flag(command, "--ranks", /*has_value=*/true);
  command.insert(command.end(), {"--worker", "--result", path});

  loom::bench::print_machine();
  std::printf(
      "allreduce (sum, float32), %s, 1 thread per rank, collective checks %s; median of %d; "
      "memcpy of 256 MiB: %.1f GB/s\n",
      o.backend == "nccl" ? "nccl on CUDA tensors"
      : o.cuda            ? "gloo on localhost, CUDA tensors staged through host memory"
                          : "gloo on localhost",
      o.check_collectives ? "on" : "off", o.repeats, memcpy_big);
  for (const int world : o.ranks) {
    dist::LaunchOptions launch;
    launch.nproc_per_node = world;
    launch.master_port = 0;
    launch.grace = std::chrono::milliseconds(2000);
    launch.extra_env = {{"OMP_NUM_THREADS", "1"}};
    const ForeignLoad others;
    const int status = launch_quietly(launch, command);
    const double other_cores = others.cores();
    if (status != 0) {
      std::fprintf(stderr, "allreduce_bench: the %d-rank run failed (status %d)\n", world, status);
      return status;
    }
    std::ifstream in(path);
    std::string carrier;  // what the worker's group said of itself: "gloo over tcp"
    std::getline(in, carrier);
    std::printf("\n%d ranks, %s (other processes kept %.2f cores busy meanwhile)\n\n", world,
                carrier.c_str(), other_cores);
    std::printf(
        "| size | count (float32) | time (us) | algbw (GB/s) | busbw (GB/s) | "
        "memcpy (GB/s) |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|\n");
    size_t row = 0;
    for (int64_t bytes; in >> bytes; ++row) {
      double seconds = 0;
      in >> seconds;
      const double algbw = bytes / seconds / 1e9;
      const double busbw = algbw * 2.0 * (world - 1) / world;
      std::printf("| %s | %lld | %.1f | %.3f | %.3f | %.1f |\n", format_size(bytes).c_str(),
                  static_cast<long long>(bytes / 4), seconds * 1e6, algbw, busbw,
                  row < memcpy_bw.size() ? memcpy_bw[row] : 0.0);
    }
    if (row != sizes.size()) {
      std::fprintf(stderr, "allreduce_bench: the %d-rank run wrote %zu of %zu sizes\n", world, row,
                   sizes.size());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return loom::bench::run_bench(argc, argv, parse, run_worker, run_launcher);
}
