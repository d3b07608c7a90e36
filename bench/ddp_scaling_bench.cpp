// bench/ddp_scaling_bench.cpp — data-parallel scaling on this machine's CPUs: ResNet-18 (CIFAR
// stem) training steps with 1 rank x 1 thread (the plain model) and with 2 ranks x 1 thread
// (DistributedDataParallel over gloo), the same batch per rank. It reports the job's images/s
// (world x batch / median step time on rank 0), the speed-up 2 ranks / 1 rank (ideal 2), the
// share of the gradient allreduce hidden behind backward (ReducerTimeline::overlap, median over
// steps), the communication still waited for after backward ended, the bucket plan and what
// carried the bytes (on one host, shared memory: Note [Shared-memory allreduce];
// LOOM_SHARED_MEMORY=0 measures gloo's TCP path instead).
//
// The ideal is measured beside it: two independent 1-rank jobs run at the same time, each a
// plain model with no process group, and their images/s added up over the lone job's is the
// speed-up that sharing the machine's cores, caches and memory bandwidth leaves (DDP cannot beat
// it; the gap to it is what the allreduce costs).
//
// Each configuration is a fresh job: the program re-launches itself through dist::launch with
// --worker, and rank 0 (each rank, for the independent jobs) writes its step times to a file the
// launching process reads. The three configurations alternate (1 rank, 2 independent, 2 ranks,
// 1 rank, ...) for --rounds rounds so that load from other processes falls on all alike; the
// speed-ups are the medians of the per-round ratios.
//
//   ddp_scaling_bench [--width W (32)] [--batch B (32)] [--steps S (8)] [--rounds R (3)]
//                     [--warmup N (2)] [--bucket-mib M (DDP's default, 25)]

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "dist/launch.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "dist_bench.h"
#include "loom.h"
#include "machine.h"
#include "optim/sgd.h"
#include "stats.h"

namespace {

using loom::bench::median;

namespace dist = loom::dist;
using loom::bench::ForeignLoad;
using loom::bench::launch_quietly;
using loom::bench::ResultFile;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t width = 32, batch = 32;
  int steps = 8, rounds = 3, warmup = 2;
  double bucket_mib = 0;  // DDPOptions::bucket_bytes in MiB; 0: DDP's default (25)
  bool worker = false;
  bool independent = false;  // the worker trains alone, whatever the world size
  std::string result;        // the worker's output file (rank 0 writes it; each rank, alone)
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&] {
      LOOM_CHECK(i + 1 < argc, ValueError, "ddp_scaling_bench: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--width")
      o.width = std::stoll(next());
    else if (arg == "--batch")
      o.batch = std::stoll(next());
    else if (arg == "--steps")
      o.steps = std::stoi(next());
    else if (arg == "--rounds")
      o.rounds = std::stoi(next());
    else if (arg == "--warmup")
      o.warmup = std::stoi(next());
    else if (arg == "--bucket-mib")
      o.bucket_mib = std::stod(next());
    else if (arg == "--worker")
      o.worker = true;
    else if (arg == "--independent")
      o.independent = true;
    else if (arg == "--result")
      o.result = next();
    else
      LOOM_CHECK(false, ValueError, "ddp_scaling_bench: unknown argument ", arg,
                 "; usage: ddp_scaling_bench [--width W] [--batch B] [--steps S] [--rounds R] "
                 "[--warmup N] [--bucket-mib M]");
  }
  LOOM_CHECK(o.width >= 1 && o.batch >= 1 && o.steps >= 1 && o.rounds >= 1 && o.warmup >= 0 &&
                 o.bucket_mib >= 0,
             ValueError,
             "ddp_scaling_bench: --width, --batch, --steps and --rounds must be >= 1, --warmup "
             "and --bucket-mib >= 0; got width=",
             o.width, " batch=", o.batch, " steps=", o.steps, " rounds=", o.rounds,
             " warmup=", o.warmup, " bucket-mib=", o.bucket_mib);
  return o;
}

// ---------------------------------------------------------------- a worker (one rank)

// What rank 0 writes: per timed step "step <ms> <overlap> <after_ms>", then "buckets <bytes>..."
// and "carrier <the group's backend and transport>".
// An independent worker writes the same to <result>.<rank>, with no buckets.
int run_worker(const Options& o) {
  loom::set_num_threads(1);
  dist::Environment env = dist::environment_from_env();
  std::string result = o.result;
  if (o.independent) {
    result += "." + std::to_string(env.rank);
    env.rank = 0;
    env.world_size = 1;
  }
  std::shared_ptr<dist::ProcessGroup> group;
  if (env.world_size > 1) {
    auto store = dist::rendezvous(env, std::chrono::minutes(2));
    group = dist::make_gloo_process_group(store, env.rank, env.world_size);
  }

  loom::manual_seed(0);
  auto model = loom::nn::resnet18({.width = o.width, .in_channels = 3, .num_classes = 10});
  model->train();
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  dist::DDPOptions ddp_options;
  if (o.bucket_mib > 0) ddp_options.bucket_bytes = static_cast<int64_t>(o.bucket_mib * 1048576);
  if (group) ddp = std::make_shared<dist::DistributedDataParallel>(model, group, ddp_options);
  loom::nn::Module& net = ddp ? static_cast<loom::nn::Module&>(*ddp) : *model;
  loom::optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});

  loom::manual_seed(1000 + env.rank);  // each rank its own share of the batch
  const loom::Tensor x = loom::randn({o.batch, 3, 32, 32});
  const loom::Tensor y = loom::randint(0, 10, {o.batch});

  std::ofstream out;
  if (env.rank == 0) {
    out.open(result);
    LOOM_CHECK(out.good(), ValueError, "ddp_scaling_bench: cannot write ", result);
  }
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const auto start = Clock::now();
    // Zeroed in place: the gradients stay views into DDP's bucket buffers (no copy per step).
    opt.zero_grad(/*set_to_none=*/false);
    loom::Tensor loss = loom::cross_entropy(net.forward(x), y);
    loss.backward();
    opt.step();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    LOOM_CHECK(std::isfinite(loss.item()), ValueError, "ddp_scaling_bench: the loss is ",
               loss.item(), " at step ", s);
    if (env.rank != 0 || s < o.warmup) continue;
    double overlap = 0, after_ms = 0;
    if (ddp) {
      const dist::ReducerTimeline& t = ddp->reducer().timeline();
      overlap = t.overlap();
      for (const double done : t.completed)
        after_ms = std::max(after_ms, 1e3 * (done - t.backward_seconds));
    }
    out << "step " << ms << " " << overlap << " " << after_ms << "\n";
  }
  if (env.rank == 0) {
    out << "buckets";
    if (ddp)
      for (const dist::Bucket& b : ddp->reducer().buckets()) out << " " << b.bytes();
    out << "\n";
    if (group) out << "carrier " << group->carrier() << "\n";
    out.close();
    LOOM_CHECK(out.good(), ValueError, "ddp_scaling_bench: cannot write ", result);
  }
  if (group) group->barrier()->wait();  // rank 0 serves the store: it leaves last
  return 0;
}

// ---------------------------------------------------------------- the launching process

// One job's results, as rank 0 saw them.
struct Run {
  std::vector<double> step_ms, overlap, after_ms;
  std::vector<int64_t> bucket_bytes;
  std::string carrier;  // "gloo over tcp"
};

Run read_run(const std::string& path) {
  Run run;
  std::ifstream in(path);
  for (std::string tag; in >> tag;) {
    if (tag == "step") {
      double ms = 0, overlap = 0, after = 0;
      in >> ms >> overlap >> after;
      run.step_ms.push_back(ms);
      run.overlap.push_back(overlap);
      run.after_ms.push_back(after);
    } else if (tag == "buckets") {
      std::string rest;
      std::getline(in, rest);
      std::istringstream bytes(rest);
      for (int64_t b; bytes >> b;) run.bucket_bytes.push_back(b);
    } else if (tag == "carrier") {
      std::getline(in >> std::ws, run.carrier);
    }
  }
  return run;
}

int run_launcher(const Options& o, int argc, char** argv) {
  const ResultFile result("ddp_scaling_bench");
  const std::string path = result.path;
  std::vector<std::string> command = {dist::current_executable()};
  for (int i = 1; i < argc; ++i) command.push_back(argv[i]);
  command = dist::strip_flag(command, "--rounds", /*has_value=*/true);
  command.insert(command.end(), {"--worker", "--result", path});

  // One job of `world` ranks, or `world` independent 1-rank jobs at once; the results of each
  // job (rank 0's, or each independent worker's), or a failure status.
  auto run_job = [&](int world, bool independent, std::vector<Run>& runs, double& other_cores) {
    dist::LaunchOptions launch;
    launch.nproc_per_node = world;
    launch.master_port = 0;
    launch.grace = std::chrono::milliseconds(2000);
    launch.extra_env = {{"OMP_NUM_THREADS", "1"}};
    std::vector<std::string> job = command;
    if (independent) job.push_back("--independent");
    const char* what = independent ? "independent" : "rank";
    const ForeignLoad others;
    const int status = launch_quietly(launch, job);
    other_cores = others.cores();
    if (status != 0) {
      std::fprintf(stderr, "ddp_scaling_bench: the %d-%s run failed (status %d)\n", world, what,
                   status);
      return status;
    }
    runs.clear();
    for (int r = 0; r < (independent ? world : 1); ++r) {
      const std::string file = independent ? path + "." + std::to_string(r) : path;
      runs.push_back(read_run(file));
      if (independent) std::remove(file.c_str());
      if (runs.back().step_ms.size() != static_cast<size_t>(o.steps)) {
        std::fprintf(stderr, "ddp_scaling_bench: the %d-%s run wrote %zu of %d steps\n", world,
                     what, runs.back().step_ms.size(), o.steps);
        return 1;
      }
    }
    return 0;
  };

  loom::bench::print_machine();
  std::printf(
      "ResNet-18 (CIFAR stem, width %lld), batch %lld per rank, 1 thread per rank, float32, SGD "
      "momentum 0.9; median of %d steps (after %d warm-up) per run, %d rounds\n\n",
      static_cast<long long>(o.width), static_cast<long long>(o.batch), o.steps, o.warmup,
      o.rounds);
  std::printf(
      "| round | 1 rank: step ms | images/s | 2 independent: images/s | ideal | 2 ranks (DDP): "
      "step ms | images/s | speed-up | of ideal | overlap | comm after backward ms | others' "
      "load, cores (1 / independent / DDP) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<double> single_ms, double_ms, pair_ips, ideals, speedups, of_ideal, overlaps, afters;
  std::vector<double> quiet_speedups;  // rounds in which other processes kept < kQuiet cores busy
  constexpr double kQuiet = 0.25;
  std::vector<int64_t> buckets;
  std::string carrier;
  for (int round = 1; round <= o.rounds; ++round) {
    std::vector<Run> one, pair, two;
    double others1 = 0, others_pair = 0, others2 = 0;
    if (const int status = run_job(1, false, one, others1)) return status;
    if (const int status = run_job(2, true, pair, others_pair)) return status;
    if (const int status = run_job(2, false, two, others2)) return status;
    const double t1 = median(one[0].step_ms), t2 = median(two[0].step_ms);
    const double ips1 = o.batch / (t1 / 1e3), ips2 = 2 * o.batch / (t2 / 1e3);
    double ips_pair = 0;
    for (const Run& job : pair) ips_pair += o.batch / (median(job.step_ms) / 1e3);
    single_ms.push_back(t1);
    double_ms.push_back(t2);
    pair_ips.push_back(ips_pair);
    ideals.push_back(ips_pair / ips1);
    speedups.push_back(ips2 / ips1);
    of_ideal.push_back(ips2 / ips_pair);
    if (std::max({others1, others_pair, others2}) < kQuiet) quiet_speedups.push_back(ips2 / ips1);
    overlaps.push_back(median(two[0].overlap));
    afters.push_back(median(two[0].after_ms));
    buckets = two[0].bucket_bytes;
    carrier = two[0].carrier;
    std::printf(
        "| %d | %.0f | %.1f | %.1f | %.2f | %.0f | %.1f | %.2f | %.2f | %.2f | %.1f | %.2f / %.2f "
        "/ %.2f |\n",
        round, t1, ips1, ips_pair, ideals.back(), t2, ips2, speedups.back(), of_ideal.back(),
        overlaps.back(), afters.back(), others1, others_pair, others2);
    std::fflush(stdout);
  }
  const double t1 = median(single_ms), t2 = median(double_ms);
  std::printf(
      "| median | %.0f | %.1f | %.1f | %.2f | %.0f | %.1f | **%.2f** | %.2f | %.2f | %.1f | |\n",
      t1, o.batch / (t1 / 1e3), median(pair_ips), median(ideals), t2, 2 * o.batch / (t2 / 1e3),
      median(speedups), median(of_ideal), median(overlaps), median(afters));
  if (quiet_speedups.empty())
    std::printf("\nno quiet round (other processes below %.2f cores in all three runs)\n", kQuiet);
  else
    std::printf("\nspeed-up over the %zu quiet rounds (other processes below %.2f cores): %.2f\n",
                quiet_speedups.size(), kQuiet, median(quiet_speedups));

  int64_t total = 0;
  std::string sizes;
  for (const int64_t b : buckets) {
    total += b;
    char text[32];
    std::snprintf(text, sizeof text, "%s%.2f", sizes.empty() ? "" : ", ", b / 1048576.0);
    sizes += text;
  }
  std::printf(
      "speed-up = 2-rank images/s / 1-rank images/s (median of the per-round ratios; target >= "
      "1.85); ideal = two independent 1-rank jobs' images/s added up / 1-rank images/s, what "
      "sharing the machine leaves; of ideal = DDP's images/s / the independent jobs'; overlap = "
      "share of the allreduce time spent while backward still ran; "
      "others' load = cores kept busy by other processes during the run (of %ld here; the "
      "2-rank job needs 2)\n"
      "DDP: %zu buckets (%s MiB), %.1f MiB of float32 gradients per step, %s\n",
      sysconf(_SC_NPROCESSORS_ONLN), buckets.size(), sizes.c_str(), total / 1048576.0,
      carrier.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return loom::bench::run_bench(argc, argv, parse, run_worker, run_launcher);
}
