// The attention backend names (config key attention.backend, environment CPF_ATTENTION_BACKEND) and
// the device-kernel registry (attention/attention_backend.h). No GPU needed.
#include <gtest/gtest.h>

#include "attention/attention_backend.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

TEST(AttentionBackend, NamesRoundTrip) {
  for (AttentionBackend b : {AttentionBackend::automatic, AttentionBackend::cudnn, AttentionBackend::unfused}) {
    EXPECT_EQ(parse_attention_backend(attention_backend_name(b)), b);
  }
  EXPECT_EQ(attention_backend_name(AttentionBackend::automatic), "auto");
  EXPECT_EQ(attention_backend_name(AttentionBackend::cudnn), "cudnn");
  EXPECT_EQ(attention_backend_name(AttentionBackend::unfused), "unfused");
}

TEST(AttentionBackend, UnknownNameListsTheValidOnes) {
  EXPECT_CPF_ERROR(parse_attention_backend("flash"), "unknown attention backend 'flash' (valid: auto, cudnn, unfused)");
  EXPECT_CPF_ERROR(parse_attention_backend("automatic"), "unknown attention backend 'automatic'");
  EXPECT_CPF_ERROR(parse_attention_backend(""), "unknown attention backend ''");
}

TEST(AttentionBackend, RegistryRejectsHalfAKernelTable) {
  raw::DeviceAttentionKernels half;
  EXPECT_CPF_ERROR(raw::register_device_attention(DeviceType::cuda, half),
                   "register_device_attention: forward and backward must both be set");
}

}  // namespace
}  // namespace cpf
