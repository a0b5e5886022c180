#pragma once
// The safetensors format (https://github.com/huggingface/safetensors), read and written without
// Python:
//
//   [8 bytes]  N, unsigned little-endian: the header's length in bytes
//   [N bytes]  JSON object: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//              ..., "__metadata__": {"<key>": "<string value>"}}   (metadata optional)
//              padded with spaces so the data starts 8-byte aligned (8 + N is a multiple of 8)
//   [rest]     the tensors' bytes, row-major, little-endian; offsets are relative to this section
//
// Dtypes: F32, F64, BF16, I32, I64, BOOL (one byte, 0 or 1) are read and written as they are. What
// Python also writes is read by load_safetensors, widened exactly to a dtype cpformer computes in: F16
// -> f32; I8, U8, I16, U16 -> i32; U32 -> i64; U64 -> i64 (values above INT64_MAX are refused). The
// header-only reader (checkpoint validation) accepts only the six native dtypes. Reading validates everything before a
// byte of data is used: header length against the file size, JSON syntax, duplicate names, known
// dtypes, non-negative shapes, shape x dtype size == byte length, and that the tensors tile the data
// section exactly (sorted by offset, first at 0, no gap, no overlap, last ending at the file's end),
// which is the reference implementation's rule. Errors name the file and the problem.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::io {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// Header limit of the reference implementation: larger headers are rejected as corrupt.
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;  // what it loads as
  std::string file_dtype;    // as the file names it ("F16", "U8", ...; equal to dtype's name when native)
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data order (by offset)
  Metadata metadata;
  uint64_t data_start = 0;  // 8 + N: file offset of the data section
  uint64_t file_size = 0;
  // The entry of that name, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
};

// "F32", "BF16", ... and back; the reverse throws for names outside the six supported dtypes.
std::string safetensors_dtype_name(DType dtype);
DType dtype_from_safetensors_name(const std::string& name);

// Name -> XXH3-64 checksum (framework/io/tensor_integrity.h) of the tensor's bytes as written.
using TensorChecksums = std::map<std::string, std::string>;

// Writes tensors (any device, any strides: each is copied to a contiguous host buffer in turn) in the
// given order. Names must be unique, non-empty and not "__metadata__". With `sync` the file is
// fsync'd before returning. Returns each tensor's checksum, computed from the very bytes written.
TensorChecksums save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {},
                                 bool sync = false);

// Reads and validates the header only (cheap; what checkpoint validation uses).
SafetensorsHeader read_safetensors_header(const std::string& path);
// The same through a reader already open (its data read next is then from the very same file).
class FileReader;
SafetensorsHeader read_safetensors_header(const FileReader& reader);

// Reads every tensor (contiguous, on the host) in data order, widening F16 and the 8/16-bit and unsigned
// integer dtypes (see above); `metadata`, when given, receives the "__metadata__" map.
NamedTensors load_safetensors(const std::string& path, Metadata* metadata = nullptr);

}  // namespace cpf::io
