#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "framework/io/safetensors.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

namespace fs = std::filesystem;
using io::NamedTensors;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_safetensors_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // An 8-byte little-endian length, the header text and the data bytes, exactly as given.
  std::string write_raw(const std::string& header, const std::string& data, uint64_t length_field = UINT64_MAX) {
    const uint64_t n = length_field == UINT64_MAX ? header.size() : length_field;
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    bytes += header + data;
    const std::string p = path("raw.safetensors");
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  fs::path dir_;
};

template <class T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return out;
}

TEST_F(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  const Tensor matrix = testing::random_tensor({2, 3}, DType::f32, 1);
  const NamedTensors tensors = {
      {"f32", matrix},
      {"f64", testing::random_tensor({4}, DType::f64, 2)},
      {"bf16", raw::to(testing::random_tensor({3, 2}, DType::f32, 3), DType::bf16)},
      {"i32", from_vector<int32_t>({1, -2, 3, INT32_MAX, INT32_MIN}, {5})},
      {"i64", from_vector<int64_t>({INT64_MIN, 0, 7, INT64_MAX}, {2, 2})},
      {"bool", raw::to(from_vector<int32_t>({1, 0, 1}, {3}), DType::boolean)},
      {"scalar", scalar_tensor(2.5)},
      {"empty", zeros({0, 3})},
      {"transposed", raw::transpose(matrix, 0, 1)},  // non-contiguous view: written row-major
  };
  io::save_safetensors(path("all.safetensors"), tensors, {{"format", "pt"}, {"note", "ünïcode"}});
  io::Metadata metadata;
  const NamedTensors loaded = io::load_safetensors(path("all.safetensors"), &metadata);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(loaded[i].first, tensors[i].first);
    EXPECT_EQ(loaded[i].second.dtype(), tensors[i].second.dtype()) << tensors[i].first;
    EXPECT_EQ(loaded[i].second.shape(), tensors[i].second.shape()) << tensors[i].first;
    EXPECT_EQ(loaded[i].second.to_vector<double>(), tensors[i].second.to_vector<double>()) << tensors[i].first;
  }
  EXPECT_EQ(metadata, (io::Metadata{{"format", "pt"}, {"note", "ünïcode"}}));
}

TEST_F(Safetensors, WriterLayoutMatchesTheSpecByteForByte) {
  io::save_safetensors(path("one.safetensors"), {{"w", from_vector<float>({1.5f, -2.0f}, {2})}});
  std::ifstream in(path("one.safetensors"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  const std::string header = bytes.substr(8, n);
  const std::string expected_json = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(header.substr(0, expected_json.size()), expected_json);
  EXPECT_EQ(header.find_first_not_of(' ', expected_json.size()), std::string::npos) << "padding must be spaces";
  EXPECT_EQ(bytes.substr(8 + n), bytes_of<float>({1.5f, -2.0f}));
}

TEST_F(Safetensors, ReadsAHandBuiltFile) {
  // Written independently of the writer: keys out of data order, no padding, metadata last.
  const std::string header = R"({"b":{"dtype":"I64","shape":[],"data_offsets":[8,16]},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("c":{"dtype":"BF16","shape":[1,2],"data_offsets":[16,20]},)"
                             R"("__metadata__":{"k":"v"}})";
  // bf16 1.0 = 0x3f80, -2.0 = 0xc000
  const std::string data =
      bytes_of<float>({1.5f, -2.0f}) + bytes_of<int64_t>({-7}) + bytes_of<uint16_t>({0x3f80, 0xc000});
  io::Metadata metadata;
  const NamedTensors t = io::load_safetensors(write_raw(header, data), &metadata);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].first, "a");
  EXPECT_EQ(t[0].second.to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(t[1].first, "b");
  EXPECT_EQ(t[1].second.shape(), Shape{});
  EXPECT_EQ(t[1].second.item<int64_t>(), -7);
  EXPECT_EQ(t[2].second.shape(), (Shape{1, 2}));
  EXPECT_EQ(t[2].second.to_vector<double>(), (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ(metadata.at("k"), "v");
  const io::SafetensorsHeader h = io::read_safetensors_header(path("raw.safetensors"));
  EXPECT_EQ(h.data_start, 8 + header.size());
  ASSERT_NE(h.find("c"), nullptr);
  EXPECT_EQ(h.find("c")->begin, 16u);
  EXPECT_EQ(h.find("zzz"), nullptr);
}

TEST_F(Safetensors, RejectsBrokenFramesWithFileAndProblem) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data = bytes_of<float>({1, 2});
  std::string p = write_raw("", "");
  std::ofstream(p, std::ios::binary | std::ios::trunc).write("abc", 3);
  EXPECT_CPF_ERROR(io::load_safetensors(p), "raw.safetensors: file is 3 bytes, too short for the 8-byte header length");
  p = write_raw(good.substr(0, 10), "", good.size());
  EXPECT_CPF_ERROR(io::load_safetensors(p), "header length 54 runs past the end of the 18-byte file");
  p = write_raw(good, data, 200'000'000);
  EXPECT_CPF_ERROR(io::load_safetensors(p), "header length 200000000 exceeds the limit of 100000000 bytes");
  p = write_raw("{", "");
  EXPECT_CPF_ERROR(io::load_safetensors(p), "header length 1 is too short for a JSON object");
  p = write_raw("PK\x03\x04garbage", "");
  EXPECT_CPF_ERROR(io::load_safetensors(p), "header does not start with '{' (not a safetensors file)");
  p = write_raw(R"({"a":{"dtype":"F32",)", "");
  EXPECT_CPF_ERROR(io::load_safetensors(p), "raw.safetensors: header is not valid JSON");
  p = write_raw(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      data + data);
  EXPECT_CPF_ERROR(io::load_safetensors(p), "header has the key 'a' more than once");
  // A NUL ends the text for the JSON parser: whatever follows it (here a second entry) would be ignored.
  p = write_raw(good + std::string(1, '\0') + "  ", data);
  EXPECT_CPF_ERROR(io::load_safetensors(p), "raw.safetensors: header holds a NUL byte at offset 62 (corrupt file)");
  p = write_raw(good, data.substr(0, 5));
  EXPECT_CPF_ERROR(io::load_safetensors(p), "the tensors cover 8 bytes but the data section holds 5 (truncated file)");
  p = write_raw(good, data + "xx");
  EXPECT_CPF_ERROR(io::load_safetensors(p), "the tensors cover 8 bytes but the data section holds 10 (trailing bytes)");
  EXPECT_CPF_ERROR(io::load_safetensors(path("missing.safetensors")), "cannot open");
  EXPECT_CPF_ERROR(io::load_safetensors(dir_.string()), "not a regular file");
}

TEST_F(Safetensors, RejectsBadEntries) {
  const std::string d8 = bytes_of<float>({1, 2});
  auto expect_error = [&](const std::string& header, const std::string& data, const std::string& message) {
    EXPECT_CPF_ERROR(io::read_safetensors_header(write_raw(header, data)), message);
  };
  expect_error(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", "1234",
               "tensor 'a': unsupported dtype 'F16' (supported: F32, F64, BF16, I32, I64, BOOL)");
  expect_error(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8,
               "tensor 'a' has shape [-2]; dimensions must be non-negative integers");
  expect_error(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8,
               "dimensions must be non-negative integers");
  expect_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8,
               "whose element count overflows");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8,
               "tensor 'a' has data_offsets [0]; expected [begin, end]");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", d8, "expected [begin, end]");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8,
               "tensor 'a' has data_offsets [8,0] with begin after end");
  expect_error(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8,
               "tensor 'a' of shape [3] and dtype F32 needs 12 bytes but data_offsets [0,8] span 8");
  expect_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      d8, "tensor 'b' starts at byte 4 inside tensor 'a' which ends at byte 8 (overlapping data_offsets)");
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8,
               "gap in the data section: bytes [0,4) before tensor 'a' belong to no tensor");
  expect_error(R"({"a":[1,2]})", "", "tensor 'a' is not a JSON object");
  expect_error(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", "", "a tensor has an empty name");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"crc":1}})", d8,
               "tensor 'a' has an unknown field 'crc'");
  expect_error(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8, "tensor 'a' has no string field 'dtype'");
  expect_error(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", d8, "tensor 'a' has no array field 'shape'");
  expect_error(R"({"a":{"dtype":"F32","shape":[2]}})", d8, "tensor 'a' has no array field 'data_offsets'");
  expect_error(R"({"__metadata__":[1]})", "", "'__metadata__' must be an object of strings");
  expect_error(R"({"__metadata__":{"n":1}})", "", "metadata value of 'n' is not a string: 1");
}

TEST_F(Safetensors, RejectsBoolBytesOtherThanZeroOrOne) {
  const std::string p =
      write_raw(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\x01\x00\x02", 3));
  EXPECT_CPF_ERROR(io::load_safetensors(p), "BOOL tensor 'm' holds the byte 2 at element 2 (expected 0 or 1)");
}

TEST_F(Safetensors, WriterRejectsBadNames) {
  const Tensor t = zeros({1});
  EXPECT_CPF_ERROR(io::save_safetensors(path("x"), {{"", t}}), "cannot write a tensor with an empty name");
  EXPECT_CPF_ERROR(io::save_safetensors(path("x"), {{"__metadata__", t}}), "'__metadata__' is reserved");
  EXPECT_CPF_ERROR(io::save_safetensors(path("x"), {{"a", t}, {"a", t}}), "tensor name 'a' appears more than once");
  EXPECT_CPF_ERROR(io::save_safetensors(path("x"), {{"a", Tensor()}}), "tensor 'a' is undefined");
  EXPECT_CPF_ERROR(io::save_safetensors(path("no/such/dir/x"), {{"a", t}}), "cannot create");
  EXPECT_CPF_ERROR(io::dtype_from_safetensors_name("U8"), "unsupported dtype 'U8'");
}

// What Python (torch / numpy through safetensors) also writes, widened exactly on load. F16 bit patterns:
// 1.0 = 0x3C00, -2.0 = 0xC000, 65504 (largest) = 0x7BFF, 2^-24 (smallest subnormal) = 0x0001,
// 2^-14 (smallest normal) = 0x0400, 0.5 = 0x3800, -0.0 = 0x8000, +inf = 0x7C00.
TEST_F(Safetensors, LoadWidensF16AndTheIntegerDtypesPythonWrites) {
  const std::string f16 = bytes_of<uint16_t>({0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x3800, 0x8000, 0x7C00});
  const std::string i8 = bytes_of<int8_t>({-128, 127}), u8 = bytes_of<uint8_t>({0, 255});
  const std::string i16 = bytes_of<int16_t>({-32768, 32767}), u16 = bytes_of<uint16_t>({65535, 1});
  const std::string u32 = bytes_of<uint32_t>({4294967295u}), u64 = bytes_of<uint64_t>({uint64_t{INT64_MAX}});
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[8],"data_offsets":[0,16]},)"
      R"("a":{"dtype":"I8","shape":[2],"data_offsets":[16,18]},"b":{"dtype":"U8","shape":[2],"data_offsets":[18,20]},)"
      R"("c":{"dtype":"I16","shape":[2],"data_offsets":[20,24]},"d":{"dtype":"U16","shape":[2],"data_offsets":[24,28]},)"
      R"("e":{"dtype":"U32","shape":[1],"data_offsets":[28,32]},"f":{"dtype":"U64","shape":[1],"data_offsets":[32,40]}})";
  const NamedTensors t = io::load_safetensors(write_raw(header, f16 + i8 + u8 + i16 + u16 + u32 + u64));
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t[0].second.dtype(), DType::f32);
  const std::vector<float> h = t[0].second.to_vector<float>();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(h[5], 0.5f);
  EXPECT_TRUE(h[6] == 0.0f && std::signbit(h[6]));
  EXPECT_TRUE(std::isinf(h[7]) && h[7] > 0);
  EXPECT_EQ(t[1].second.dtype(), DType::i32);
  EXPECT_EQ(t[1].second.to_vector<int32_t>(), (std::vector<int32_t>{-128, 127}));
  EXPECT_EQ(t[2].second.to_vector<int32_t>(), (std::vector<int32_t>{0, 255}));
  EXPECT_EQ(t[3].second.to_vector<int32_t>(), (std::vector<int32_t>{-32768, 32767}));
  EXPECT_EQ(t[4].second.to_vector<int32_t>(), (std::vector<int32_t>{65535, 1}));
  EXPECT_EQ(t[5].second.dtype(), DType::i64);
  EXPECT_EQ(t[5].second.to_vector<int64_t>(), (std::vector<int64_t>{4294967295}));
  EXPECT_EQ(t[6].second.to_vector<int64_t>(), (std::vector<int64_t>{INT64_MAX}));
}

TEST_F(Safetensors, LoadRefusesWhatItCannotWidenExactly) {
  const std::string big = bytes_of<uint64_t>({uint64_t{INT64_MAX} + 1});
  EXPECT_CPF_ERROR(io::load_safetensors(write_raw(R"({"n":{"dtype":"U64","shape":[1],"data_offsets":[0,8]}})", big)),
                   "tensor 'n': U64 element 0 is 9223372036854775808, above the largest i64");
  EXPECT_CPF_ERROR(
      io::load_safetensors(write_raw(R"({"q":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", "ab")),
      "tensor 'q': unsupported dtype 'F8_E4M3' (supported: F32, F64, BF16, I32, I64, BOOL); also read: "
      "F16, I8, U8, I16, U16, U32, U64");
  // The sizes of the file's dtype, not the widened one, must match the offsets.
  EXPECT_CPF_ERROR(io::load_safetensors(
                       write_raw(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
                   "tensor 'h' of shape [2] and dtype F16 needs 4 bytes but data_offsets [0,8] span 8");
}

}  // namespace
}  // namespace cpf
