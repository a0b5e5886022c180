#pragma once
// Integrity of tensor data: per-tensor checksums that catch a flipped bit in a stored file, and the
// search for non-finite values (NaN, +-inf) that must never reach a checkpoint or a generated text.
//
//   std::string sum = tensor_checksum(host.raw_data(), nbytes);        // "9f1c0a..." (16 hex digits)
//   if (auto bad = find_non_finite(model.named_parameters())) CPF_FAIL(bad->describe());
//
// The checksum is XXH3-64 (xxHash, Debian package libxxhash-dev, used header-only so nothing extra is
// linked) over the tensor's bytes exactly as stored: row-major, little-endian.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::io {

class FileReader;

// The name meta.json records for the algorithm below.
inline constexpr const char* kChecksumAlgorithm = "xxh3-64";

// XXH3-64 of `nbytes` bytes as 16 lower-case hex digits.
std::string tensor_checksum(const void* data, size_t nbytes);

// The first non-finite element of a tensor, and how many there are.
struct NonFiniteValue {
  std::string tensor;  // its name
  int64_t index = 0;   // row-major element index of the first one
  double value = 0;    // nan, inf or -inf
  int64_t count = 0;   // non-finite elements in the tensor
  // "tensor 'fc1.weight' holds 3 non-finite values (the first, nan, at element 17 of 12)"
  std::string describe() const;
};

// Scans `numel` elements of `dtype` at `data` (host memory). Integer and bool dtypes are always finite.
std::optional<NonFiniteValue> find_non_finite(const std::string& name, DType dtype, const void* data, int64_t numel);

// The first tensor of `tensors` holding a non-finite value, on any device (device tensors are reduced
// there; only one found bad is copied to the host to locate the value). nullopt when all are finite.
std::optional<NonFiniteValue> find_non_finite(const std::vector<std::pair<std::string, Tensor>>& tensors);
inline bool all_finite(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  return !find_non_finite(tensors).has_value();
}

// What reading one stored tensor found: its checksum and the first non-finite value, if any.
struct StoredTensorCheck {
  std::string checksum;
  std::optional<NonFiniteValue> non_finite;
};

// Reads `nbytes` at `offset` of `reader` in bounded chunks (a multi-GB tensor needs no big buffer),
// computing the checksum and looking for non-finite values of `dtype`.
StoredTensorCheck check_stored_tensor(const FileReader& reader, uint64_t offset, uint64_t nbytes,
                                      const std::string& name, DType dtype);

}  // namespace cpf::io
