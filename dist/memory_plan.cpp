// dist/memory_plan.cpp — Note [Model-state arithmetic].

#include "dist/memory_plan.h"

#include "tensor/error.h"

namespace loom::dist {

ModelStateBytes model_state_bytes(int stage, const ModelStateShape& shape) {
  LOOM_CHECK(stage >= 0 && stage <= 3, ValueError, "model_state_bytes: stage ", stage,
             ": the strategies are 0 (DDP), 1, 2 and 3 (ZeRO)");
  LOOM_CHECK(
      shape.world >= 1 && shape.params >= 0 && shape.weight_bytes > 0 && shape.state_bytes >= 0,
      ValueError, "model_state_bytes: got ", shape.params, " parameters, world ", shape.world, ", ",
      shape.weight_bytes, " bytes a weight, ", shape.state_bytes, " of optimizer state");
  const double psi = static_cast<double>(shape.params), n = shape.world;
  const double w = shape.weight_bytes * psi, k = shape.state_bytes * psi;
  ModelStateBytes bytes;
  bytes.weights = stage == 3 ? w / n : w;
  bytes.gradients = stage >= 2 ? w / n : w;
  bytes.optimizer_state = stage >= 1 ? k / n : k;
  return bytes;
}

int optimizer_state_bytes(const std::string& optimizer, bool momentum, bool master_copy) {
  const bool adam = optimizer == "adam" || optimizer == "adamw";
  LOOM_CHECK(adam || optimizer == "sgd", ValueError, "optimizer_state_bytes: unknown optimizer '",
             optimizer, "' (sgd, adam or adamw)");
  const int k = adam ? 8 : (momentum ? 4 : 0);
  return k + (master_copy ? 4 : 0);
}

std::string strategy_name(int stage) {
  LOOM_CHECK(stage >= 0 && stage <= 3, ValueError, "strategy_name: stage ", stage,
             ": the strategies are 0 (DDP), 1, 2 and 3 (ZeRO)");
  return stage == 0 ? "DDP" : "ZeRO-" + std::to_string(stage);
}

}  // namespace loom::dist
