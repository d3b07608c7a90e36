// loom.h — everything a program needs from loom, in one include: #include <loom/loom.h>
#pragma once

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/gradcheck.h"
#include "autograd/graph.h"
#include "autograd/ops.h"
#include "nn/nn.h"
#include "tensor/cpu_info.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/memory_limit.h"
#include "tensor/parallel.h"
#include "tensor/random.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"
