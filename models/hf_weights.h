#pragma once
// Hugging Face transformers names and layouts of a GPT's weights, both ways (cpformer export --format
// hf, run.init_from). Two shapes of models::GPTOptions have an HF architecture that computes the same
// function:
//
//   GPT-2 (GPT2LMHeadModel): mha, positions: learned, norm: layernorm, bias: true, mlp: gelu (the tanh
//     approximation, HF's "gelu_new"), head_dim = hidden / heads, no window. HF's GPT-2 uses Conv1D
//     layers whose weight is (in, out), the transpose of a Linear's (out, in), and one fused c_attn =
//     [q | k | v] along the output dimension, so q/k/v_proj are transposed and concatenated.
//   Llama (LlamaForCausalLM): mha or gqa, positions: rope, norm: rmsnorm, mlp: swiglu, no window; bias:
//     true maps to attention_bias and mlp_bias. Projections keep the Linear layout. RoPE needs no
//     permutation: cpformer rotates pairs (x[i], x[i + d/2]) (framework/tensor/ops/rope.h), which is
//     HF Llama's rotate_half convention; the permutation in HF's convert_llama_weights_to_hf.py turns
//     Meta's interleaved pairs (x[2i], x[2i+1]) into exactly this layout.
//
// Names (cpformer <-> HF), for layer i:
//   embed_tokens.weight            transformer.wte.weight           model.embed_tokens.weight
//   embed_positions.weight         transformer.wpe.weight           -
//   blocks.i.attn_norm.*           transformer.h.i.ln_1.*           model.layers.i.input_layernorm.weight
//   blocks.i.attn.{q,k,v}_proj.*   transformer.h.i.attn.c_attn.*    model.layers.i.self_attn.{q,k,v}_proj.*
//   blocks.i.attn.o_proj.*         transformer.h.i.attn.c_proj.*    model.layers.i.self_attn.o_proj.*
//   blocks.i.mlp_norm.*            transformer.h.i.ln_2.*           model.layers.i.post_attention_layernorm.weight
//   blocks.i.mlp.fc_in.*           transformer.h.i.mlp.c_fc.*       -
//   blocks.i.mlp.fc_out.*          transformer.h.i.mlp.c_proj.*     -
//   blocks.i.mlp.{gate,up,down}_proj.weight                         model.layers.i.mlp.{gate,up,down}_proj.*
//   final_norm.*                   transformer.ln_f.*               model.norm.weight
//   lm_head.weight (untied only)   lm_head.weight                   lm_head.weight
// Tied embeddings write no lm_head.weight (HF's tie_word_embeddings re-ties it on load).
#include <optional>
#include <string>
#include <vector>

#include "framework/io/safetensors.h"
#include "models/gpt.h"

namespace cpf::models {

enum class HfArchitecture { gpt2, llama };

// "GPT2LMHeadModel" / "LlamaForCausalLM", and the config.json model_type ("gpt2" / "llama").
std::string hf_architecture_name(HfArchitecture arch);
std::string hf_model_type(HfArchitecture arch);

// The architecture computing the same function as a GPT of `options`, or why neither does: the first
// option that differs from each shape, e.g. "GPT-2 needs positions: learned (has rope); Llama needs
// mlp: swiglu (has gelu)".
struct HfMatch {
  std::optional<HfArchitecture> arch;
  std::string why_not;
};
HfMatch match_hf_architecture(const GPTOptions& options);

// The GPT's named parameters (GPT::named_parameters order) as HF tensors (host, contiguous, same dtype).
io::NamedTensors to_hf_weights(const GPTOptions& options, HfArchitecture arch, const io::NamedTensors& weights);

// HF tensors -> the cpformer names, shapes and dtypes of `params` (the model's named parameters, in
// their order). Every tensor the model needs must be present with its HF shape, and none may be left
// over (extra names are refused, listing them, except HF's non-parameter buffers attn.bias,
// attn.masked_bias and rotary_emb.inv_freq); GPT-2 names without the "transformer." prefix (the Hub's
// original gpt2 files) are accepted too. Errors name the HF tensor, the expected and found shape, and
// `where` (the file).
io::NamedTensors from_hf_weights(const GPTOptions& options, HfArchitecture arch, const io::NamedTensors& hf,
                                 const io::NamedTensors& params, const std::string& where);

}  // namespace cpf::models
