// The unfused CUDA attention path (unfused_attention.h): cuBLASLt GEMMs over strided views of Q, K,
// V and the gradients, and the row kernels of unfused_kernels.cu on score chunks.
//
// Addressing: a contiguous (token, head, dim) tensor of any format holds head h of the tokens of a
// sequence as a row-major matrix with row stride token_stride(heads, dim) starting at
// element_offset(row, col, ...) (attention_problem.h). For a fixed position j inside the GQA groups,
// query head g * G + j of kv head g is affine in g (stride G * dim in Q, dim in K and V), so one
// strided-batched GEMM covers all kv heads of a chunk; the loop runs over j. Chunks (which rows, heads
// and key columns) come from unfused_chunks.h.
#include <algorithm>
#include <limits>

#include "attention/cuda/device_tables.h"
#include "attention/cuda/unfused_attention.h"
#include "attention/cuda/unfused_chunks.h"
#include "attention/cuda/unfused_gemm.cuh"
#include "attention/cuda/unfused_kernels.cuh"
#include "framework/core/error.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/ops/copy.h"

namespace cpf::attention_cuda::unfused {
namespace {

// f64 stays f64 (gradcheck); f32 and bf16 compute in f32, like the CPU reference.
DType compute_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

Tensor prepare(const Tensor& t, DType dtype) { return raw::contiguous(raw::to(t, dtype)); }

// What every GEMM and kernel of a call shares.
struct Launch {
  int device = 0;
  DType dtype = DType::f32;  // compute dtype
  bool tf32 = false;         // f32 GEMMs on TF32 tensor cores (bf16 inputs, or cuda::allow_tf32())
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  const int64_t* q_pos = nullptr;  // device copies of p.q_pos / p.kv_pos
  const int64_t* kv_pos = nullptr;

  void gemm(int64_t batch, int64_t m, int64_t n, int64_t k, double alpha, const GemmOperand& a, const GemmOperand& b,
            double beta, const GemmOutput& c) const {
    unfused::gemm(device, dtype, tf32, batch, m, n, k, alpha, a, b, beta, c, workspace, stream);
  }
};

ScoreRows score_rows(const AttentionProblem& p, const Chunk& c, const Launch& l) {
  ScoreRows r;
  r.groups = c.kv_heads;
  r.rows = c.rows;
  r.cols = c.cols;
  r.head0 = c.g0 * p.group() + c.j;
  r.head_step = p.group();
  r.lse_row = c.seq->q_row;
  r.lse_col0 = c.seq->q_col + c.r0;
  r.h_q = p.h_q;
  r.s_q = p.s_q;
  r.q_pos = l.q_pos + c.seq->q_token + c.r0;
  r.kv_pos = l.kv_pos + c.seq->kv_token + c.c0;
  r.window_left = p.window.left;
  r.window_right = p.window.right;
  return r;
}

// The chunk's query rows of a (token, h_q, dim) tensor, batched over its kv heads' query heads.
template <class T>
GemmOperand query_rows(const AttentionProblem& p, const Chunk& c, const T* t, int64_t dim, bool transposed = false) {
  const AttentionSequence& s = *c.seq;
  const int64_t head = c.g0 * p.group() + c.j;
  return {t + p.element_offset(s.q_row, s.q_col + c.r0, p.s_q, head, p.h_q, dim), p.token_stride(p.h_q, dim),
          p.group() * dim, transposed};
}
template <class T>
GemmOutput query_rows_out(const AttentionProblem& p, const Chunk& c, T* t, int64_t dim) {
  const GemmOperand o = query_rows(p, c, t, dim);
  return {const_cast<void*>(o.data), o.ld, o.batch_stride};
}

// The chunk's key columns of a (token, h_kv, dim) tensor, batched over its kv heads.
template <class T>
GemmOperand kv_rows(const AttentionProblem& p, const Chunk& c, const T* t, int64_t dim, bool transposed = false) {
  const AttentionSequence& s = *c.seq;
  return {t + p.element_offset(s.kv_row, s.kv_col + c.c0, p.s_kv, c.g0, p.h_kv, dim), p.token_stride(p.h_kv, dim), dim,
          transposed};
}
template <class T>
GemmOutput kv_rows_out(const AttentionProblem& p, const Chunk& c, T* t, int64_t dim) {
  const GemmOperand o = kv_rows(p, c, t, dim);
  return {const_cast<void*>(o.data), o.ld, o.batch_stride};
}

// The chunk's (kv_heads, rows, cols) scores.
template <class T>
GemmOperand scores_of(const Chunk& c, const T* buffer, bool transposed = false) {
  return {buffer, c.cols, c.rows * c.cols, transposed};
}

// S = scale * Q K^T into `scores`.
template <class T>
void compute_scores(const AttentionProblem& p, const Launch& l, const Chunk& c, const T* q, const T* k, T* scores) {
  const GemmOperand s = scores_of(c, scores);
  l.gemm(c.kv_heads, c.rows, c.cols, p.d_qk, p.scale, query_rows(p, c, q, p.d_qk),
         kv_rows(p, c, k, p.d_qk, /*transposed=*/true), 0.0, {scores, s.ld, s.batch_stride});
}

template <class T>
void forward_typed(const AttentionProblem& p, const Launch& l, const T* q, const T* k, const T* v, T* out, T* lse,
                   T* scores, size_t budget) {
  for_each_chunk(p, sizeof(T), budget, [&](const Chunk& c) {
    compute_scores(p, l, c, q, k, scores);
    launch_softmax_rows<T>(score_rows(p, c, l), scores, lse, l.stream);
    // O rows = P V (complete for these rows: the chunk holds every key they see).
    l.gemm(c.kv_heads, c.rows, p.d_v, c.cols, 1.0, scores_of(c, scores), kv_rows(p, c, v, p.d_v), 0.0,
           query_rows_out(p, c, out, p.d_v));
  });
}

template <class T>
void backward_typed(const AttentionProblem& p, const Launch& l, const T* q, const T* k, const T* v, const T* dout,
                    const T* lse, const T* delta, T* dq, T* dk, T* dv, T* probs, T* dscores, size_t budget) {
  for_each_chunk(p, 2 * sizeof(T), budget, [&](const Chunk& c) {
    const int64_t kv_len = c.cols;
    compute_scores(p, l, c, q, k, probs);
    const GemmOperand ds = scores_of(c, dscores);
    // dP = dO V^T
    l.gemm(c.kv_heads, c.rows, kv_len, p.d_v, 1.0, query_rows(p, c, dout, p.d_v),
           kv_rows(p, c, v, p.d_v, /*transposed=*/true), 0.0, {dscores, ds.ld, ds.batch_stride});
    launch_backward_rows<T>(score_rows(p, c, l), probs, dscores, lse, delta, l.stream);
    // dV += P^T dO, dK += scale dS^T Q: summed over the group's query heads and the row chunks.
    l.gemm(c.kv_heads, kv_len, p.d_v, c.rows, 1.0, scores_of(c, probs, /*transposed=*/true),
           query_rows(p, c, dout, p.d_v), 1.0, kv_rows_out(p, c, dv, p.d_v));
    l.gemm(c.kv_heads, kv_len, p.d_qk, c.rows, p.scale, scores_of(c, dscores, /*transposed=*/true),
           query_rows(p, c, q, p.d_qk), 1.0, kv_rows_out(p, c, dk, p.d_qk));
    // dQ = scale dS K (complete for these rows: the chunk holds every key they see).
    l.gemm(c.kv_heads, c.rows, p.d_qk, kv_len, p.scale, scores_of(c, dscores), kv_rows(p, c, k, p.d_qk), 0.0,
           query_rows_out(p, c, dq, p.d_qk));
  });
}

void check_problem(const AttentionProblem& p, const Tensor& q, const char* op) {
  CPF_CHECK(q.device().is_cuda(), op, ": the unfused CUDA path needs CUDA tensors, got ", q.device());
  CPF_CHECK(p.d_qk > 0 && p.d_v > 0, op, ": head dims must be positive: d_qk=", p.d_qk, " d_v=", p.d_v);
}

// The device state of one call: stream, GEMM workspace and the positions on the device.
struct CallState {
  Launch launch;
  Tensor workspace, q_pos, kv_pos;
};

// bf16 inputs are exact in TF32, so their GEMMs take the tensor cores; only P and dS (f32 values)
// are rounded to TF32 (2^-11 relative), far below the bf16 rounding of the results. f32 inputs
// follow the process-wide cuda::allow_tf32() like every other f32 matmul.
CallState start_call(const AttentionProblem& p, const Device& device, DType input) {
  CallState st;
  st.launch.device = device.index;
  st.launch.dtype = compute_dtype(input);
  st.launch.tf32 = input == DType::bf16 || (input == DType::f32 && cuda::allow_tf32());
  st.launch.stream = cuda::current_cuda_stream(device.index);
  st.workspace = empty({static_cast<int64_t>(kGemmWorkspaceBytes)}, {.dtype = DType::boolean, .device = device});
  st.q_pos = device_table(from_vector(p.q_pos, {static_cast<int64_t>(p.q_pos.size())}), device);
  st.kv_pos = device_table(from_vector(p.kv_pos, {static_cast<int64_t>(p.kv_pos.size())}), device);
  st.launch.workspace = st.workspace.raw_data();
  st.launch.q_pos = static_cast<const int64_t*>(st.q_pos.raw_data());
  st.launch.kv_pos = static_cast<const int64_t*>(st.kv_pos.raw_data());
  return st;
}

bool any_work(const AttentionProblem& p) {
  return std::any_of(p.sequences.begin(), p.sequences.end(),
                     [](const AttentionSequence& s) { return s.q_len > 0 && s.kv_len > 0; });
}

}  // namespace

raw::AttentionForward forward(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Options& options) {
  check_problem(p, q, "attention_forward");
  const Device device = q.device();
  cuda::DeviceGuard guard(device.index);
  const DType ct = compute_dtype(q.dtype());
  Tensor out = zeros(p.out_shape(), {.dtype = ct, .device = device});  // 0 outside every sequence
  Tensor lse = full(p.lse_shape(), -std::numeric_limits<double>::infinity(), {.dtype = ct, .device = device});
  if (any_work(p)) {
    const Tensor qc = prepare(q, ct), kc = prepare(k, ct), vc = prepare(v, ct);
    const CallState st = start_call(p, device, q.dtype());
    const int64_t chunk = chunk_elements(p, dtype_size(ct), options.workspace_bytes);
    const Tensor scores = empty({chunk}, {.dtype = ct, .device = device});
    auto run = [&]<class T>() {
      forward_typed<T>(p, st.launch, qc.data<T>(), kc.data<T>(), vc.data<T>(), out.data<T>(), lse.data<T>(),
                       scores.data<T>(), options.workspace_bytes);
    };
    if (ct == DType::f64) {
      run.template operator()<double>();
    } else {
      run.template operator()<float>();
    }
  }
  return {raw::to(out, q.dtype()), lse, {}, false};
}

raw::AttentionGrads backward(const AttentionProblem& p, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Options& options) {
  check_problem(p, q, "attention_backward");
  const Device device = q.device();
  cuda::DeviceGuard guard(device.index);
  const DType ct = compute_dtype(q.dtype());
  // Zero where no sequence reaches (padding) and the accumulators of dK/dV.
  Tensor dq = zeros(q.shape(), {.dtype = ct, .device = device});
  Tensor dk = zeros(k.shape(), {.dtype = ct, .device = device});
  Tensor dv = zeros(v.shape(), {.dtype = ct, .device = device});
  if (any_work(p)) {
    const Tensor qc = prepare(q, ct), kc = prepare(k, ct), vc = prepare(v, ct);
    const Tensor oc = prepare(out, ct), doc = prepare(dout, ct), lc = prepare(lse, ct);
    const Tensor dlc = dlse.defined() ? prepare(dlse, ct) : Tensor();
    const CallState st = start_call(p, device, q.dtype());
    const Tensor delta = empty(p.lse_shape(), {.dtype = ct, .device = device});
    const int64_t chunk = chunk_elements(p, 2 * dtype_size(ct), options.workspace_bytes);
    const Tensor probs = empty({chunk}, {.dtype = ct, .device = device});
    const Tensor dscores = empty({chunk}, {.dtype = ct, .device = device});
    const DeltaParams dp{
        .batch = p.batch, .s_q = p.s_q, .h_q = p.h_q, .d_v = p.d_v, .sbhd = p.format == QkvFormat::sbhd};
    auto run = [&]<class T>() {
      launch_delta<T>(dp, oc.data<T>(), doc.data<T>(), dlc.defined() ? dlc.data<T>() : nullptr, delta.data<T>(),
                      st.launch.stream);
      backward_typed<T>(p, st.launch, qc.data<T>(), kc.data<T>(), vc.data<T>(), doc.data<T>(), lc.data<T>(),
                        delta.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(), probs.data<T>(), dscores.data<T>(),
                        options.workspace_bytes);
    };
    if (ct == DType::f64) {
      run.template operator()<double>();
    } else {
      run.template operator()<float>();
    }
  }
  return {raw::to(dq, q.dtype()), raw::to(dk, k.dtype()), raw::to(dv, v.dtype()), {}, {}};
}

}  // namespace cpf::attention_cuda::unfused
