// framework/io/tensor_integrity.h: the non-finite search on every dtype and the chunked check of a
// stored tensor (checksum and first non-finite value across chunk boundaries).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "framework/io/file_io.h"
#include "framework/io/safetensors.h"
#include "framework/io/tensor_integrity.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(TensorIntegrity, FindsTheFirstNonFiniteValueOfEachFloatingDtype) {
  const std::vector<double> values = {1.0, -2.5, kInf, 3.0, kNaN, -kInf};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor t = raw::to(from_vector(values, {2, 3}), dtype);
    const auto bad = io::find_non_finite({{"w", t}});
    ASSERT_TRUE(bad.has_value()) << dtype;
    EXPECT_EQ(bad->tensor, "w");
    EXPECT_EQ(bad->index, 2);
    EXPECT_EQ(bad->value, kInf);
    EXPECT_EQ(bad->count, 3);
    EXPECT_EQ(bad->describe(), "tensor 'w' holds 3 non-finite values (the first, inf, at element 2)");
  }
  const Tensor nan_first = from_vector(std::vector<float>{static_cast<float>(kNaN), 0}, {2});
  EXPECT_EQ(io::find_non_finite({{"b", nan_first}})->describe(),
            "tensor 'b' holds 1 non-finite value (the first, nan, at element 0)");
  // Huge finite values, bf16's largest included, are finite.
  const Tensor big = raw::to(from_vector(std::vector<double>{3.38e38, -3.38e38, 1e-40}, {3}), DType::bf16);
  EXPECT_TRUE(io::all_finite({{"big", big}}));
}

TEST(TensorIntegrity, ReportsTheFirstBadTensorAndIgnoresIntegersBoolsAndEmptyOnes) {
  const Tensor ok = from_vector(std::vector<float>{1, 2}, {2});
  const Tensor ints = from_vector(std::vector<int64_t>{-1, 7}, {2});
  const Tensor empty = zeros({0, 3});
  const Tensor strided = raw::transpose(from_vector(std::vector<double>{1, 2, 3, kNaN, 5, 6}, {2, 3}), 0, 1);
  EXPECT_TRUE(io::all_finite({{"ok", ok}, {"ints", ints}, {"empty", empty}}));
  const auto bad = io::find_non_finite({{"ok", ok}, {"t", strided}, {"ok2", ok}});
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->tensor, "t");
  EXPECT_EQ(bad->index, 1) << "row-major index of the transposed view";
  EXPECT_FALSE(io::find_non_finite({}).has_value());
}

TEST(TensorIntegrity, StoredTensorsAreCheckedInChunksAcrossTheirWholeLength) {
  const fs::path path = fs::temp_directory_path() / ("cpf_integrity_" + std::to_string(::getpid()) + ".safetensors");
  // 3M floats = 12 MB: three 4 MB chunks; non-finite values in the second and third.
  std::vector<float> values(3'000'000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) * 0.5f;
  values[1'500'000] = -std::numeric_limits<float>::infinity();
  values[2'999'999] = std::numeric_limits<float>::quiet_NaN();
  const Tensor t = from_vector(values, {3'000'000});
  const io::TensorChecksums sums =
      io::save_safetensors(path.string(), {{"head", zeros({3})}, {"none", zeros({0, 4})}, {"big", t}});
  EXPECT_EQ(sums.at("big"), io::tensor_checksum(values.data(), values.size() * 4));

  const io::FileReader reader(path.string());
  const io::SafetensorsHeader h = io::read_safetensors_header(reader);
  const io::SafetensorsEntry* e = h.find("big");
  ASSERT_NE(e, nullptr);
  const io::StoredTensorCheck c =
      io::check_stored_tensor(reader, h.data_start + e->begin, e->end - e->begin, "big", DType::f32);
  EXPECT_EQ(c.checksum, sums.at("big"));
  ASSERT_TRUE(c.non_finite.has_value());
  EXPECT_EQ(c.non_finite->describe(), "tensor 'big' holds 2 non-finite values (the first, -inf, at element 1500000)");
  const io::SafetensorsEntry* head = h.find("head");
  const io::StoredTensorCheck zero =
      io::check_stored_tensor(reader, h.data_start + head->begin, 12, "head", DType::f32);
  EXPECT_FALSE(zero.non_finite.has_value());
  EXPECT_EQ(zero.checksum, sums.at("head"));
  const io::SafetensorsEntry* none = h.find("none");
  EXPECT_EQ(io::check_stored_tensor(reader, h.data_start + none->begin, 0, "none", DType::f32).checksum,
            sums.at("none"));
  EXPECT_EQ(sums.at("none"), io::tensor_checksum("", 0));
  // Reading past the end (the file shrank since its header was read) is an error naming the file.
  EXPECT_CPF_ERROR(io::check_stored_tensor(reader, h.file_size - 8, 16, "x", DType::f32),
                   path.string() + ": unexpected end of file at byte " + std::to_string(h.file_size));
  fs::remove(path);
}

}  // namespace
}  // namespace cpf
