#pragma once
// Deprecated path, kept for one release (0.1; removed in 0.2): the attention modules moved to
// attention/nn/ so that their folder names their namespace, cpf::nn.
#pragma message( \
    "attention/modules/multi_head_latent_attention.h is deprecated: include attention/nn/multi_head_latent_attention.h")
#include "attention/nn/multi_head_latent_attention.h"
