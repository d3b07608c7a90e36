// nn/nn.h — the nn layer in one include: Module, layers, losses, init, ResNet, Transformer, GPT.
#pragma once

#include "nn/gpt.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/resnet.h"
#include "nn/transformer.h"
