// The names that moved with #31's re-layout stay usable for one release: the old header paths
// (attention/modules/*.h forward to attention/nn/*.h) and the old namespaces (cpf::data for
// cpf::models::data, cpf::attention_modules for the attention helpers in cpf::nn) name the same entities.
#include <gtest/gtest.h>

#include <type_traits>

#include "attention/modules/attention_layout.h"
#include "attention/modules/kv_cache.h"
#include "attention/modules/multi_head_attention.h"
#include "attention/modules/multi_head_latent_attention.h"
#include "attention/modules/rope_positions_cache.h"
#include "attention/nn/multi_head_attention.h"
#include "models/data/cp_shard.h"
#include "models/data/data_loader.h"

namespace cpf {
namespace {

TEST(DeprecatedNames, OldDataNamespaceNamesTheSameTypesAndFunctions) {
  static_assert(std::is_same_v<data::Batch, models::data::Batch>);
  static_assert(std::is_same_v<data::DataLoader, models::data::DataLoader>);
  EXPECT_EQ(&data::shard_for_rank, &models::data::shard_for_rank);
}

TEST(DeprecatedNames, OldAttentionHelpersNamespaceIsTheNnNamespace) {
  EXPECT_EQ(&attention_modules::check_hidden, &nn::check_hidden);
  static_assert(std::is_same_v<attention_modules::MultiHeadAttention, nn::MultiHeadAttention>);
}

TEST(DeprecatedNames, OldHeaderPathsDeclareTheModules) {
  static_assert(std::is_class_v<nn::MultiHeadAttention>);
  static_assert(std::is_class_v<nn::MultiHeadLatentAttention>);
  static_assert(std::is_class_v<nn::KVCache>);
}

}  // namespace
}  // namespace cpf
