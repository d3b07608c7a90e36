// autograd/ops.h — loom's differentiable operations, the functions users call
// (loom::matmul, loom::conv2d, ...). Each family has a header and a source file in ops/, with
// every backward written right below its forward.
#pragma once

#include "autograd/ops/attention.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/norm.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/view.h"
