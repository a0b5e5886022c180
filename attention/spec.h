#pragma once
// AttentionSpec: what one dot-product attention call computes. Its fields are the YAML keys of an
// attention config; the enums print and parse as the names used there ("padding_causal").
//
// The mask is defined by positions (docs/attention.md): a query at position i sees a key at
// position j iff both belong to the same sequence and i - left <= j <= i + right. left/right = -1
// is unbounded; a causal mask pins right to 0. `padding` masks take the real lengths from a
// SequenceInfo; thd always has one (its sequences are packed), so there `no_mask` and `padding` mean
// the same thing, as do `causal` and `padding_causal`.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "framework/tensor/tensor.h"

namespace cpf {

enum class QkvFormat : uint8_t {
  bshd,  // (batch, seq, heads, dim)
  sbhd,  // (seq, batch, heads, dim)
  thd,   // (tokens, heads, dim): variable-length sequences packed along tokens
};

enum class MaskType : uint8_t { no_mask, causal, padding, padding_causal };

struct AttentionWindow {
  int64_t left = -1;   // keys at most `left` positions before the query; -1 = unbounded
  int64_t right = -1;  // keys at most `right` positions after the query; -1 = unbounded
  friend bool operator==(const AttentionWindow&, const AttentionWindow&) = default;
};

struct AttentionSpec {
  QkvFormat qkv_format = QkvFormat::bshd;
  MaskType mask = MaskType::no_mask;
  AttentionWindow window;
  std::optional<double> softmax_scale;  // default 1/sqrt(head_dim_qk)
  // Shapes the caller expects; 0 = take them from the tensors. When set they must match the tensors.
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA/MQA: num_heads % num_kv_heads == 0)
  int64_t head_dim_qk = 0;   // Q and K head dim
  int64_t head_dim_v = 0;    // V and output head dim (MLA: may differ from head_dim_qk)
  // Attention sink (attention_sink.h): one learnable logit per query head, (num_heads) f32 (f64 for
  // f64 inputs), that joins every softmax denominator as a key with a zero value. Undefined = none.
  // Not a YAML key: the attention modules own the parameter (model.attention_sink).
  Tensor sink{};

  // "qkv_format: thd, mask: causal, window: [-1, 0], ..." for logs and error messages.
  std::string str() const;
};

std::string_view qkv_format_name(QkvFormat format);
std::string_view mask_type_name(MaskType mask);
// Throw on unknown names, listing the valid ones.
QkvFormat parse_qkv_format(std::string_view name);
MaskType parse_mask_type(std::string_view name);

inline bool is_causal(MaskType mask) { return mask == MaskType::causal || mask == MaskType::padding_causal; }
inline bool is_padding(MaskType mask) { return mask == MaskType::padding || mask == MaskType::padding_causal; }

// Throws when the options contradict each other: a window entry below -1, a causal mask with a
// window that looks ahead (right > 0), head counts that do not divide, a scale that is not finite.
void check_spec(const AttentionSpec& spec);

// The window the kernels apply: the spec's window with right = 0 under a causal mask. Checks the spec.
AttentionWindow effective_window(const AttentionSpec& spec);

// spec.softmax_scale, or 1/sqrt(head_dim_qk).
double softmax_scale(const AttentionSpec& spec, int64_t head_dim_qk);

}  // namespace cpf
