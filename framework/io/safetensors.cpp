#include "framework/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "framework/io/file_io.h"
#include "framework/io/tensor_integrity.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::io {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace {

using nlohmann::json;
constexpr const char* kMetadataKey = "__metadata__";

// Parses JSON, rejecting duplicate keys at any depth (nlohmann would silently keep the last).
json parse_json_strict(const std::string& text, const std::string& where) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text, callback);
  } catch (const json::exception& e) {
    CPF_FAIL(where, ": header is not valid JSON: ", e.what());
  }
  CPF_CHECK(duplicate.empty(), where, ": header has the key '", duplicate, "' more than once");
  return parsed;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// A dtype Python writes that cpformer has no tensor type for, and the native dtype it widens to exactly.
struct WidenedDType {
  const char* name;
  DType dtype;
  uint64_t size;  // bytes per element in the file
};
constexpr WidenedDType kWidened[] = {{"F16", DType::f32, 2}, {"I8", DType::i32, 1},  {"U8", DType::i32, 1},
                                     {"I16", DType::i32, 2}, {"U16", DType::i32, 2}, {"U32", DType::i64, 4},
                                     {"U64", DType::i64, 8}};

const WidenedDType* find_widened(const std::string& name) {
  for (const WidenedDType& w : kWidened) {
    if (name == w.name) return &w;
  }
  return nullptr;
}

// IEEE half -> float, exactly (every half is a float): subnormals, infinities and NaN payloads included.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal: normalise
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  } else {
    bits = sign;
  }
  return std::bit_cast<float>(bits);
}

template <class From, class To>
void widen_integers(const unsigned char* bytes, uint64_t count, To* out) {
  for (uint64_t i = 0; i < count; ++i) {
    From v;
    std::memcpy(&v, bytes + i * sizeof(From), sizeof(From));
    out[i] = static_cast<To>(v);
  }
}

// Converts `count` elements of file dtype `w` from `bytes` into `t` (of w.dtype).
void widen(const WidenedDType& w, const unsigned char* bytes, uint64_t count, Tensor& t, const std::string& where) {
  const std::string name = w.name;
  if (name == "F16") {
    auto* out = static_cast<float*>(t.raw_data());
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      out[i] = half_to_float(h);
    }
  } else if (name == "I8") {
    widen_integers<int8_t>(bytes, count, static_cast<int32_t*>(t.raw_data()));
  } else if (name == "U8") {
    widen_integers<uint8_t>(bytes, count, static_cast<int32_t*>(t.raw_data()));
  } else if (name == "I16") {
    widen_integers<int16_t>(bytes, count, static_cast<int32_t*>(t.raw_data()));
  } else if (name == "U16") {
    widen_integers<uint16_t>(bytes, count, static_cast<int32_t*>(t.raw_data()));
  } else if (name == "U32") {
    widen_integers<uint32_t>(bytes, count, static_cast<int64_t*>(t.raw_data()));
  } else {  // U64
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t v;
      std::memcpy(&v, bytes + 8 * i, 8);
      CPF_CHECK(v <= static_cast<uint64_t>(INT64_MAX), where, ": U64 element ", i, " is ", v,
                ", above the largest i64 (", INT64_MAX, ") that cpformer loads U64 into");
      static_cast<int64_t*>(t.raw_data())[i] = static_cast<int64_t>(v);
    }
  }
}

SafetensorsEntry parse_entry(const std::string& where, const std::string& name, const json& value, bool widen) {
  CPF_CHECK(!name.empty(), where, ": a tensor has an empty name");
  CPF_CHECK(value.is_object(), where, ": tensor '", name, "' is not a JSON object");
  for (const auto& [key, field] : value.items()) {
    CPF_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where, ": tensor '", name,
              "' has an unknown field '", key, "'");
  }
  CPF_CHECK(value.contains("dtype") && value["dtype"].is_string(), where, ": tensor '", name,
            "' has no string field 'dtype'");
  CPF_CHECK(value.contains("shape") && value["shape"].is_array(), where, ": tensor '", name,
            "' has no array field 'shape'");
  CPF_CHECK(value.contains("data_offsets") && value["data_offsets"].is_array(), where, ": tensor '", name,
            "' has no array field 'data_offsets'");
  SafetensorsEntry e;
  e.name = name;
  const std::string dtype = value["dtype"].get<std::string>();
  e.file_dtype = dtype;
  uint64_t element_size = 0;
  if (const WidenedDType* w = widen ? find_widened(dtype) : nullptr) {
    e.dtype = w->dtype;
    element_size = w->size;
  } else {
    try {
      e.dtype = dtype_from_safetensors_name(dtype);
    } catch (const Error& err) {
      CPF_FAIL(where, ": tensor '", name, "': ", err.message(),
               widen ? "; also read: F16, I8, U8, I16, U16, U32, U64" : "");
    }
    element_size = dtype_size(e.dtype);
  }
  uint64_t numel = 1;
  for (const json& d : value["shape"]) {
    CPF_CHECK(d.is_number_unsigned(), where, ": tensor '", name, "' has shape ", value["shape"].dump(),
              "; dimensions must be non-negative integers");
    const uint64_t dim = d.get<uint64_t>();
    CPF_CHECK(dim <= static_cast<uint64_t>(INT64_MAX) && checked_mul(numel, dim, numel), where, ": tensor '", name,
              "' has shape ", value["shape"].dump(), " whose element count overflows");
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  const json& offsets = value["data_offsets"];
  CPF_CHECK(offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), where,
            ": tensor '", name, "' has data_offsets ", offsets.dump(), "; expected [begin, end] with 0 <= begin");
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  CPF_CHECK(e.begin <= e.end, where, ": tensor '", name, "' has data_offsets [", e.begin, ",", e.end,
            "] with begin after end");
  uint64_t nbytes = 0;
  CPF_CHECK(checked_mul(numel, element_size, nbytes) && nbytes == e.end - e.begin, where, ": tensor '", name,
            "' of shape ", e.shape, " and dtype ", dtype, " needs ", nbytes, " bytes but data_offsets [", e.begin, ",",
            e.end, "] span ", e.end - e.begin);
  return e;
}

std::string header_length_bytes(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
    case DType::f8e4m3:
    case DType::f8e5m2:
      // FP8 copies are made from the f32 weights every step; checkpoints hold the weights and the scales.
      CPF_FAIL("safetensors: ", dtype_name(dtype),
               " tensors are not saved (checkpoint the f32 tensors they come from)");
  }
  CPF_FAIL("safetensors: unknown dtype ", static_cast<int>(dtype));
}

DType dtype_from_safetensors_name(const std::string& name) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    if (safetensors_dtype_name(d) == name) return d;
  }
  CPF_FAIL("unsupported dtype '", name, "' (supported: F32, F64, BF16, I32, I64, BOOL)");
}

TensorChecksums save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata,
                                 bool sync) {
  const std::string where = "safetensors: " + path;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    CPF_CHECK(!name.empty(), where, ": cannot write a tensor with an empty name");
    CPF_CHECK(name != kMetadataKey, where, ": '", kMetadataKey, "' is reserved and cannot name a tensor");
    CPF_CHECK(names.insert(name).second, where, ": tensor name '", name, "' appears more than once");
    CPF_CHECK(t.defined(), where, ": tensor '", name, "' is undefined");
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  FileWriter writer(path);
  writer.write(header_length_bytes(text.size()).data(), 8);
  writer.write(text.data(), text.size());
  TensorChecksums checksums;
  for (const auto& [name, t] : tensors) {
    const Tensor host = raw::contiguous(raw::to(t, Device::cpu()));
    const size_t nbytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype());
    checksums[name] = tensor_checksum(nbytes > 0 ? host.raw_data() : "", nbytes);
    if (nbytes > 0) writer.write(host.raw_data(), nbytes);
  }
  if (sync) writer.sync();
  writer.close();
  return checksums;
}

namespace {

SafetensorsHeader read_header(const FileReader& reader, bool widen) {
  const std::string where = "safetensors: " + reader.path();
  SafetensorsHeader h;
  h.file_size = reader.size();
  CPF_CHECK(h.file_size >= 8, where, ": file is ", h.file_size,
            " bytes, too short for the 8-byte header length (truncated or not a safetensors file)");
  unsigned char len_bytes[8];
  reader.read_at(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  CPF_CHECK(n <= kMaxSafetensorsHeader, where, ": header length ", n, " exceeds the limit of ", kMaxSafetensorsHeader,
            " bytes (corrupt or not a safetensors file)");
  CPF_CHECK(n <= h.file_size - 8, where, ": header length ", n, " runs past the end of the ", h.file_size,
            "-byte file (truncated or not a safetensors file)");
  CPF_CHECK(n >= 2, where, ": header length ", n, " is too short for a JSON object");
  std::string text(n, '\0');
  reader.read_at(8, text.data(), n);
  CPF_CHECK(text[0] == '{', where, ": header does not start with '{' (not a safetensors file)");
  // The JSON parser stops at a NUL as if the text ended there: what follows would go unchecked.
  const size_t nul = text.find('\0');
  CPF_CHECK(nul == std::string::npos, where, ": header holds a NUL byte at offset ", 8 + nul, " (corrupt file)");
  const json parsed = parse_json_strict(text, where);
  h.data_start = 8 + n;
  for (const auto& [key, value] : parsed.items()) {
    if (key == kMetadataKey) {
      CPF_CHECK(value.is_object(), where, ": '", kMetadataKey, "' must be an object of strings");
      for (const auto& [mkey, mvalue] : value.items()) {
        CPF_CHECK(mvalue.is_string(), where, ": metadata value of '", mkey, "' is not a string: ", mvalue.dump());
        h.metadata[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(where, key, value, widen));
  }
  // The tensors must tile the data section exactly.
  std::sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : h.entries) {
    CPF_CHECK(e.begin >= expected, where, ": tensor '", e.name, "' starts at byte ", e.begin, " inside tensor '",
              previous ? previous->name : "", "' which ends at byte ", expected, " (overlapping data_offsets)");
    CPF_CHECK(e.begin == expected, where, ": gap in the data section: bytes [", expected, ",", e.begin,
              ") before tensor '", e.name, "' belong to no tensor");
    expected = e.end;
    previous = &e;
  }
  const uint64_t data_size = h.file_size - h.data_start;
  CPF_CHECK(expected == data_size, where, ": the tensors cover ", expected, " bytes but the data section holds ",
            data_size, expected > data_size ? " (truncated file)" : " (trailing bytes)");
  return h;
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  FileReader reader(path);
  return read_header(reader, false);
}

SafetensorsHeader read_safetensors_header(const FileReader& reader) { return read_header(reader, false); }

NamedTensors load_safetensors(const std::string& path, Metadata* metadata) {
  FileReader reader(path);
  const SafetensorsHeader h = read_header(reader, true);
  NamedTensors out;
  out.reserve(h.entries.size());
  for (const SafetensorsEntry& e : h.entries) {
    Tensor t = empty(e.shape, {.dtype = e.dtype});
    const uint64_t nbytes = e.end - e.begin;
    if (const WidenedDType* w = find_widened(e.file_dtype)) {
      std::vector<unsigned char> bytes(nbytes);
      if (nbytes > 0) reader.read_at(h.data_start + e.begin, bytes.data(), nbytes);
      widen(*w, bytes.data(), nbytes / w->size, t, "safetensors: " + path + ": tensor '" + e.name + "'");
      out.emplace_back(e.name, std::move(t));
      continue;
    }
    if (nbytes > 0) reader.read_at(h.data_start + e.begin, t.raw_data(), nbytes);
    if (e.dtype == DType::boolean) {
      // Any byte other than 0 or 1 is not a valid C++ bool.
      const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
      const auto bad = std::find_if(bytes, bytes + nbytes, [](unsigned char b) { return b > 1; });
      CPF_CHECK(bad == bytes + nbytes, "safetensors: ", path, ": BOOL tensor '", e.name, "' holds the byte ",
                static_cast<int>(bad == bytes + nbytes ? 0 : *bad), " at element ", bad - bytes, " (expected 0 or 1)");
    }
    out.emplace_back(e.name, std::move(t));
  }
  if (metadata) *metadata = h.metadata;
  return out;
}

}  // namespace cpf::io
