// nn::Module::save / load (framework/io/module_io.cpp): a round trip restores every parameter and
// buffer exactly, the file is plain safetensors, and a file that does not fit (missing, unexpected or
// mis-shaped tensors, non-finite values, no file) is refused with every problem named and the module
// left unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "framework/io/safetensors.h"
#include "framework/nn/linear.h"
#include "framework/nn/module_list.h"
#include "framework/nn/sequential.h"
#include "support/test_utils.h"

namespace cpf::nn {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::temp_directory_path() / "cpformer_tests" / (std::string(info->name()) + "." + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Two linear layers and a buffer (i64 step count), as a user module would hold them.
struct Net : Module {
  explicit Net(uint64_t seed, int64_t hidden = 4) : gen(seed) {
    layers = register_module("layers", std::make_shared<ModuleList>());
    layers->push_back(std::make_shared<Linear>(LinearOptions{.in_features = 3, .out_features = hidden}, &gen));
    layers->push_back(std::make_shared<Linear>(LinearOptions{.in_features = hidden, .out_features = 2}, &gen));
    steps = register_buffer("steps", full({1}, static_cast<double>(seed), {.dtype = DType::i64}));
  }
  Generator gen;
  std::shared_ptr<ModuleList> layers;
  Tensor steps;
};

std::map<std::string, std::vector<double>> values_of(const Module& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : m.named_parameters()) out[name] = t.to_vector<double>();
  for (const auto& [name, t] : m.named_buffers()) out[name] = t.to_vector<double>();
  return out;
}

TEST(ModuleIo, RoundTripRestoresParametersAndBuffers) {
  const fs::path file = scratch("rt") / "net.safetensors";
  Net a(1), b(2);
  ASSERT_NE(values_of(a), values_of(b));
  a.save(file.string());
  EXPECT_FALSE(fs::exists(file.string() + ".partial"));
  const Tensor w_before = b.layers->at<Linear>(0)->weight();
  b.load(file.string());
  EXPECT_EQ(values_of(a), values_of(b));
  EXPECT_EQ(b.layers->at<Linear>(0)->weight().impl(), w_before.impl());  // loaded in place: handles stay valid
  EXPECT_TRUE(b.layers->at<Linear>(0)->weight().requires_grad());
  // A plain safetensors file: the module's names, dtypes and shapes.
  const io::SafetensorsHeader header = io::read_safetensors_header(file.string());
  ASSERT_EQ(header.entries.size(), 5u);
  ASSERT_NE(header.find("layers.1.weight"), nullptr);
  EXPECT_EQ(header.find("layers.1.weight")->shape, (Shape{2, 4}));
  EXPECT_EQ(header.find("steps")->dtype, DType::i64);
}

TEST(ModuleIo, LoadConvertsToTheModulesDtype) {
  const fs::path file = scratch("dtype") / "f64.safetensors";
  Sequential wide;
  wide.add(std::make_shared<Linear>(LinearOptions{.in_features = 2, .out_features = 2, .dtype = DType::f64}));
  wide.save(file.string());
  Sequential narrow;
  narrow.add(std::make_shared<Linear>(LinearOptions{.in_features = 2, .out_features = 2}));
  narrow.load(file.string());
  EXPECT_TRUE(testing::all_close(narrow.parameters()[0], raw::to(wide.parameters()[0], DType::f32), 1e-7, 0));
}

TEST(ModuleIo, MismatchedFilesAreRefusedWithEveryProblemAndNothingChanges) {
  const fs::path dir = scratch("bad");
  Net wider(3, /*hidden=*/5);
  wider.save((dir / "wider.safetensors").string());
  Net net(4);
  const auto before = values_of(net);
  try {
    net.load((dir / "wider.safetensors").string());
    FAIL() << "loaded a file of another shape";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), ::testing::HasSubstr("does not fit the module: 3 tensor(s) with another shape: "));
    EXPECT_THAT(e.message(), ::testing::HasSubstr("layers.0.weight (file [5,3], module [4,3])"));
    EXPECT_THAT(e.message(), ::testing::HasSubstr("layers.1.weight (file [2,5], module [2,4])"));
  }
  EXPECT_EQ(values_of(net), before);

  Sequential one;
  one.add(std::make_shared<Linear>(LinearOptions{.in_features = 3, .out_features = 4}));
  one.save((dir / "other.safetensors").string());
  EXPECT_CPF_ERROR(net.load((dir / "other.safetensors").string()),
                   "5 tensor(s) of the module missing from the file: layers.0.bias, layers.0.weight, "
                   "layers.1.bias, layers.1.weight, steps; 2 unexpected tensor(s) in the file: 0.weight, 0.bias");
  EXPECT_EQ(values_of(net), before);

  io::save_safetensors((dir / "nan.safetensors").string(), {{"layers.0.weight", full({4, 3}, std::nan(""))},
                                                            {"layers.0.bias", zeros({4})},
                                                            {"layers.1.weight", zeros({2, 4})},
                                                            {"layers.1.bias", zeros({2})},
                                                            {"steps", zeros({1}, {.dtype = DType::i64})}});
  EXPECT_CPF_ERROR(net.load((dir / "nan.safetensors").string()),
                   "tensor 'layers.0.weight' holds NaN or infinite values");
  EXPECT_EQ(values_of(net), before);
  EXPECT_CPF_ERROR(net.load((dir / "missing.safetensors").string()), "missing.safetensors");
  EXPECT_CPF_ERROR(net.save(dir.string()), "is a folder; give a file name (e.g. model.safetensors)");
}

}  // namespace
}  // namespace cpf::nn
