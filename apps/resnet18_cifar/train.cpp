// apps/resnet18_cifar/train.cpp — datasets and the training loop of resnet18_cifar.
//
// One optimizer step: zero_grad, forward, cross-entropy, backward, SGD step, schedule step.
// Every epoch ends with an evaluation on the test split (eval mode: batch norm's running
// statistics), a summary line, a JSON line (--log-json) and a checkpoint (--checkpoint-dir).
// Resuming restores the weights, optimizer, schedule, generator, epoch and step, and the loader
// skips the batches already trained: the data order and augmentation are functions of (seed,
// epoch, sample index), so the resumed run sees exactly the batches the uninterrupted one did.

#include "train.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/cifar10.h"
#include "data/idx.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "loom.h"
#include "optim/checkpoint.h"
#include "optim/schedule.h"
#include "optim/sgd.h"

namespace resnet18_cifar {

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string floats_json(const std::vector<float>& v) {
  nlohmann::json j = nlohmann::json::array();
  for (float x : v) j.push_back(x);
  return j.dump();
}

std::string duration_str(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buf;
}

// The progress bar of a terminal: redrawn in place, at most ten times a second.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void update(int epoch, int64_t done, int64_t total, double loss, double acc, double ips,
              double eta) {
    if (!enabled_ || (seconds_since(last_) < 0.1 && done < total)) return;
    last_ = Clock::now();
    constexpr int kWidth = 24;
    const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
    std::printf("\r\033[Kepoch %d [%s] %lld/%lld  loss %.4f  acc %.2f%%  %.0f img/s  left %s",
                epoch, bar.c_str(), static_cast<long long>(done), static_cast<long long>(total),
                loss, 100 * acc, ips, duration_str(eta).c_str());
    std::fflush(stdout);
  }
  void clear() {
    if (enabled_) std::printf("\r\033[K");
  }

 private:
  bool enabled_;
  Clock::time_point last_{};
};

struct Evaluation {
  double loss = 0, accuracy = 0;
};

Evaluation evaluate(nn::Module& model, data::DataLoader& loader) {
  model.eval();
  NoGradGuard no_grad;
  double loss_sum = 0, correct = 0;
  int64_t seen = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    const Tensor logits = model.forward(batch->images);
    const int64_t n = batch->labels.size(0);
    loss_sum += cross_entropy(logits, batch->labels).item() * static_cast<double>(n);
    correct += sum(argmax(logits, 1) == batch->labels).item();
    seen += n;
  }
  model.train();
  return {seen ? loss_sum / seen : 0.0, seen ? correct / seen : 0.0};
}

std::unique_ptr<optim::LRSchedule> make_schedule(const Options& o, optim::Optimizer& opt,
                                                 int64_t total_steps) {
  if (o.schedule == "onecycle") return std::make_unique<optim::OneCycleLR>(opt, o.lr, total_steps);
  if (o.schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(opt, total_steps);
  // "step": x0.1 at half and at three quarters of the run.
  return std::make_unique<optim::MultiStepLR>(
      opt, std::vector<int64_t>{total_steps / 2, total_steps * 3 / 4}, 0.1);
}

}  // namespace

Data load_data(const Options& o) {
  using namespace loom::data;
  Data d;
  if (o.dataset == "cifar10") {
    const std::string dir = o.data_dir.empty() ? "cifar-10-batches-bin" : o.data_dir;
    d.mean = {0.4914f, 0.4822f, 0.4465f};
    d.std = {0.2470f, 0.2435f, 0.2616f};
    d.train = {
        std::make_shared<Cifar10>(dir, true),
        compose(RandomCrop(32, 4), RandomHorizontalFlip(), ToFloat(), Normalize(d.mean, d.std))};
    d.test = {std::make_shared<Cifar10>(dir, false), compose(ToFloat(), Normalize(d.mean, d.std))};
    d.description = "CIFAR-10 from " + dir;
  } else if (o.dataset == "fashion-mnist") {
    const std::string dir =
        o.data_dir.empty() ? "/usr/share/datasets/fashion-mnist" : o.data_dir;  // Debian's place
    d.mean = {0.2860f};
    d.std = {0.3530f};
    // Padded with black to 32 x 32, then flipped; normalised with Fashion-MNIST's statistics.
    d.train = {
        std::make_shared<FashionMnist>(dir, true),
        compose(Pad::to(32, 32), RandomHorizontalFlip(), ToFloat(), Normalize(d.mean, d.std))};
    d.test = {std::make_shared<FashionMnist>(dir, false),
              compose(Pad::to(32, 32), ToFloat(), Normalize(d.mean, d.std))};
    d.description = "Fashion-MNIST from " + dir;
  } else {
    LOOM_CHECK(o.dataset == "synthetic", ValueError, "unknown dataset '", o.dataset,
               "' (cifar10, fashion-mnist or synthetic)");
    d.mean = {0.5f, 0.5f, 0.5f};
    d.std = {0.29f, 0.29f, 0.29f};
    const int64_t n_test = std::max<int64_t>(1, o.synthetic_size / 5);
    d.train = {
        std::make_shared<Synthetic>(o.synthetic_size, Shape{3, 32, 32}, 10, o.seed),
        compose(RandomCrop(32, 4), RandomHorizontalFlip(), ToFloat(), Normalize(d.mean, d.std))};
    d.test = {std::make_shared<Synthetic>(n_test, Shape{3, 32, 32}, 10, o.seed + 1),
              compose(ToFloat(), Normalize(d.mean, d.std))};
    d.description = "synthetic random images";
  }
  d.description += " (" + std::to_string(d.train.dataset->size()) + " train, " +
                   std::to_string(d.test.dataset->size()) + " test)";
  return d;
}

double run(const Options& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  manual_seed(o.seed);
  const bool tty = isatty(STDOUT_FILENO) != 0;

  const Data data = load_data(o);
  const Shape image = data.train.transforms.output_shape(data.train.dataset->image_shape());
  auto model = nn::resnet18({.width = o.width,
                             .in_channels = image[0],
                             .num_classes = data.train.dataset->num_classes()});

  data::LoaderOptions train_options{
      .batch_size = o.batch_size, .shuffle = true, .seed = o.seed, .num_workers = o.workers};
  // A last batch of one sample cannot be batch-normalised in training: drop it in that case.
  train_options.drop_last = data.train.dataset->size() % o.batch_size == 1;
  data::DataLoader train_loader(data.train.dataset, data.train.transforms, train_options);
  data::DataLoader test_loader(data.test.dataset, data.test.transforms,
                               {.batch_size = std::max<int64_t>(o.batch_size, 256),
                                .shuffle = false,
                                .seed = o.seed,
                                .num_workers = o.workers});
  const int64_t steps_per_epoch = train_loader.batches_per_epoch();
  const int64_t total_steps = std::max<int64_t>(1, steps_per_epoch * o.epochs);

  optim::SGD optimizer(
      model->parameters(),
      {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay, .nesterov = o.nesterov});
  auto schedule = make_schedule(o, optimizer, total_steps);

  optim::TrainingProgress progress;
  if (!o.resume.empty()) {
    progress = o.eval_only ? optim::load_checkpoint(o.resume, *model)
                           : optim::load_checkpoint(o.resume, *model, &optimizer, schedule.get());
    std::printf("resumed from %s: %lld epochs and %lld steps done\n", o.resume.c_str(),
                static_cast<long long>(progress.epoch), static_cast<long long>(progress.step));
  }

  std::printf("resnet18_cifar: ResNet-18 width %lld (%lld parameters), %s\n",
              static_cast<long long>(o.width), static_cast<long long>(model->num_parameters()),
              data.description.c_str());
  std::FILE* log = nullptr;
  if (!o.log_json.empty()) {
    log = std::fopen(o.log_json.c_str(), o.resume.empty() ? "w" : "a");
    LOOM_CHECK(log != nullptr, IOError, "cannot open the JSON log ", o.log_json);
  }
  auto log_line = [&](const nlohmann::json& j) {
    if (!log) return;
    std::fprintf(log, "%s\n", j.dump().c_str());
    std::fflush(log);
  };

  if (o.eval_only) {
    const Evaluation test = evaluate(*model, test_loader);
    std::printf("test loss %.4f  test accuracy %.2f%%\n", test.loss, 100 * test.accuracy);
    log_line({{"epoch", progress.epoch}, {"test_loss", test.loss}, {"test_acc", test.accuracy}});
    if (log) std::fclose(log);
    return test.accuracy;
  }

  std::printf(
      "batch %lld, %d threads, %d loader workers; SGD lr %g momentum %g%s weight decay "
      "%g, schedule %s; %lld steps per epoch\n",
      static_cast<long long>(o.batch_size), get_num_threads(), o.workers, o.lr, o.momentum,
      o.nesterov ? " (nesterov)" : "", o.weight_decay, o.schedule.c_str(),
      static_cast<long long>(steps_per_epoch));

  const optim::Metadata info = {{"model", model->name()},
                                {"width", std::to_string(o.width)},
                                {"in_channels", std::to_string(image[0])},
                                {"num_classes", std::to_string(data.train.dataset->num_classes())},
                                {"dataset", o.dataset},
                                {"mean", floats_json(data.mean)},
                                {"std", floats_json(data.std)}};
  auto checkpoint = [&](const std::string& name) {
    if (o.checkpoint_dir.empty()) return;
    std::filesystem::create_directories(o.checkpoint_dir);
    const std::string path = (std::filesystem::path(o.checkpoint_dir) / name).string();
    optim::save_checkpoint(path, *model, optimizer, schedule.get(), progress, info);
  };

  ProgressBar bar(tty);
  Evaluation test;
  bool stopped = false, evaluated = false;
  for (int64_t epoch = progress.epoch; epoch < o.epochs && !stopped; ++epoch) {
    if (o.max_steps >= 0 && progress.step >= o.max_steps) break;
    const auto epoch_start = Clock::now();
    const int64_t skip = progress.batch;
    train_loader.start_epoch(epoch, skip);
    model->train();
    double loss_sum = 0, correct = 0, train_seconds = 0, first_step_seconds = 0;
    int64_t seen = 0, first_step_images = 0, trained = 0;
    while (auto batch = train_loader.next()) {
      if (o.max_steps >= 0 && progress.step >= o.max_steps) {
        stopped = true;
        break;
      }
      const auto step_start = Clock::now();
      optimizer.zero_grad();
      const Tensor logits = model->forward(batch->images);
      Tensor loss = cross_entropy(logits, batch->labels);
      loss.backward();
      optimizer.step();
      schedule->step();
      const int64_t n = batch->labels.size(0);
      {
        NoGradGuard no_grad;
        loss_sum += loss.item() * static_cast<double>(n);
        correct += sum(argmax(logits, 1) == batch->labels).item();
      }
      const double step_seconds = seconds_since(step_start);
      if (trained == 0) {
        first_step_seconds = step_seconds;
        first_step_images = n;
      }
      train_seconds += step_seconds;
      seen += n;
      ++trained;
      ++progress.step;
      progress.batch = skip + trained;
      const double ips = trained > 1 ? (seen - first_step_images) /
                                           std::max(1e-9, train_seconds - first_step_seconds)
                                     : n / std::max(1e-9, step_seconds);
      const double eta = (steps_per_epoch - progress.batch) * train_seconds / trained;
      bar.update(static_cast<int>(epoch + 1), progress.batch, steps_per_epoch, loss_sum / seen,
                 correct / seen, ips, eta);
    }
    bar.clear();
    const double images_per_s =
        trained > 1 ? (seen - first_step_images) / (train_seconds - first_step_seconds)
                    : (trained == 1 ? seen / train_seconds : 0.0);
    if (!stopped) {
      progress.epoch = epoch + 1;
      progress.batch = 0;
    }
    test = evaluate(*model, test_loader);
    evaluated = true;
    const double seconds = seconds_since(epoch_start);
    const double train_loss = seen ? loss_sum / seen : 0.0, train_acc = seen ? correct / seen : 0.0;
    std::printf(
        "epoch %lld/%d  train loss %.4f  acc %.2f%%  test loss %.4f  acc %.2f%%  "
        "%.0f img/s  data wait %.1f s  %.1f s%s\n",
        static_cast<long long>(epoch + 1), o.epochs, train_loss, 100 * train_acc, test.loss,
        100 * test.accuracy, images_per_s, train_loader.wait_seconds(), seconds,
        stopped ? "  (stopped by --max-steps)" : "");
    std::fflush(stdout);
    log_line({{"epoch", epoch + 1},
              {"train_loss", train_loss},
              {"train_acc", train_acc},
              {"test_loss", test.loss},
              {"test_acc", test.accuracy},
              {"images_per_s", images_per_s},
              {"seconds", seconds},
              {"steps", progress.step},
              {"complete", !stopped}});
    if (!stopped) {
      char name[48];
      std::snprintf(name, sizeof name, "epoch-%03lld.safetensors",
                    static_cast<long long>(epoch + 1));
      checkpoint(name);
    }
  }
  if (!evaluated) test = evaluate(*model, test_loader);  // nothing left to train
  checkpoint("last.safetensors");
  if (log) std::fclose(log);
  std::printf("test accuracy %.2f%%\n", 100 * test.accuracy);
  return test.accuracy;
}

}  // namespace resnet18_cifar
