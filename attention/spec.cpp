#include "attention/spec.h"

#include <array>
#include <cmath>
#include <sstream>
#include <utility>

#include "framework/core/error.h"

namespace cpf {
namespace {

constexpr std::array<std::pair<std::string_view, QkvFormat>, 3> kFormats{{
    {"bshd", QkvFormat::bshd},
    {"sbhd", QkvFormat::sbhd},
    {"thd", QkvFormat::thd},
}};

constexpr std::array<std::pair<std::string_view, MaskType>, 4> kMasks{{
    {"no_mask", MaskType::no_mask},
    {"causal", MaskType::causal},
    {"padding", MaskType::padding},
    {"padding_causal", MaskType::padding_causal},
}};

template <class Enum, size_t N>
std::string_view name_of(const std::array<std::pair<std::string_view, Enum>, N>& table, Enum value, const char* what) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  CPF_FAIL(what, ": unknown value ", static_cast<int>(value));
}

template <class Enum, size_t N>
Enum parse(const std::array<std::pair<std::string_view, Enum>, N>& table, std::string_view text, const char* key) {
  std::string valid;
  for (const auto& [name, v] : table) {
    if (name == text) return v;
    valid += (valid.empty() ? "" : ", ") + std::string(name);
  }
  CPF_FAIL("unknown ", key, " '", std::string(text), "' (valid: ", valid, ")");
}

}  // namespace

std::string_view qkv_format_name(QkvFormat format) { return name_of(kFormats, format, "qkv_format"); }
std::string_view mask_type_name(MaskType mask) { return name_of(kMasks, mask, "mask"); }
QkvFormat parse_qkv_format(std::string_view name) { return parse(kFormats, name, "qkv_format"); }
MaskType parse_mask_type(std::string_view name) { return parse(kMasks, name, "mask"); }

std::string AttentionSpec::str() const {
  std::ostringstream os;
  os << "qkv_format: " << qkv_format_name(qkv_format) << ", mask: " << mask_type_name(mask) << ", window: ["
     << window.left << ", " << window.right << "]";
  if (softmax_scale) os << ", softmax_scale: " << *softmax_scale;
  if (num_heads) os << ", num_heads: " << num_heads;
  if (num_kv_heads) os << ", num_kv_heads: " << num_kv_heads;
  if (head_dim_qk) os << ", head_dim_qk: " << head_dim_qk;
  if (head_dim_v) os << ", head_dim_v: " << head_dim_v;
  if (sink.defined()) os << ", sink: (" << sink.size(0) << ")";
  return os.str();
}

void check_spec(const AttentionSpec& spec) {
  const AttentionWindow& w = spec.window;
  CPF_CHECK(w.left >= -1 && w.right >= -1, "attention: window entries must be >= -1 (-1 = unbounded): window=[", w.left,
            ", ", w.right, "]");
  CPF_CHECK(!is_causal(spec.mask) || w.right <= 0, "attention: mask ", mask_type_name(spec.mask),
            " sees no keys after the query, so the window must have right = 0 or -1: window=[", w.left, ", ", w.right,
            "]");
  CPF_CHECK(spec.num_heads >= 0 && spec.num_kv_heads >= 0 && spec.head_dim_qk >= 0 && spec.head_dim_v >= 0,
            "attention: head counts and dims must be >= 0 (0 = from the tensors): num_heads=", spec.num_heads,
            " num_kv_heads=", spec.num_kv_heads, " head_dim_qk=", spec.head_dim_qk, " head_dim_v=", spec.head_dim_v);
  CPF_CHECK(spec.num_heads == 0 || spec.num_kv_heads == 0 || spec.num_heads % spec.num_kv_heads == 0,
            "attention: num_heads must be a multiple of num_kv_heads: num_heads=", spec.num_heads,
            " num_kv_heads=", spec.num_kv_heads);
  CPF_CHECK(!spec.softmax_scale || std::isfinite(*spec.softmax_scale),
            "attention: softmax_scale must be finite: softmax_scale=", spec.softmax_scale.value_or(0.0));
}

AttentionWindow effective_window(const AttentionSpec& spec) {
  check_spec(spec);
  AttentionWindow w = spec.window;
  if (is_causal(spec.mask)) w.right = 0;
  return w;
}

double softmax_scale(const AttentionSpec& spec, int64_t head_dim_qk) {
  if (spec.softmax_scale) return *spec.softmax_scale;
  CPF_CHECK(head_dim_qk > 0, "attention: the default softmax_scale needs head_dim_qk > 0: head_dim_qk=", head_dim_qk);
  return 1.0 / std::sqrt(static_cast<double>(head_dim_qk));
}

}  // namespace cpf
