#pragma once
// Device op cases, continued (see op_cases.h): the fused classifier (LM head + cross-entropy in row
// chunks, framework/autograd/functions/classifier_loss.h).
#include <string>
#include <vector>

#include "autograd/op_cases.h"
#include "framework/autograd/functions/classifier_loss.h"

namespace cpf::testing::op_cases_detail {

// classifier_loss returns an f32 loss for bf16 inputs, computed from bf16 logits: the CPU's and the
// device's GEMMs round the logits to bf16 independently, so the f32 loss of a bf16 run carries bf16
// rounding differences and is held to the bf16 bound. Every other run and result: the default bounds.
inline Tolerance classifier_tolerance(DType run, DType result, double scale) {
  return tolerance_for(run == DType::bf16 ? DType::bf16 : result, false, scale);
}

inline OpCase classifier_case(std::string name, std::vector<CaseInput> inputs, ClassifierLossOptions options) {
  OpCase c{std::move(name), "classifier_loss", std::move(inputs),
           [options](const Inputs& x) -> Outputs { return {classifier_loss(x[0], x[1], x[2], options)}; }};
  c.tolerance = classifier_tolerance;
  return c;
}

// Ignored rows (whose gradients are zero), several chunks with a partial last one, i32 labels with
// another ignore_index, strided hidden and weight, a normalizer other than the valid count, and the
// single chunk chosen by memory.
inline void add_classifier_cases(std::vector<OpCase>& cases) {
  // 7 rows in chunks of 2: four chunks, the last one row.
  cases.push_back(classifier_case(
      "classifier_loss_ignore_chunks",
      {diff({7, 4}, -2, 2), diff({6, 4}, -2, 2), fixed(ids({0, 5, -100, 3, 3, -100, 1}, {7}))}, {.chunk_rows = 2}));
  // 6 rows in chunks of 4 (4 + 2), strided operands, ignore_index -1, summed loss / 9.
  cases.push_back(
      classifier_case("classifier_loss_i32_strided_normalizer",
                      {strided({6, 3}, -2, 2), strided({7, 3}, -2, 2), fixed(ids32({2, -1, 6, 0, -1, 1}, {6}))},
                      {.ignore_index = -1, .normalizer = 9, .chunk_rows = 4}));
  // chunk_rows 0: one chunk; no ignored row.
  cases.push_back(classifier_case("classifier_loss_one_chunk",
                                  {diff({5, 8}, -2, 2), diff({9, 8}, -2, 2), fixed(ids({8, 0, 4, 4, 2}, {5}))}, {}));
  // Every row ignored: loss 0, zero gradients.
  cases.push_back(classifier_case("classifier_loss_all_ignored",
                                  {diff({3, 4}), diff({5, 4}), fixed(ids({-100, -100, -100}, {3}))},
                                  {.chunk_rows = 2}));
}

}  // namespace cpf::testing::op_cases_detail
