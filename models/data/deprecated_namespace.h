#pragma once
// The data pipeline's namespace follows its folder: models/data is cpf::models::data. The old name
// cpf::data stays an alias for one release (deprecated in 0.1; removed in 0.2): code that
// still says cpf::data::DataLoader compiles, and should move to cpf::models::data::DataLoader.
namespace cpf::models::data {}

namespace cpf {
namespace data = models::data;
}  // namespace cpf
