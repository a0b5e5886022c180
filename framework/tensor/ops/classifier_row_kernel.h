#pragma once
// Which row pass the fused classifier's CUDA kernel runs (framework/tensor/cuda/classifier_loss.cu), chosen
// for a measurement through the environment variable CPF_CLASSIFIER_ROW_KERNEL (docs/training.md):
//   cached       a block of 512 threads per row, the row kept in shared memory between its two sweeps
//   rereadN      a block of N threads (256, 512, 1024) per row, no shared memory: the second sweep re-reads
//                the row (from L2 when it is still there)
//   auto         (or unset) cached when the row fits shared memory, else reread512
// cached for a row past the shared memory runs reread512. The passes (and a pipelined one, dropped) measured
// within noise of each other: docs/training.md, "The LM head and the loss", gives the figures and command.
#include <string>

namespace cpf::raw {

enum class ClassifierRowKernel { automatic, cached, reread256, reread512, reread1024 };

// Parses one of the names above; throws naming the value and the choices.
ClassifierRowKernel parse_classifier_row_kernel(const std::string& name);
// CPF_CLASSIFIER_ROW_KERNEL, parsed at the first call (unset: automatic); throws as the parser does.
ClassifierRowKernel classifier_row_kernel_from_env();

}  // namespace cpf::raw
