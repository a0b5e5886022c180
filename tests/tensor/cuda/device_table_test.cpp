// Coverage guard for the CUDA kernel table: every entry of DeviceOps (framework/tensor/device_ops.h)
// must be set by cpf_tensor_cuda, so a raw op that gains a device entry cannot ship with the CUDA side
// missing. The entries are enumerated from the struct itself (it holds only function pointers) and
// named from the header, so adding an entry needs no change here. Runs without a GPU: registration
// makes no CUDA call.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/device_ops.h"

namespace cpf {
namespace {

using AnyFunction = void (*)();
constexpr size_t kEntries = sizeof(DeviceOps) / sizeof(AnyFunction);
static_assert(sizeof(DeviceOps) % sizeof(AnyFunction) == 0 && std::is_trivially_copyable_v<DeviceOps> &&
                  std::is_standard_layout_v<DeviceOps>,
              "DeviceOps must hold only function pointers: this test reads it as an array of them");

// The member names of struct DeviceOps, in declaration order, read from the header.
std::vector<std::string> entry_names() {
  // The header's text as it was when this binary was built (tests/CMakeLists.txt embeds it).
  const std::string all =
#include "device_ops_text.inc"
      ;
  const size_t begin = all.find("struct DeviceOps {");
  const size_t end = all.find("\n};", begin);
  if (begin == std::string::npos || end == std::string::npos) return {};
  const std::string body = all.substr(begin, end - begin);
  std::vector<std::string> names;
  const std::regex entry(R"(\(\*\s*([A-Za-z_]\w*)\s*\)\s*\()");  // "(*name)(" of a function-pointer member
  for (auto it = std::sregex_iterator(body.begin(), body.end(), entry); it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1]);
  }
  return names;
}

TEST(CudaDeviceTable, TheHeaderNamesEveryEntry) {
  const auto names = entry_names();
  EXPECT_EQ(names.size(), kEntries) << "struct DeviceOps has " << kEntries << " pointer-sized members but "
                                    << names.size() << " '(*name)(' declarations were found in device_ops.h";
  EXPECT_EQ(names.empty() ? "" : names.front(), "copy");
}

TEST(CudaDeviceTable, EveryEntryIsSetByTheCudaBackend) {
  cuda::register_backend();  // idempotent; linking the library already did it
  const DeviceOps* ops = find_device_ops(DeviceType::cuda);
  ASSERT_NE(ops, nullptr) << "cpf_tensor_cuda registered no kernel table";
  std::array<AnyFunction, kEntries> entries{};
  std::memcpy(entries.data(), ops, sizeof(DeviceOps));
  const auto names = entry_names();
  std::string missing;
  for (size_t i = 0; i < kEntries; ++i) {
    if (entries[i] == nullptr) missing += " " + (i < names.size() ? names[i] : "entry " + std::to_string(i));
  }
  EXPECT_EQ(missing, "") << "DeviceOps entries the CUDA backend leaves unset (their raw ops would fail with "
                            "'no kernel for device cuda:0'):"
                         << missing;
}

TEST(CudaDeviceTable, AnEmptyTableIsReportedEntryByEntry) {
  // The check above can fail: a default table reads as all entries missing.
  const DeviceOps empty_table;
  std::array<AnyFunction, kEntries> entries{};
  std::memcpy(entries.data(), &empty_table, sizeof(DeviceOps));
  for (size_t i = 0; i < kEntries; ++i) EXPECT_EQ(entries[i], nullptr) << "entry " << i;
}

}  // namespace
}  // namespace cpf
