#pragma once
// The summation order of the embedding gradient, shared by the CPU op (embedding.cpp) and the device
// kernel (framework/tensor/cuda/embedding_backward.cu) so that both give the same bits: each id's
// occurrences in position order are cut into segments of kEmbeddingSegment rows; each segment is summed
// from 0 and the segments' sums are added in order (the first sum as it is). An id seen at most
// kEmbeddingSegment times is therefore summed plainly in position order. The segments let the device
// spread a long run of one id (padding, end-of-text, a frequent token) over many blocks.
#include <cstdint>

namespace cpf::raw {

inline constexpr int64_t kEmbeddingSegment = 64;

}  // namespace cpf::raw
