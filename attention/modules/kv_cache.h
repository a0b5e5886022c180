#pragma once
// Deprecated path, kept for one release (0.1; removed in 0.2): the attention modules moved to
// attention/nn/ so that their folder names their namespace, cpf::nn.
#pragma message("attention/modules/kv_cache.h is deprecated: include attention/nn/kv_cache.h")
#include "attention/nn/kv_cache.h"
