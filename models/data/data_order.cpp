#include "models/data/data_order.h"

#include <numeric>
#include <sstream>
#include <utility>

#include "framework/core/error.h"
#include "framework/core/philox.h"

namespace cpf::models::data {

std::string DataCursor::str() const { return str_cat("epoch=", epoch, " index=", index, " offset=", offset); }

DataCursor parse_data_cursor(const std::string& text) {
  std::istringstream in(text);
  DataCursor cursor;
  const char* names[3] = {"epoch=", "index=", "offset="};
  int64_t* fields[3] = {&cursor.epoch, &cursor.index, &cursor.offset};
  for (int i = 0; i < 3; ++i) {
    std::string word;
    in >> word;
    const std::string name = names[i];
    CPF_CHECK(word.rfind(name, 0) == 0 && word.size() > name.size(), "data cursor '", text, "': expected '", name,
              "<integer>' as field ", i + 1, " (format: epoch=E index=I offset=O)");
    size_t used = 0;
    int64_t value = -1;
    try {
      value = std::stoll(word.substr(name.size()), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CPF_CHECK(used == word.size() - name.size() && value >= 0, "data cursor '", text, "': '", word,
              "' is not a non-negative integer field");
    *fields[i] = value;
  }
  std::string rest;
  CPF_CHECK(!(in >> rest), "data cursor '", text, "': unexpected trailing text '", rest, "'");
  return cursor;
}

uint64_t philox_bits(uint64_t seed, RandomDomain domain, uint64_t counter, uint32_t sub) {
  const PhiloxBlock block = philox4x32_10(
      {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), sub, static_cast<uint32_t>(domain)},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(block[0]) << 32) | block[1];
}

int64_t uniform_below(uint64_t bits, int64_t n) {
  CPF_CHECK(n >= 1, "uniform_below: n=", n, " must be at least 1");
  return static_cast<int64_t>((static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(n)) >> 64);
}

std::vector<int64_t> epoch_order(int64_t num_documents, uint64_t seed, int64_t epoch, bool shuffle) {
  CPF_CHECK(num_documents >= 1, "epoch_order: num_documents=", num_documents, " must be at least 1");
  CPF_CHECK(epoch >= 0 && epoch <= UINT32_MAX, "epoch_order: epoch=", epoch, " is outside [0, 2^32)");
  std::vector<int64_t> order(static_cast<size_t>(num_documents));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  // Fisher-Yates from the back: slot i swaps with a uniform slot in [0, i].
  for (int64_t i = num_documents - 1; i > 0; --i) {
    const uint64_t bits =
        philox_bits(seed, RandomDomain::shuffle, static_cast<uint64_t>(i), static_cast<uint32_t>(epoch));
    std::swap(order[i], order[uniform_below(bits, i + 1)]);
  }
  return order;
}

DocumentOrder::DocumentOrder(int64_t num_documents, uint64_t seed, bool shuffle)
    : num_documents_(num_documents), seed_(seed), shuffle_(shuffle) {
  CPF_CHECK(num_documents >= 1, "DocumentOrder: num_documents=", num_documents, " must be at least 1");
}

int64_t DocumentOrder::document_at(int64_t epoch, int64_t index) {
  CPF_CHECK(index >= 0 && index < num_documents_, "DocumentOrder: index ", index, " is outside [0, ", num_documents_,
            ")");
  if (!shuffle_) return index;
  for (int slot = 0; slot < 2; ++slot) {
    if (cached_epoch_[slot] == epoch) return cached_order_[slot][index];
  }
  const int slot = next_slot_;
  next_slot_ = 1 - next_slot_;
  cached_order_[slot] = epoch_order(num_documents_, seed_, epoch, shuffle_);
  cached_epoch_[slot] = epoch;
  return cached_order_[slot][index];
}

}  // namespace cpf::models::data
