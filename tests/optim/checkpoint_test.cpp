// tests/optim/checkpoint_test.cpp — training checkpoints (Note [Checkpoint layout]): a run saved
// and resumed takes the same steps, loss for loss, as the run that never stopped; the file holds
// what a reader needs; checkpoints that do not fit are refused with the reason.

#include "optim/checkpoint.h"

#include <cstdio>
#include <filesystem>

#include "optim/sgd.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace loom::optim {
namespace {

// A small conv net with batch norm and dropout (so that buffers and the generator matter),
// trained with SGD + nesterov + weight decay under a one-cycle schedule.
struct TrainingRun {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<SGD> opt;
  std::unique_ptr<OneCycleLR> schedule;
  int64_t steps = 0;

  explicit TrainingRun(uint64_t seed) {
    manual_seed(seed);
    model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        nn::make<nn::Conv2d>(1, 4, 3), nn::make<nn::BatchNorm2d>(4), nn::make<nn::ReLU>(),
        nn::make<nn::Flatten>(), nn::make<nn::Dropout>(0.2), nn::make<nn::Linear>(4 * 4 * 4, 3)});
    opt = std::make_unique<SGD>(
        model->parameters(),
        SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
    schedule = std::make_unique<OneCycleLR>(*opt, 0.5, 12);
  }

  // The batch of step s is a function of s alone (like the loader's (seed, epoch, index)).
  double step() {
    Generator data(1000 + static_cast<uint64_t>(steps));
    const Generator::State saved = default_generator().state();
    default_generator().set_state(data.state());
    const Tensor x = randn({8, 1, 6, 6});
    const Tensor y = randint(0, 3, {8});
    default_generator().set_state(saved);
    opt->zero_grad();
    Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    opt->step();
    schedule->step();
    ++steps;
    return loss.item();
  }
};

TEST(Checkpoint, ResumingGivesTheSameLossesStepForStep) {
  std::vector<double> straight;
  {
    TrainingRun run(7);
    for (int i = 0; i < 10; ++i) straight.push_back(run.step());
  }
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("resume.safetensors");
  std::vector<double> resumed;
  {
    TrainingRun first(7);
    for (int i = 0; i < 4; ++i) resumed.push_back(first.step());
    save_checkpoint(path, *first.model, *first.opt, first.schedule.get(),
                    {.epoch = 0, .step = first.steps, .batch = 4}, {{"model", "tiny"}});
  }
  {
    TrainingRun second(
        99);  // other initial weights and generator state: all must come from the file
    const TrainingProgress p =
        load_checkpoint(path, *second.model, second.opt.get(), second.schedule.get());
    EXPECT_EQ(p.step, 4);
    EXPECT_EQ(p.batch, 4);
    EXPECT_EQ(p.epoch, 0);
    second.steps = p.step;
    for (int i = 4; i < 10; ++i) resumed.push_back(second.step());
  }
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i;
}

TEST(Checkpoint, TheFileIsAStateDictWithMetadata) {
  TrainingRun run(1);
  run.step();
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("layout.safetensors");
  save_checkpoint(path, *run.model, *run.opt, run.schedule.get(), {.epoch = 3, .step = 1},
                  {{"model", "tiny"}, {"mean", "[0.5]"}});
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_EQ(file.metadata.at("model"), "tiny");
  EXPECT_EQ(file.metadata.at("mean"), "[0.5]");
  EXPECT_EQ(file.metadata.at("loom.epoch"), "3");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.metadata.at("optimizer.optimizer"), "SGD");
  EXPECT_TRUE(file.contains("0.weight"));  // the model under its own key names
  EXPECT_TRUE(file.contains("1.running_var"));
  EXPECT_TRUE(file.contains("optimizer.state.0.momentum_buffer"));
  EXPECT_TRUE(test::tensors_close(file.at("0.weight"), run.model->state_dict()[0].second, 0, 0));
}

TEST(Checkpoint, ACheckpointOfAnotherModelIsRefused) {
  TrainingRun run(1);
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("other.safetensors");
  save_checkpoint(path, *run.model, *run.opt, nullptr, {});
  nn::Sequential other{nn::make<nn::Linear>(2, 2)};
  EXPECT_LOOM_ERROR(
      load_checkpoint(path, other), ValueError,
      {"load_state_dict", "unexpected keys", "1.running_mean", "shape mismatches", "0.weight"});
  // A plain weights file (no loom.* metadata) is not a training checkpoint.
  save_safetensors(path, run.model->state_dict());
  EXPECT_LOOM_ERROR(load_checkpoint(path, *run.model), ValueError,
                    {"loom.epoch", "not a loom training checkpoint"});
  std::remove(path.c_str());
  EXPECT_THROW(load_checkpoint(path, *run.model), IOError);
}

TEST(Checkpoint, MalformedNumbersAreRefusedBeforeTheModelChanges) {
  TrainingRun run(1);
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("malformed.safetensors");
  save_checkpoint(path, *run.model, *run.opt, nullptr, {});
  const SafetensorsFile good = load_safetensors(path);
  auto save_with = [&](const std::string& key, const std::string& value) {
    Metadata meta = good.metadata;
    meta[key] = value;
    save_safetensors(path, good.tensors, meta);
  };
  TrainingRun other(2);
  NamedTensors before = other.model->state_dict();
  for (auto& [name, t] : before) t = t.clone();
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"loom.step", "12x"},
           {"loom.epoch", ""},
           {"generator.seed", "-1"},
           {"generator.offset", "99999999999999999999999"}}) {
    save_with(key, value);
    EXPECT_LOOM_ERROR(load_checkpoint(path, *other.model, other.opt.get()), ValueError,
                      {"load_checkpoint", key, "'" + value + "'"});
    save_with(key, good.metadata.at(key));
  }
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(test::tensors_close(other.model->state_dict()[i].second, before[i].second, 0, 0));
  EXPECT_NO_THROW(load_checkpoint(path, *other.model, other.opt.get()));
}

}  // namespace
}  // namespace loom::optim
