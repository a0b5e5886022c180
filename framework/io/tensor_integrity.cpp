#include "framework/io/tensor_integrity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "framework/io/file_io.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"

// Header-only xxHash: nothing to link, so the installed package and the GPU carry need no libxxhash.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace cpf::io {
namespace {

// Stored tensors are read in chunks of this many bytes (a multiple of every element size).
constexpr uint64_t kChunkBytes = 4u << 20;

std::string hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

// The value of element i of a host buffer as a double (only called for floating dtypes).
double element_as_double(DType dtype, const void* data, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::f64: return static_cast<const double*>(data)[i];
    case DType::bf16: return static_cast<float>(static_cast<const bfloat16*>(data)[i]);
    default: return 0;
  }
}

// Counts the non-finite elements of a host buffer; `first` gets the index of the first one (or -1).
int64_t count_non_finite(DType dtype, const void* data, int64_t numel, int64_t* first) {
  int64_t count = 0;
  *first = -1;
  auto note = [&](bool bad, int64_t i) {
    if (!bad) return;
    if (count++ == 0) *first = i;
  };
  switch (dtype) {
    case DType::f32: {
      const auto* p = static_cast<const float*>(data);
      for (int64_t i = 0; i < numel; ++i) note(!std::isfinite(p[i]), i);
      break;
    }
    case DType::f64: {
      const auto* p = static_cast<const double*>(data);
      for (int64_t i = 0; i < numel; ++i) note(!std::isfinite(p[i]), i);
      break;
    }
    case DType::bf16: {
      // Exponent bits all ones: inf or NaN (the same test as for the float it widens to).
      const auto* p = static_cast<const uint16_t*>(data);
      for (int64_t i = 0; i < numel; ++i) note((p[i] & 0x7f80u) == 0x7f80u, i);
      break;
    }
    default: break;  // integers and bool are always finite
  }
  return count;
}

std::string value_str(double v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

}  // namespace

std::string tensor_checksum(const void* data, size_t nbytes) { return hex64(XXH3_64bits(data, nbytes)); }

std::string NonFiniteValue::describe() const {
  std::ostringstream os;
  os << "tensor '" << tensor << "' holds " << count << " non-finite value" << (count == 1 ? "" : "s") << " (the first, "
     << value_str(value) << ", at element " << index << ")";
  return os.str();
}

std::optional<NonFiniteValue> find_non_finite(const std::string& name, DType dtype, const void* data, int64_t numel) {
  int64_t first = -1;
  const int64_t count = count_non_finite(dtype, data, numel, &first);
  if (count == 0) return std::nullopt;
  return NonFiniteValue{name, first, element_as_double(dtype, data, first), count};
}

std::optional<NonFiniteValue> find_non_finite(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) continue;
    if (!t.device().is_cpu()) {
      // x * 0 is 0 for every finite x and NaN for NaN and +-inf: one reduction on the device says
      // whether this tensor needs the host copy that locates the value.
      const double probe = raw::sum(raw::mul(t, 0.0)).item<double>();
      if (!std::isnan(probe)) continue;
    }
    const Tensor host = raw::contiguous(raw::to(t, Device::cpu()));
    if (auto bad = find_non_finite(name, host.dtype(), host.raw_data(), host.numel())) return bad;
  }
  return std::nullopt;
}

StoredTensorCheck check_stored_tensor(const FileReader& reader, uint64_t offset, uint64_t nbytes,
                                      const std::string& name, DType dtype) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  const uint64_t element = dtype_size(dtype);
  std::vector<unsigned char> buffer(static_cast<size_t>(std::min(nbytes, kChunkBytes)));
  StoredTensorCheck out;
  for (uint64_t done = 0; done < nbytes;) {
    const uint64_t n = std::min(kChunkBytes, nbytes - done);
    reader.read_at(offset + done, buffer.data(), static_cast<size_t>(n));
    XXH3_64bits_update(&state, buffer.data(), static_cast<size_t>(n));
    int64_t first = -1;
    const int64_t count = count_non_finite(dtype, buffer.data(), static_cast<int64_t>(n / element), &first);
    if (count > 0) {
      if (!out.non_finite) {
        const int64_t index = static_cast<int64_t>(done / element) + first;
        out.non_finite = NonFiniteValue{name, index, element_as_double(dtype, buffer.data(), first), 0};
      }
      out.non_finite->count += count;
    }
    done += n;
  }
  out.checksum = hex64(XXH3_64bits_digest(&state));
  return out;
}

}  // namespace cpf::io
