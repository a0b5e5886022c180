// Every differentiable op on every device, from one registry of cases (op_cases.h, op_cases_nn.h):
//   DeviceGradcheck.Op/<case>_<device>       f64 gradcheck on the device (finite differences run its kernels)
//   DeviceParity.Op/<case>_<dtype>_cuda0     forward values and input gradients on the GPU against the CPU
//                                            at f64, f32 and bf16 (tolerances in support/op_case.h)
//   OpCoverage.*                             every public function of framework/autograd/functions/*.h
//                                            has a case, so a new op cannot land without its GPU test.
// Without a GPU the cuda0 tests skip with the reason; the CPU ones always run.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "autograd/op_cases.h"
#include "autograd/op_cases_loss.h"
#include "autograd/op_cases_nn.h"
#include "support/gradcheck_utils.h"

namespace cpf {
namespace testing {

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> all;
    op_cases_detail::add_elementwise_cases(all);
    op_cases_detail::add_inplace_cases(all);
    op_cases_detail::add_index_cases(all);
    op_cases_detail::add_join_cases(all);
    op_cases_detail::add_matmul_cases(all);
    op_cases_detail::add_nn_cases(all);
    op_cases_detail::add_classifier_cases(all);
    op_cases_detail::add_reduce_cases(all);
    op_cases_detail::add_shape_cases(all);
    return all;
  }();
  return cases;
}

}  // namespace testing

namespace {

using testing::op_cases;
using testing::OpCase;

std::vector<size_t> case_indices(bool differentiable_only) {
  std::vector<size_t> out;
  for (size_t i = 0; i < op_cases().size(); ++i) {
    if (!differentiable_only || op_cases()[i].differentiable) out.push_back(i);
  }
  return out;
}

// ---- f64 gradcheck on every device ----

class DeviceGradcheck : public ::testing::TestWithParam<std::tuple<Device, size_t>> {};

TEST_P(DeviceGradcheck, Op) {
  const auto [device, index] = GetParam();
  const std::string reason = testing::device_unavailable_reason(device);
  if (!reason.empty()) GTEST_SKIP() << reason;
  const OpCase& c = op_cases()[index];
  const std::vector<Tensor> inputs = testing::make_case_inputs(c, device, DType::f64);
  const GradcheckReport r = gradcheck(c.fn, inputs, c.gradcheck_options);
  EXPECT_TRUE(r.ok) << "case " << c.name << " (op " << c.op << ") on " << device << ": " << r.str();
  EXPECT_GT(r.checked, 0) << c.name;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].requires_grad() && inputs[i].grad().defined()) {
      EXPECT_EQ(inputs[i].grad().device(), device) << c.name << ": gradient of input " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, DeviceGradcheck,
                         ::testing::Combine(::testing::ValuesIn(testing::test_devices()),
                                            ::testing::ValuesIn(case_indices(true))),
                         [](const ::testing::TestParamInfo<std::tuple<Device, size_t>>& info) {
                           return op_cases()[std::get<1>(info.param)].name + "_" +
                                  testing::device_test_name(std::get<0>(info.param));
                         });

// ---- device against CPU at f64, f32, bf16 ----

class DeviceParity : public ::testing::TestWithParam<std::tuple<Device, size_t, DType>> {};

TEST_P(DeviceParity, Op) {
  const auto [device, index, dtype] = GetParam();
  const std::string reason = testing::device_unavailable_reason(device);
  if (!reason.empty()) GTEST_SKIP() << reason;
  const OpCase& c = op_cases()[index];
  const testing::CaseRun cpu = testing::run_case(c, Device::cpu(), dtype);
  const testing::CaseRun dev = testing::run_case(c, device, dtype);
  const std::string where = "case " + c.name + " (op " + c.op + ") at " + dtype_name(dtype) + " on " + device.str();
  ASSERT_EQ(dev.outputs.size(), cpu.outputs.size()) << where;
  for (size_t k = 0; k < cpu.outputs.size(); ++k) {
    if (dev.outputs[k].defined()) {
      EXPECT_EQ(dev.output_devices[k], device) << where << ": output " << k << " left the device";
    }
    EXPECT_TRUE(testing::matches_cpu(dev.outputs[k], cpu.outputs[k], "output " + std::to_string(k), c.exact, dtype,
                                     c.tolerance))
        << where;
  }
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    if (dev.grads[i].defined()) {
      EXPECT_EQ(dev.grad_devices[i], device) << where << ": gradient of input " << i << " left the device";
    }
    EXPECT_TRUE(testing::matches_cpu(dev.grads[i], cpu.grads[i], "gradient of input " + std::to_string(i), false, dtype,
                                     c.tolerance))
        << where;
  }
}

// Always instantiated for cuda:0, so a CPU-only build lists (and skips) what the GPU machine runs.
INSTANTIATE_TEST_SUITE_P(, DeviceParity,
                         ::testing::Combine(::testing::Values(Device::cuda(0)),
                                            ::testing::ValuesIn(case_indices(false)),
                                            ::testing::Values(DType::f64, DType::f32, DType::bf16)),
                         [](const ::testing::TestParamInfo<std::tuple<Device, size_t, DType>>& info) {
                           return op_cases()[std::get<1>(info.param)].name + "_" + dtype_name(std::get<2>(info.param)) +
                                  "_" + testing::device_test_name(std::get<0>(info.param));
                         });

// ---- coverage: every public autograd function has a case ----

// The function names declared in framework/autograd/functions/*.h (operators excluded), by header.
// The headers are embedded at build time (tests/CMakeLists.txt), so the test runs from any folder.
std::map<std::string, std::string> declared_autograd_functions() {
  static const std::vector<std::pair<std::string, std::string>> headers = {
#include "autograd_function_headers.inc"
  };
  // A declaration at the start of a line: return type, name, '('. Comments are stripped first.
  const std::regex declaration(R"(^\s*(?:inline\s+)?(?:Tensor|std::vector<Tensor>|void)\s+([A-Za-z_]\w*)\s*\()");
  std::map<std::string, std::string> names;
  for (const auto& [header, text] : headers) {
    std::istringstream file(text);
    std::string line;
    while (std::getline(file, line)) {
      line = line.substr(0, line.find("//"));
      std::smatch m;
      if (std::regex_search(line, m, declaration) && m[1] != "operator") names.emplace(m[1], header);
    }
  }
  return names;
}

TEST(OpCoverage, HeadersAreParsed) {
  const auto declared = declared_autograd_functions();
  // A sample from each header: if parsing broke, the coverage test below would pass vacuously.
  for (const char* name : {"add", "pow", "add_", "index_select", "cat", "split", "matmul", "softmax", "cross_entropy",
                           "sum", "argmax", "view", "to"}) {
    EXPECT_TRUE(declared.count(name)) << name << " not found in framework/autograd/functions/*.h";
  }
  EXPECT_GE(declared.size(), 55u);
}

TEST(OpCoverage, EveryAutogradFunctionHasADeviceCase) {
  std::set<std::string> covered, differentiated;
  for (const OpCase& c : op_cases()) {
    covered.insert(c.op);
    if (c.differentiable) differentiated.insert(c.op);
  }
  // Functions without a gradient to check: their cases compare forward values only.
  const std::set<std::string> forward_only = {"argmax", "add_", "mul_", "fill_", "zero_", "copy_"};
  // Functions no finite difference can check: FP8 casts are piecewise constant, the gradient is the
  // recipe's (straight through the casts). tests/autograd/fp8_linear_test.cpp checks it against the
  // products of the same quantised values; tests/tensor/cuda/fp8_test.cpp runs it on the GPU against the CPU.
  // fp8_linear_after likewise: fp8_linear_test.cpp holds it to fp8_linear over the autograd activation, and
  // tests/tensor/cuda/fp8_activation_test.cpp does so on the GPU.
  const std::set<std::string> recipe_defined = {"fp8_linear", "fp8_linear_after"};
  std::string missing, not_differentiated;
  for (const auto& [name, header] : declared_autograd_functions()) {
    if (recipe_defined.count(name)) continue;
    if (!covered.count(name)) missing += " " + name + " (" + header + ")";
    if (covered.count(name) && !differentiated.count(name) && !forward_only.count(name)) {
      not_differentiated += " " + name;
    }
  }
  EXPECT_EQ(missing, "") << "functions of framework/autograd/functions/*.h without a case in tests/autograd/"
                            "op_cases*.h, so they would never run on the GPU; add a case for each:"
                         << missing;
  EXPECT_EQ(not_differentiated, "") << "functions whose cases all set differentiable = false: give each a "
                                       "gradchecked case:"
                                    << not_differentiated;
}

TEST(OpCoverage, CasesNameRealFunctionsAndHaveUniqueNames) {
  const auto declared = declared_autograd_functions();
  std::set<std::string> names;
  for (const OpCase& c : op_cases()) {
    EXPECT_TRUE(declared.count(c.op)) << "case " << c.name << " names op '" << c.op
                                      << "', which framework/autograd/functions/*.h does not declare";
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
    EXPECT_TRUE(std::regex_match(c.name, std::regex("[A-Za-z0-9_]+"))) << "case name " << c.name;
  }
}

}  // namespace
}  // namespace cpf
