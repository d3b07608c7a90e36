// dist/doctor.cpp — loomrun --doctor: the launch with doctor ranks, each rank's checks, and rank
// 0's report. See Note [The doctor] in dist/doctor.h.

#include "dist/doctor.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "data/sha256.h"
#include "dist/job.h"
#include "dist/nccl_process_group.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "tensor/accelerator.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace loom::dist {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The store's keys of the doctor's ranks, under "doctor/" of the round's store.
constexpr const char* kPrefix = "doctor";
// How long a rank waits for another's values or lines (a large --data takes a while to walk).
constexpr std::chrono::minutes kGatherTimeout{10};
constexpr size_t kFirstBytes = 4096;
constexpr size_t kMaxPublishedListing = 1 << 20;

std::string short_hash(const std::string& hash) { return hash.substr(0, 12); }

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string plural(int64_t n, const char* one, const char* many) {
  return detail::str(n, " ", n == 1 ? one : many);
}

// "3 files, 1234 bytes"
std::string count_text(int64_t files, int64_t bytes) {
  return plural(files, "file", "files") + ", " + plural(bytes, "byte", "bytes");
}

std::string errno_message(int err) { return std::strerror(err); }

DoctorCheck pass(std::string line) { return {true, std::move(line), ""}; }
DoctorCheck fail(std::string line, std::string fix) {
  return {false, std::move(line), std::move(fix)};
}

// Tabs and newlines would break the store's line format.
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\t', ' ');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// A rank's report as the store holds it: "node\tlocal_rank\n", then "ok\tline\tfix\n" per check.
std::string serialize(int node, int local_rank, const std::vector<DoctorCheck>& checks) {
  std::string out = detail::str(node, "\t", local_rank, "\n");
  for (const DoctorCheck& c : checks)
    out += detail::str(c.ok ? 1 : 0, "\t", one_line(c.line), "\t", one_line(c.fix), "\n");
  return out;
}

struct RankReport {
  int node = -1, local_rank = -1;
  std::vector<DoctorCheck> checks;
};

RankReport deserialize(const std::string& text) {
  RankReport report;
  std::istringstream in(text);
  std::string line;
  if (std::getline(in, line)) std::sscanf(line.c_str(), "%d\t%d", &report.node, &report.local_rank);
  while (std::getline(in, line)) {
    const size_t a = line.find('\t'), b = line.find('\t', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    report.checks.push_back(
        {line.substr(0, a) == "1", line.substr(a + 1, b - a - 1), line.substr(b + 1)});
  }
  return report;
}

// "--flag value" or "--flag=value": the last one's value, or `fallback`.
std::string flag_value(const std::vector<std::string>& args, const std::string& flag,
                       const std::string& fallback) {
  std::string value = fallback;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") break;
    if (args[i] == flag && i + 1 < args.size())
      value = args[i + 1];
    else if (args[i].starts_with(flag + "="))
      value = args[i].substr(flag.size() + 1);
  }
  return value;
}

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a == flag || a == flag + "=true" || a == flag + "=1") return true;
  }
  return false;
}

int to_int(const std::string& text, int fallback) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  return end != text.c_str() && *end == '\0' ? static_cast<int>(v) : fallback;
}

// The file of `program`'s arguments, written as execvp would find it.
bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The first line where two sorted listings differ, in words.
std::string first_difference(const std::string& here, const std::string& zero) {
  std::istringstream a(here), b(zero);
  std::string la, lb;
  bool more_a = static_cast<bool>(std::getline(a, la)),
       more_b = static_cast<bool>(std::getline(b, lb));
  const auto field = [](const std::string& line, int i) {
    size_t start = 0;
    for (int k = 0; k < i; ++k) start = line.find('\t', start) + 1;
    return line.substr(start, line.find('\t', start) - start);
  };
  while (more_a || more_b) {
    if (more_a && more_b && la == lb) {
      more_a = static_cast<bool>(std::getline(a, la));
      more_b = static_cast<bool>(std::getline(b, lb));
      continue;
    }
    if (more_a && more_b && field(la, 0) == field(lb, 0)) {
      if (field(la, 1) != field(lb, 1))
        return detail::str(field(la, 0), ": ", field(la, 1), " bytes here, ", field(lb, 1),
                           " on rank 0");
      return field(la, 0) + ": its first bytes differ";
    }
    if (!more_b || (more_a && field(la, 0) < field(lb, 0))) return field(la, 0) + " only here";
    return field(lb, 0) + " only on rank 0";
  }
  return "";
}

}  // namespace

std::string format_check(const DoctorCheck& check, const std::string& indent) {
  std::string out = indent + (check.ok ? "✓ " : "✗ ") + check.line;
  if (!check.ok && !check.fix.empty()) out += "\n" + indent + "    fix: " + check.fix;
  return out;
}

ProgramFlags parse_program_flags(const std::vector<std::string>& args) {
  ProgramFlags f;
  f.gpus = to_int(flag_value(args, "--gpus", "0"), 0);
  const std::string backend = flag_value(args, "--backend", "");
  f.backend = !backend.empty() ? backend : f.gpus > 0 ? "nccl" : "gloo";
  f.data = flag_value(args, "--data", "");
  f.checkpoint_dir = flag_value(args, "--checkpoint-dir", "");
  f.threads = to_int(flag_value(args, "--threads", "0"), 0);
  f.batch_size = flag_value(args, "--batch-size", "");
  f.lr = flag_value(args, "--lr", "");
  f.scale_lr = has_flag(args, "--scale-lr");
  return f;
}

// ---------------------------------------------------------------- devices

DoctorCheck check_devices(const ProgramFlags& flags, int node, int local_rank, int local_world_size,
                          int visible, const std::string& why_none) {
  if (flags.gpus == 0 && flags.backend != "nccl") return pass("devices: CPU training (no --gpus)");
  if (flags.gpus == 0)
    return fail("devices: --backend nccl without --gpus",
                "nccl runs on GPUs: give --gpus N, or use --backend gloo for CPU training");
  if (visible == 0)
    return fail(detail::str("devices: --gpus ", flags.gpus,
                            ", but no CUDA device is visible on node ", node, " (", why_none, ")"),
                "run on a host whose GPUs nvidia-smi lists and CUDA_VISIBLE_DEVICES does not hide, "
                "or leave out --gpus (and --backend nccl) to train on the CPU");
  std::string map;
  for (int r = 0; r < local_world_size; ++r)
    map += detail::str(r ? ", " : "", "LOCAL_RANK ", r, " -> cuda:", r % visible);
  if (flags.backend == "nccl" && local_world_size > visible)
    return fail(detail::str("devices: ", local_world_size, " local ranks would share ", visible,
                            " visible GPU(s) on node ", node, " under nccl: ", map),
                detail::str("nccl needs a GPU per local rank (else every rank runs out of memory "
                            "on cuda:0): start at most ",
                            visible,
                            " ranks on this host (--nproc-per-node), make more GPUs visible, or "
                            "use --backend gloo, which lets ranks share a GPU"));
  return pass(detail::str("devices: LOCAL_RANK ", local_rank, " -> cuda:", local_rank % visible,
                          " of ", visible, " visible on node ", node, " (", flags.backend, "; ",
                          map, ")"));
}

// ---------------------------------------------------------------- data

DataSummary summarize_data(const std::string& path) {
  DataSummary s;
  std::error_code ec;
  const fs::path root(path);
  if (!fs::exists(root, ec)) {
    s.error = detail::str(path, " does not exist (in ", fs::current_path(ec).string(), ")");
    return s;
  }
  std::vector<std::pair<std::string, fs::path>> files;  // relative name, path
  if (fs::is_regular_file(root, ec)) {
    files.emplace_back(root.filename().string(), root);
  } else {
    fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec),
        end;
    if (ec) {
      s.error = detail::str(path, ": ", ec.message());
      return s;
    }
    for (; it != end; it.increment(ec)) {
      if (ec) {
        s.error = detail::str(path, ": ", ec.message());
        return s;
      }
      if (it->is_regular_file(ec))
        files.emplace_back(it->path().lexically_relative(root).string(), it->path());
    }
  }
  std::sort(files.begin(), files.end());
  std::string buffer(kFirstBytes, '\0');
  for (const auto& [name, file] : files) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      s.error = detail::str(file.string(), ": ", errno_message(errno));
      return s;
    }
    struct stat st {};
    const ssize_t n = ::fstat(fd, &st) == 0 ? ::read(fd, buffer.data(), buffer.size()) : -1;
    const int err = errno;
    ::close(fd);
    if (n < 0) {
      s.error = detail::str(file.string(), ": ", errno_message(err));
      return s;
    }
    s.files += 1;
    s.bytes += st.st_size;
    s.listing += detail::str(name, "\t", st.st_size, "\t",
                             data::sha256_hex(std::string_view(buffer.data(), n)), "\n");
  }
  s.hash = data::sha256_hex(s.listing);
  return s;
}

DoctorCheck compare_data(const std::string& path, int node, const DataSummary& mine,
                         const DataSummary* zero) {
  if (!mine.error.empty())
    return fail(detail::str("data: --data ", path, " unreadable on node ", node, ": ", mine.error),
                "make it readable by this user on every host (ls -l); a relative --data is "
                "resolved in each host's loomrun working directory");
  const std::string counts = count_text(mine.files, mine.bytes);
  if (zero == nullptr)
    return pass(detail::str("data: --data ", path, " readable on node ", node, ": ", counts,
                            " (names, sizes and first bytes hash to ", short_hash(mine.hash),
                            "; the reference)"));
  if (!zero->error.empty())
    return pass(detail::str("data: --data ", path, " readable on node ", node, ": ", counts,
                            "; rank 0 cannot read its copy, so nothing to compare"));
  if (mine.hash == zero->hash)
    return pass(
        detail::str("data: --data ", path, " on node ", node, " the same as rank 0's: ", counts));
  std::string where;
  if (!zero->listing.empty()) where = first_difference(mine.listing, zero->listing);
  return fail(detail::str("data: --data ", path, " on node ", node, " differs from rank 0's: ",
                          counts, " here, ", count_text(zero->files, zero->bytes), " on rank 0",
                          where.empty() ? "" : " (first difference: " + where + ")"),
              "give every host the same copy (rsync -a --delete from node 0, or storage every "
              "host mounts): ranks that load other data train a wrong model without any error");
}

// ---------------------------------------------------------------- checkpoint directory

DoctorCheck check_checkpoint_dir(const std::string& dir, int node, int rank) {
  const std::string fix = detail::str(
      "choose a --checkpoint-dir this user can create and write on every host (mkdir -p ", dir,
      "; chown or chmod it); with --max-restarts, one that every host mounts");
  const std::string where = detail::str(" on node ", node, " (rank ", rank, ")");
  std::error_code ec;
  // Made here, not by another rank of this host that was quicker.
  const bool created = !fs::is_directory(dir, ec) && fs::create_directories(dir, ec);
  if (ec)
    return fail(detail::str("checkpoint dir: cannot create ", dir, where, ": ", ec.message()), fix);
  const std::string base = detail::str(dir, "/.loom-doctor-", rank, "-", ::getpid());
  const std::string temporary = base + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return fail(
        detail::str("checkpoint dir: cannot write in ", dir, where, ": ", errno_message(errno)),
        fix);
  const char text[] = "loomrun --doctor\n";
  const bool written = ::write(fd, text, sizeof text - 1) == sizeof text - 1;
  const int write_errno = errno;
  ::close(fd);
  if (!written) {
    ::unlink(temporary.c_str());
    return fail(detail::str("checkpoint dir: cannot write in ", dir, where, ": ",
                            errno_message(write_errno)),
                fix);
  }
  if (::rename(temporary.c_str(), base.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    return fail(detail::str("checkpoint dir: cannot rename a file in ", dir, where, ": ",
                            errno_message(err)),
                fix);
  }
  ::unlink(base.c_str());
  return pass(
      detail::str("checkpoint dir: ", dir, " writable", where, created ? " (created)" : ""));
}

// ---------------------------------------------------------------- build

std::string resolve_program(const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : "";
  const char* env = std::getenv("PATH");
  std::istringstream path(env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(path, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
  }
  return "";
}

BuildSummary summarize_build(const std::string& program) {
  BuildSummary b;
  b.path = resolve_program(program);
  if (b.path.empty()) {
    b.error = program.find('/') != std::string::npos
                  ? "not an executable file (in " + fs::current_path().string() + ")"
                  : "not found on PATH";
    return b;
  }
  try {
    std::error_code ec;
    b.bytes = static_cast<int64_t>(fs::file_size(b.path, ec));
    b.hash = data::sha256_file_hex(b.path);
  } catch (const Error& e) {
    b.error = e.what();
  }
  return b;
}

DoctorCheck compare_build(const std::string& program, int node, const BuildSummary& mine,
                          const BuildSummary* zero) {
  if (!mine.error.empty())
    return fail(detail::str("build: ", program, " on node ", node, ": ", mine.error),
                "install the program on every host at the same path (a relative path is "
                "resolved in each host's loomrun working directory)");
  const std::string what = detail::str(mine.path == program ? "" : mine.path + ", ", mine.bytes,
                                       " bytes, sha256 ", short_hash(mine.hash));
  if (zero == nullptr)
    return pass(detail::str("build: ", program, " on node ", node, ": ", what, " (the reference)"));
  if (!zero->error.empty())
    return pass(detail::str("build: ", program, " on node ", node, ": ", what,
                            "; rank 0 has none to compare"));
  if (mine.hash == zero->hash)
    return pass(detail::str("build: ", program, " on node ", node, " the same as rank 0's (sha256 ",
                            short_hash(mine.hash), ")"));
  return fail(
      detail::str("build: ", program, " on node ", node, " differs from rank 0's: ", what,
                  " here; ", zero->bytes, " bytes, sha256 ", short_hash(zero->hash), " on rank 0"),
      "run one build everywhere: copy node 0's binary to every host (rsync), or build "
      "every host from the same commit with the same flags, or run it from storage "
      "every host mounts");
}

// ---------------------------------------------------------------- threads

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

DoctorCheck check_threads(int threads, const std::string& source, int local_world_size, int cores,
                          int node) {
  const int total = threads * local_world_size;
  const std::string line = detail::str("threads: ", threads, " (", source, ") x ",
                                       plural(local_world_size, "local rank", "local ranks"), " = ",
                                       total, total <= cores ? " <= " : " > ",
                                       plural(cores, "core", "cores"), " usable on node ", node);
  if (total <= cores) return pass(line);
  return fail(line + ": oversubscribed cores make every step wait on the slowest thread",
              detail::str("use --threads ", std::max(1, cores / local_world_size),
                          " (cores / local ranks) or fewer ranks per host (--nproc-per-node); "
                          "without --threads loomrun gives each rank cores / nproc-per-node "
                          "(OMP_NUM_THREADS)"));
}

// ---------------------------------------------------------------- the LR rule

DoctorCheck lr_rule(const ProgramFlags& f, int world) {
  std::string line = "global batch = ";
  char* end = nullptr;
  const long batch = std::strtol(f.batch_size.c_str(), &end, 10);
  if (!f.batch_size.empty() && end != f.batch_size.c_str() && *end == '\0')
    line += detail::str("--batch-size ", f.batch_size, " x ", plural(world, "rank", "ranks"), " = ",
                        batch * world);
  else
    line += detail::str("the program's default --batch-size x ", plural(world, "rank", "ranks"));
  const double lr = std::strtod(f.lr.c_str(), &end);
  const bool numeric = !f.lr.empty() && end != f.lr.c_str() && *end == '\0';
  char scaled[64] = "";
  if (numeric) std::snprintf(scaled, sizeof scaled, "%g", lr * world);
  const std::string lr_text = f.lr.empty() ? "the program's default lr" : "lr " + f.lr;
  const std::string product =
      numeric ? detail::str(f.lr, " x ", world, " = ", scaled) : detail::str("lr x ", world);
  if (f.scale_lr)
    line += detail::str("; ", lr_text, " (--scale-lr: ", product,
                        ", the linear scaling rule; without it the per-rank lr is used as is)");
  else
    line +=
        detail::str("; ", lr_text, " used as is on every rank (--scale-lr would make it ", product,
                    ", the linear scaling rule for a global batch ", world, " times a rank's)");
  return pass(line);
}

// ---------------------------------------------------------------- a failed launch

DoctorCheck launch_failure(const LaunchOptions& o, const std::string& what) {
  const std::string port = std::to_string(o.master_port);
  if (what.find("already in use") != std::string::npos)
    return fail("MASTER_PORT " + port + " free on the master host: it is in use",
                "a process from an earlier run may still hold it: find it with `ss -ltnp "
                "'sport = :" +
                    port + "'` (or `fuser " + port +
                    "/tcp`) and stop it, or choose another --master-port");
  if (what.find("not an address of this machine") != std::string::npos)
    return fail("MASTER_ADDR " + o.master_addr + " an address of node 0: " + what,
                "give --master-addr an address of node 0 that every host reaches, or "
                "--store-bind-all");
  if (o.node_rank != 0)
    return fail(detail::str("store at ", o.master_addr, ":", port, " reachable from node ",
                            o.node_rank, ": ", what),
                "start node 0's loomrun too; open port " + port +
                    " on node 0's firewall; --master-addr must be an address of node 0 that "
                    "every host reaches (not 127.0.0.1 with several hosts), and every node needs "
                    "the same LOOM_JOB_SECRET and --rdzv-id");
  return fail(detail::str("launch on node ", o.node_rank, ": ", what),
              "see the message; loomrun --help lists the launch flags");
}

// ---------------------------------------------------------------- a rank's checks

namespace {

// The allreduce of ones through the job's backend: the sum must be the world size.
DoctorCheck check_collective(const std::shared_ptr<Store>& store, int rank, int world, int node,
                             bool nccl, int device) {
  const std::string backend = nccl ? "nccl" : "gloo";
  const auto start = Clock::now();
  try {
    ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(30);
    auto group_store = std::make_shared<PrefixStore>("collective", store);
    std::shared_ptr<ProcessGroup> group =
        nccl ? make_nccl_process_group(group_store, rank, world, options, device)
             : make_gloo_process_group(group_store, rank, world, options);
    const double made_ms = milliseconds_since(start);
    const Device where = nccl ? Device{DeviceType::CUDA, device} : kCPU;
    Tensor t = ones({1024}, kFloat32, where);
    const auto reduce_start = Clock::now();
    group->allreduce(t)->wait();
    const Tensor sum = t.to(kCPU).contiguous();
    const double reduce_ms = milliseconds_since(reduce_start);
    const float* values = static_cast<const float*>(sum.data());
    for (int64_t i = 0; i < sum.numel(); ++i)
      if (values[i] != static_cast<float>(world))
        return fail(detail::str("allreduce over ", backend, " on node ", node, ": element ", i,
                                " sums to ", values[i], ", not the world size ", world),
                    "a bug or a broken transport: rerun with LOOM_CHECK_COLLECTIVES=1 and report "
                    "it");
    char timing[96];
    std::snprintf(timing, sizeof timing, "%.1f ms (the group made in %.0f ms)", reduce_ms, made_ms);
    // gloo says whether its ranks share memory here (Note [Shared-memory allreduce]), and why not.
    const std::string carrier = group->carrier();
    return pass(detail::str("allreduce over ", backend, ", ", plural(world, "rank", "ranks"),
                            ", on node ", node, ": ", timing,
                            carrier == backend ? "" : "; " + carrier));
  } catch (const Error& e) {
    return fail(detail::str("allreduce over ", backend, ", ", plural(world, "rank", "ranks"),
                            ", on node ", node, ": ", e.what()),
                nccl ? "NCCL_DEBUG=INFO says why; NCCL_SOCKET_IFNAME must name an interface "
                       "every host reaches, and the hosts must reach each other's ports"
                     : "gloo listens on the interface toward MASTER_ADDR, or on LOOM_GLOO_IFACE's "
                       "(LOOM_GLOO_HOST's): name an interface of this host that the other hosts "
                       "reach (ip -br addr), and let the hosts reach each other's ports "
                       "(firewall)");
  }
}

std::string get_string(Store& store, const std::string& key) {
  const Bytes value = store.get(key, kGatherTimeout);
  return std::string(value.begin(), value.end());
}

// DataSummary and BuildSummary through the store: "hash\tfiles\tbytes\terror\n" then the listing.
std::string pack_data(const DataSummary& s) {
  return detail::str(s.hash, "\t", s.files, "\t", s.bytes, "\t", one_line(s.error), "\n",
                     s.listing.size() <= kMaxPublishedListing ? s.listing : "");
}
DataSummary unpack_data(const std::string& text) {
  DataSummary s;
  const size_t newline = text.find('\n');
  std::istringstream head(text.substr(0, newline));
  std::string files, bytes;
  std::getline(head, s.hash, '\t');
  std::getline(head, files, '\t');
  std::getline(head, bytes, '\t');
  std::getline(head, s.error);
  s.files = std::atoll(files.c_str());
  s.bytes = std::atoll(bytes.c_str());
  if (newline != std::string::npos) s.listing = text.substr(newline + 1);
  return s;
}
std::string pack_build(const BuildSummary& b) {
  return detail::str(b.hash, "\t", b.bytes, "\t", one_line(b.path), "\t", one_line(b.error));
}
BuildSummary unpack_build(const std::string& text) {
  BuildSummary b;
  std::istringstream in(text);
  std::string bytes;
  std::getline(in, b.hash, '\t');
  std::getline(in, bytes, '\t');
  std::getline(in, b.path, '\t');
  std::getline(in, b.error);
  b.bytes = std::atoll(bytes.c_str());
  return b;
}

// Rank 0: every rank's lines, grouped by rank, and the summary; true when all passed.
bool print_report(Store& store, const Environment& env, int nnodes, std::string& summary) {
  int passed = 0, failed = 0;
  std::string out = detail::str("doctor: ", plural(env.world_size, "rank", "ranks"), " on ",
                                plural(nnodes, "node", "nodes"), ", master ", env.master_addr, ":",
                                env.master_port, "\n");
  const DoctorCheck port = pass(detail::str("MASTER_PORT ", env.master_port,
                                            " free on the master host (node 0's launcher serves "
                                            "the store there)"));
  out += format_check(port) + "\n";
  ++passed;
  for (int r = 0; r < env.world_size; ++r) {
    RankReport report;
    try {
      report = deserialize(get_string(store, detail::str("lines/", r)));
    } catch (const Error& e) {
      report.checks.push_back(fail(detail::str("rank ", r, " sent no report: ", e.what()),
                                   "see that node's loomrun output"));
    }
    out +=
        detail::str("node ", report.node, ", rank ", r, " (local rank ", report.local_rank, "):\n");
    for (const DoctorCheck& c : report.checks) {
      out += format_check(c, "  ") + "\n";
      ++(c.ok ? passed : failed);
    }
  }
  summary =
      detail::str("doctor: ", plural(passed, "check", "checks"), " passed, ", failed, " failed");
  out += summary + "\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  return failed == 0;
}

}  // namespace

int run_doctor_rank(const std::vector<std::string>& arguments) {
  std::vector<std::string> command = arguments;
  if (!command.empty() && command[0] == "--") command.erase(command.begin());
  if (command.empty() || !launched_by_launcher()) {
    std::fprintf(stderr, "loomrun --doctor-rank: runs under loomrun --doctor only\n");
    return 2;
  }
  Environment env;
  try {
    env = environment_from_env();
  } catch (const Error& e) {
    std::fprintf(stderr, "loomrun --doctor-rank: %s\n", e.what());
    return 2;
  }
  const char* group_rank = std::getenv("GROUP_RANK");
  const int node = group_rank != nullptr ? to_int(group_rank, 0) : env.rank / env.local_world_size;
  const int nnodes = env.world_size / env.local_world_size;
  const ProgramFlags flags =
      parse_program_flags(std::vector<std::string>(command.begin() + 1, command.end()));
  const std::string master = detail::str(env.master_addr, ":", env.master_port);

  std::vector<DoctorCheck> checks;
  std::shared_ptr<Store> root;
  try {
    root = rendezvous(env, std::chrono::seconds(60));
  } catch (const Error& e) {
    const DoctorCheck c =
        fail(detail::str("store at ", master, " reachable from node ", node, " (rank ", env.rank,
                         "): ", e.what()),
             "open its port on node 0's firewall; --master-addr must be an address of node 0 "
             "that every host reaches (not 127.0.0.1 with several hosts)");
    std::printf("%s\n", format_check(c, "").c_str());
    std::fflush(stdout);
    return 1;
  }
  checks.push_back(pass(detail::str("store at ", master, " reachable from node ", node)));
  auto store = std::make_shared<PrefixStore>(kPrefix, root);
  try {
    // 1. devices
    const int visible = cuda_device_count();
    const DoctorCheck devices = check_devices(flags, node, env.local_rank, env.local_world_size,
                                              visible, visible == 0 ? why_no_cuda_device() : "");
    checks.push_back(devices);

    // 2. a collective: nccl only where every rank has its GPU (a rank without one would leave
    // the others waiting for the communicator), gloo otherwise.
    bool nccl = false;
    if (flags.backend == "nccl") {
      store->set(detail::str("nccl_ready/", env.rank), devices.ok ? "1" : "0");
      nccl = true;
      for (int r = 0; r < env.world_size; ++r)
        nccl = get_string(*store, detail::str("nccl_ready/", r)) == "1" && nccl;
    }
    if (nccl) set_cuda_device(Device{DeviceType::CUDA, env.local_rank % visible});
    checks.push_back(check_collective(store, env.rank, env.world_size, node, nccl,
                                      nccl ? env.local_rank % visible : -1));

    // 3. data, against rank 0's
    if (!flags.data.empty()) {
      const DataSummary mine = summarize_data(flags.data);
      if (env.rank == 0) {
        store->set("data/0", pack_data(mine));
        checks.push_back(compare_data(flags.data, node, mine, nullptr));
      } else {
        const DataSummary zero = unpack_data(get_string(*store, "data/0"));
        checks.push_back(compare_data(flags.data, node, mine, &zero));
      }
    } else if (env.rank == 0) {
      checks.push_back(pass("data: no --data, the program's default (synthetic or downloaded)"));
    }

    // 4. the checkpoint directory
    if (!flags.checkpoint_dir.empty())
      checks.push_back(check_checkpoint_dir(flags.checkpoint_dir, node, env.rank));
    else if (env.rank == 0)
      checks.push_back(pass("checkpoint dir: no --checkpoint-dir, the program saves nothing"));

    // 5. one build, against rank 0's
    const BuildSummary build = summarize_build(command[0]);
    if (env.rank == 0) {
      store->set("build/0", pack_build(build));
      checks.push_back(compare_build(command[0], node, build, nullptr));
    } else {
      const BuildSummary zero = unpack_build(get_string(*store, "build/0"));
      checks.push_back(compare_build(command[0], node, build, &zero));
    }

    // 6. threads x local ranks, once per node
    if (env.local_rank == 0) {
      const int cores = usable_cores();
      const char* omp = std::getenv("OMP_NUM_THREADS");
      if (flags.threads > 0)
        checks.push_back(
            check_threads(flags.threads, "--threads", env.local_world_size, cores, node));
      else if (omp != nullptr && to_int(omp, 0) > 0)
        checks.push_back(
            check_threads(to_int(omp, 0), "OMP_NUM_THREADS", env.local_world_size, cores, node));
      else
        checks.push_back(check_threads(cores, "every core", env.local_world_size, cores, node));
    }

    // 7. the LR rule, once
    if (env.rank == 0) checks.push_back(lr_rule(flags, env.world_size));
  } catch (const Error& e) {
    checks.push_back(
        fail(detail::str("doctor on node ", node, " (rank ", env.rank, ") stopped: ", e.what()),
             "see the message"));
  }

  store->set(detail::str("lines/", env.rank), serialize(node, env.local_rank, checks));
  std::string verdict;
  if (env.rank == 0) {
    std::string summary;
    const bool ok = print_report(*store, env, nnodes, summary);
    verdict = (ok ? "pass\t" : "fail\t") + summary;
    store->set("verdict", verdict);
  }
  if (env.local_rank != 0) return 0;
  try {
    if (verdict.empty()) verdict = get_string(*store, "verdict");
  } catch (const Error& e) {
    verdict = detail::str("fail\tdoctor: no verdict from rank 0: ", e.what());
  }
  const size_t tab = verdict.find('\t');
  if (node != 0)
    std::printf("%s (node 0's loomrun prints every rank's checks)\n",
                verdict.substr(tab + 1).c_str());
  std::fflush(stdout);
  if (const char* result = std::getenv("LOOM_DOCTOR_RESULT")) {
    std::ofstream out(result);
    out << verdict.substr(0, tab) << "\n";
  }
  return 0;
}

// ---------------------------------------------------------------- loomrun --doctor

int run_doctor(const LaunchOptions& options, const std::vector<std::string>& command) {
  std::string result = (fs::temp_directory_path() / "loom_doctor_XXXXXX").string();
  const int fd = ::mkstemp(result.data());
  if (fd < 0) throw DistError("loomrun --doctor: mkstemp " + result + ": " + errno_message(errno));
  ::close(fd);
  struct Remove {
    std::string path;
    ~Remove() { ::unlink(path.c_str()); }
  } remove{result};

  LaunchOptions o = options;
  o.extra_env.emplace_back("LOOM_DOCTOR_RESULT", result);
  std::vector<std::string> doctor = {current_executable(), "--doctor-rank", "--"};
  doctor.insert(doctor.end(), command.begin(), command.end());
  int status = 0;
  try {
    status = launch(o, doctor);
  } catch (const ValueError&) {
    throw;  // a usage error: loomrun says so and exits 2
  } catch (const Error& e) {
    std::printf("%s\ndoctor: 0 checks passed, 1 failed\n",
                format_check(launch_failure(o, e.what()), "").c_str());
    std::fflush(stdout);
    return 1;
  }
  std::ifstream in(result);
  std::string verdict;
  std::getline(in, verdict);
  if (status != 0) {
    std::fprintf(stderr, "loomrun --doctor: a doctor rank ended with status %d (see above)\n",
                 status);
    return 1;
  }
  return verdict == "pass" ? 0 : 1;
}

}  // namespace loom::dist
