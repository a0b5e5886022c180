#include "models/gpt_input.h"

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::models {

GPTBatch make_gpt_batch(const data::LocalBatch& local) {
  CPF_CHECK(local.tokens.defined() && local.labels.defined() && local.positions.defined(),
            "make_gpt_batch: the local batch has undefined tensors");
  GPTBatch out;
  out.num_valid_labels = local.num_valid_labels;
  out.global_num_valid_labels = local.global_num_valid_labels;
  if (local.layout == data::Layout::thd) {
    out.input.tokens = local.tokens;
    out.input.positions = local.positions;
    out.labels = local.labels;
    out.input.seq = SequenceInfo::from_cu_seqlens(local.thd.cu_seqlens, local.thd.cu_seqlens_padded);
    return out;
  }
  CPF_CHECK(local.tokens.dim() == 2, "make_gpt_batch: bshd tokens must be (B, T), got ", local.tokens.shape());
  const int64_t rows = local.tokens.size(0), local_len = local.tokens.size(1);
  const int64_t global_len = local_len * local.cp_size;
  std::vector<int64_t> cu{0};
  for (int64_t r = 0; r < rows; ++r) cu.push_back(cu.back() + global_len);
  out.input.tokens = contiguous(reshape(local.tokens, {rows * local_len}));
  out.input.positions = contiguous(reshape(local.positions, {rows * local_len}));
  out.labels = contiguous(reshape(local.labels, {rows * local_len}));
  out.input.seq = SequenceInfo::from_cu_seqlens(cu, cu);
  return out;
}

GPTBatch to_device(GPTBatch batch, Device device) {
  batch.input.tokens = raw::to(batch.input.tokens, device);
  batch.input.positions = raw::to(batch.input.positions, device);
  batch.labels = raw::to(batch.labels, device);
  return batch;
}

GPTInput make_prompt_input(const std::vector<std::vector<int64_t>>& prefixes, Device device) {
  CPF_CHECK(!prefixes.empty(), "make_prompt_input: no prompts");
  std::vector<int64_t> tokens, positions, lengths;
  for (const auto& p : prefixes) {
    CPF_CHECK(!p.empty(), "make_prompt_input: an empty prompt (start it with the end-of-text token)");
    for (size_t i = 0; i < p.size(); ++i) {
      tokens.push_back(p[i]);
      positions.push_back(static_cast<int64_t>(i));
    }
    lengths.push_back(static_cast<int64_t>(p.size()));
  }
  const int64_t t = static_cast<int64_t>(tokens.size());
  return GPTInput{from_vector(tokens, {t}, device), from_vector(positions, {t}, device),
                  SequenceInfo::from_lengths(lengths)};
}

std::vector<int64_t> last_token_rows(const std::vector<std::vector<int64_t>>& prefixes) {
  std::vector<int64_t> rows;
  int64_t end = 0;
  for (const auto& p : prefixes) {
    end += static_cast<int64_t>(p.size());
    rows.push_back(end - 1);
  }
  return rows;
}

}  // namespace cpf::models
