#include "framework/autograd/fp8_scaling.h"

#include <bit>
#include <cstdio>
#include <sstream>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

constexpr const char* kFormat = "fp8_scaling_v1";

DType format_of(int64_t role) {
  return role == static_cast<int64_t>(Fp8Role::grad_output) ? DType::f8e5m2 : DType::f8e4m3;
}

std::string hex_bits(float v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", std::bit_cast<uint32_t>(v));
  return buf;
}

float parse_bits(std::istringstream& in, const std::string& key) {
  std::string word;
  in >> word;
  CPF_CHECK(word.size() == 8 && word.find_first_not_of("0123456789abcdef") == std::string::npos,
            "Fp8ScalingState::restore: slot '", key, "' holds '", word, "' where an 8-digit hex float was expected");
  return std::bit_cast<float>(static_cast<uint32_t>(std::stoul(word, nullptr, 16)));
}

}  // namespace

void validate(const Fp8ScalingOptions& o) {
  CPF_CHECK(o.margin >= 0 && o.margin <= 64, "fp8: margin must be in [0, 64], got ", o.margin);
  CPF_CHECK(o.amax_history >= 1 && o.amax_history <= 1000000, "fp8: amax_history must be in [1, 1000000], got ",
            o.amax_history);
}

Fp8ScalingState::Fp8ScalingState(Fp8ScalingOptions options, Device device) : options_(options), device_(device) {
  validate(options_);
}

void Fp8ScalingState::add_buffer() {
  const int64_t entries = 3 * kSlots;
  const TensorOptions f32{.dtype = DType::f32, .device = device_};
  std::vector<float> max(entries);
  for (int64_t e = 0; e < entries; ++e) max[e] = static_cast<float>(raw::fp8_max(format_of(e % 3)));
  buffers_.push_back({zeros({entries, options_.amax_history}, f32), zeros({entries}, f32), full({entries}, 1.0, f32),
                      raw::to(from_vector(max, {entries}), device_)});
}

Fp8Slot Fp8ScalingState::view_of(int64_t index) const {
  const Buffer& b = buffers_[index / kSlots];
  const int64_t first = 3 * (index % kSlots);
  Fp8Slot s;
  for (int64_t role = 0; role < 3; ++role) {
    s.scale[role] = raw::select(b.scale, 0, first + role);
    s.amax[role] = raw::select(b.amax, 0, first + role);
  }
  s.fresh = index >= settled_;
  return s;
}

Fp8Slot Fp8ScalingState::slot(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    const auto index = static_cast<int64_t>(keys_.size());
    if (index % kSlots == 0) add_buffer();
    keys_.push_back(key);
    it = index_.emplace(key, index).first;
  }
  return view_of(it->second);
}

std::vector<Tensor> Fp8ScalingState::amax_buffers() const {
  std::vector<Tensor> out;
  for (const Buffer& b : buffers_) out.push_back(b.amax);
  return out;
}

void Fp8ScalingState::update(const Tensor& skip_if_nonfinite) {
  for (const Buffer& b : buffers_) {
    raw::fp8_update_scales(b.history, b.amax, b.scale, b.fp8_max, options_.margin, options_.amax_compute,
                           skip_if_nonfinite);
  }
  settled_ = static_cast<int64_t>(keys_.size());
}

std::string Fp8ScalingState::serialize() const {
  std::ostringstream out;
  out << kFormat << " slots=" << keys_.size() << " history=" << options_.amax_history << "\n";
  std::vector<std::vector<float>> scale, history;
  for (const Buffer& b : buffers_) {
    scale.push_back(raw::to(b.scale, Device::cpu()).to_vector<float>());
    history.push_back(raw::to(b.history, Device::cpu()).to_vector<float>());
  }
  for (size_t i = 0; i < keys_.size(); ++i) {
    out << keys_[i];
    for (int64_t role = 0; role < 3; ++role) {
      const int64_t e = 3 * (static_cast<int64_t>(i) % kSlots) + role;
      const size_t buffer = i / kSlots;
      out << ' ' << hex_bits(scale[buffer][e]);
      for (int64_t h = 0; h < options_.amax_history; ++h) {
        out << ' ' << hex_bits(history[buffer][e * options_.amax_history + h]);
      }
    }
    out << "\n";
  }
  return out.str();
}

void Fp8ScalingState::restore(const std::string& text) {
  CPF_CHECK(keys_.empty(), "Fp8ScalingState::restore: the state already has ", keys_.size(),
            " slots (restore into a new state, before the first step)");
  std::istringstream in(text);
  std::string format, line;
  long long slots = -1, length = -1;
  std::getline(in, line);
  CPF_CHECK(std::sscanf(line.c_str(), "fp8_scaling_v1 slots=%lld history=%lld", &slots, &length) == 2 && slots >= 0 &&
                length >= 1,
            "Fp8ScalingState::restore: the text starts with '", line, "', not '", kFormat, " slots=N history=L'");
  std::vector<std::vector<float>> scale, history;
  for (long long i = 0; i < slots; ++i) {
    CPF_CHECK(std::getline(in, line), "Fp8ScalingState::restore: ", slots, " slots announced, ", i, " found");
    std::istringstream words(line);
    std::string key;
    words >> key;
    CPF_CHECK(!key.empty() && !index_.contains(key), "Fp8ScalingState::restore: slot ", i, " has ",
              key.empty() ? "no key" : "the repeated key '" + key + "'");
    slot(key);
    if (buffers_.size() > scale.size()) {
      scale.emplace_back(3 * kSlots, 1.0f);
      history.emplace_back(3 * kSlots * options_.amax_history, 0.0f);
    }
    for (int64_t role = 0; role < 3; ++role) {
      const int64_t e = 3 * (i % kSlots) + role;
      scale.back()[e] = parse_bits(words, key);
      for (long long h = 0; h < length; ++h) {
        const float v = parse_bits(words, key);
        if (h < options_.amax_history) history.back()[e * options_.amax_history + h] = v;
      }
    }
  }
  for (size_t b = 0; b < buffers_.size(); ++b) {
    raw::copy_(buffers_[b].scale, raw::to(from_vector(scale[b], {3 * kSlots}), device_));
    raw::copy_(buffers_[b].history, raw::to(from_vector(history[b], {3 * kSlots, options_.amax_history}), device_));
  }
  settled_ = static_cast<int64_t>(keys_.size());
}

}  // namespace cpf
