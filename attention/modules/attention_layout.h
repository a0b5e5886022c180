#pragma once
// Deprecated path, kept for one release (0.1; removed in 0.2): the attention modules moved to
// attention/nn/ so that their folder names their namespace, cpf::nn.
#pragma message("attention/modules/attention_layout.h is deprecated: include attention/nn/attention_layout.h")
#include "attention/nn/attention_layout.h"
