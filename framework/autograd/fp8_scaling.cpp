#include "framework/autograd/fp8_scaling.h"

#include <algorithm>
#include <bit>
#include <cmath>
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

// One line of the text: "<key> settled|fresh" then, per role, the scale and `length` history entries.
struct ParsedSlot {
  std::string key;
  bool settled = false;
  std::array<float, 3> scale{};
  std::array<std::vector<float>, 3> history;
};

ParsedSlot parse_slot(const std::string& line, int64_t length) {
  std::istringstream words(line);
  ParsedSlot p;
  std::string status;
  words >> p.key >> status;
  CPF_CHECK(!p.key.empty() && (status == "settled" || status == "fresh"), "Fp8ScalingState::restore: the line '",
            line.substr(0, 80), "' does not start with '<key> settled|fresh'");
  p.settled = status == "settled";
  for (int64_t role = 0; role < 3; ++role) {
    p.scale[role] = parse_bits(words, p.key);
    CPF_CHECK(std::isfinite(p.scale[role]) && p.scale[role] > 0, "Fp8ScalingState::restore: slot '", p.key,
              "' has the scale ", p.scale[role], " (scales are finite and > 0)");
    for (int64_t h = 0; h < length; ++h) {
      p.history[role].push_back(parse_bits(words, p.key));
      CPF_CHECK(std::isfinite(p.history[role].back()) && p.history[role].back() >= 0,
                "Fp8ScalingState::restore: slot '", p.key, "' has the amax ", p.history[role].back(),
                " (amaxes are finite and >= 0)");
    }
  }
  std::string extra;
  CPF_CHECK(!(words >> extra), "Fp8ScalingState::restore: slot '", p.key, "' has more than 3 x (1 + ", length,
            ") values (the extra '", extra, "')");
  return p;
}

}  // namespace

void validate(const Fp8ScalingOptions& o) {
  CPF_CHECK(o.margin >= 0 && o.margin <= 64, "fp8: margin must be in [0, 64], got ", o.margin);
  CPF_CHECK(o.amax_history >= 1 && o.amax_history <= 4096, "fp8: amax_history must be in [1, 4096], got ",
            o.amax_history);
  CPF_CHECK(o.bf16_first_blocks >= 0 && o.bf16_last_blocks >= 0, "fp8: bf16_first_blocks and bf16_last_blocks ",
            "must be >= 0, got ", o.bf16_first_blocks, " and ", o.bf16_last_blocks);
}

Fp8ScalingState::Fp8ScalingState(Fp8ScalingOptions options, Device device) : options_(options), device_(device) {
  validate(options_);
  clipped_ = zeros({}, {.dtype = DType::f32, .device = device_});
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

double Fp8ScalingState::keys_fingerprint() const {
  uint64_t h = 1469598103934665603ull;
  for (const std::string& key : keys_) {
    for (const unsigned char c : key + '\n') {
      h ^= c;
      h *= 1099511628211ull;
    }
  }
  return static_cast<double>(h >> 12);  // 52 bits
}

void Fp8ScalingState::update(const Tensor& skip_if_nonfinite) {
  for (const Buffer& b : buffers_) {
    raw::fp8_update_scales(b.history, b.amax, b.scale, b.fp8_max, options_.margin, options_.amax_compute,
                           skip_if_nonfinite, clipped_);
  }
  settled_ = static_cast<int64_t>(keys_.size());
}

int64_t Fp8ScalingState::take_clipped() {
  const float count = raw::to(clipped_, Device::cpu()).to_vector<float>()[0];
  raw::zero_(clipped_);
  return static_cast<int64_t>(count);
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
    out << keys_[i] << (static_cast<int64_t>(i) < settled_ ? " settled" : " fresh");
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
  std::string line;
  long long slots = -1, length = -1;
  std::getline(in, line);
  CPF_CHECK(std::sscanf(line.c_str(), "fp8_scaling_v1 slots=%lld history=%lld", &slots, &length) == 2 && slots >= 0 &&
                length >= 1 && length <= 4096,
            "Fp8ScalingState::restore: the text starts with '", line, "', not '", kFormat, " slots=N history=L'");
  // Everything parsed and checked before the first slot is made: a bad text leaves the state empty.
  std::vector<ParsedSlot> parsed;
  for (long long i = 0; i < slots; ++i) {
    CPF_CHECK(std::getline(in, line), "Fp8ScalingState::restore: ", slots, " slots announced, ", i, " found");
    parsed.push_back(parse_slot(line, length));
    const ParsedSlot& p = parsed.back();
    for (long long j = 0; j < i; ++j) {
      CPF_CHECK(parsed[j].key != p.key, "Fp8ScalingState::restore: slot ", i, " has the repeated key '", p.key, "'");
    }
    CPF_CHECK(!p.settled || i == 0 || parsed[i - 1].settled, "Fp8ScalingState::restore: slot '", p.key,
              "' is settled but follows a fresh one (slots settle in the order they were made)");
  }
  while (std::getline(in, line)) {
    CPF_CHECK(line.empty(), "Fp8ScalingState::restore: a line after the ", slots, " slots: '", line, "'");
  }
  for (const ParsedSlot& p : parsed) slot(p.key);
  std::vector<std::vector<float>> scale(buffers_.size(), std::vector<float>(3 * kSlots, 1.0f));
  std::vector<std::vector<float>> history(buffers_.size(), std::vector<float>(3 * kSlots * options_.amax_history));
  settled_ = 0;
  for (size_t i = 0; i < parsed.size(); ++i) {
    for (int64_t role = 0; role < 3; ++role) {
      const int64_t e = 3 * (static_cast<int64_t>(i) % kSlots) + role;
      scale[i / kSlots][e] = parsed[i].scale[role];
      const std::vector<float>& h = parsed[i].history[role];  // newest first: a shorter history keeps the newest
      std::copy_n(h.begin(), std::min<int64_t>(options_.amax_history, static_cast<int64_t>(h.size())),
                  history[i / kSlots].begin() + e * options_.amax_history);
    }
    if (parsed[i].settled) settled_ = static_cast<int64_t>(i) + 1;
  }
  for (size_t b = 0; b < buffers_.size(); ++b) {
    raw::copy_(buffers_[b].scale, raw::to(from_vector(scale[b], {3 * kSlots}), device_));
    raw::copy_(buffers_[b].history, raw::to(from_vector(history[b], {3 * kSlots, options_.amax_history}), device_));
  }
}

}  // namespace cpf
