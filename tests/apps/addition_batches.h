#pragma once
// The trainer step tests' data: packed THD batches of the 1-3 digit addition task, 48 storage tokens per
// batch, pieces of at most 16 tokens, slots padded to a multiple of 4 (2 x cp for cp = 2), in a fixed
// order, so every test and rank reads the same batches.
#include "models/data/data_loader.h"

namespace cpf::testing {

inline models::data::DataOptions addition_batches() {
  models::data::DataOptions o;
  o.source = "synthetic";
  o.min_len = 1;
  o.max_len = 3;
  o.seq_len = 16;
  o.tokens_per_batch = 48;
  o.pad_multiple = 4;
  o.shuffle = false;
  return o;
}

}  // namespace cpf::testing
