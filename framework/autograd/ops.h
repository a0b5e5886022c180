#pragma once
// The differentiable API in one include: everything a model needs from the autograd layer.
#include "framework/autograd/engine.h"
#include "framework/autograd/functions/elementwise.h"
#include "framework/autograd/functions/index.h"
#include "framework/autograd/functions/join.h"
#include "framework/autograd/functions/linalg.h"
#include "framework/autograd/functions/nn.h"
#include "framework/autograd/functions/reduce.h"
#include "framework/autograd/functions/shape.h"
#include "framework/autograd/functions/swiglu.h"
#include "framework/autograd/grad_mode.h"
#include "framework/tensor/random.h"
#include "framework/tensor/tensor.h"
