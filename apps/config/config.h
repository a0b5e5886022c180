#pragma once
// TrainConfig: everything `cpformer train` reads from YAML, one section per component:
//
//   run:        run folder, steps, logging, evaluation, checkpoints, stopping targets
//   model:      models::GPTOptions (models/gpt.h)
//   optimizer:  AdamW or SGD hyper-parameters
//   schedule:   learning-rate warmup and decay
//   data:       models::data::DataOptions (models/data/data_options.h, docs/data.md)
//   parallel:   data and context parallelism over thread ranks
//   attention:  which attention kernels run on CUDA tensors (backend, deterministic)
//
// Field names are the YAML keys (docs/config.md is generated from these describe() functions).
// load_train_config reads a file with --set overrides and runs every cross-field check, including
// the context-parallel support check, reporting the first problem as a config::ConfigError
// "file:line:column: key.path=value problem".
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_backend.h"
#include "attention/cp/context_parallel.h"
#include "framework/config/schema.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/zero_shards.h"
#include "framework/optim/adamw.h"
#include "framework/optim/lr_schedule.h"
#include "framework/optim/sgd.h"
#include "models/data/data_options.h"
#include "models/gpt.h"

namespace cpf::models::data {

// The `data:` section (keys documented in docs/data.md).
template <class V>
void describe(V& v, DataOptions& o) {
  using config::Range;
  using Names = config::Choices<std::string>;
  v.choice("source", o.source, Names{{"synthetic", "synthetic"}, {"text", "text"}, {"shards", "shards"}},
           "built-in synthetic task, byte-level text files, or llm.c token shards");
  v.choice("task", o.task, Names{{"addition", "addition"}, {"sort", "sort"}, {"copy", "copy"}, {"reverse", "reverse"}},
           "synthetic: the task");
  v.field("min_len", o.min_len, "synthetic: fewest digits per operand (addition) or list items", Range{1, 1e6});
  v.field("max_len", o.max_len, "synthetic: most digits per operand (addition, <= 18) or list items", Range{1, 1e6});
  v.field("num_examples", o.num_examples, "synthetic: training examples (documents per epoch)", Range{1, 1e12});
  v.field("path", o.path, "text / shards: a file, or a pattern with * and ? in the file name");
  v.choice("text_split", o.text_split,
           Names{{"blank_lines", "blank_lines"}, {"separator", "separator"}, {"file", "file"}},
           "text: how files are cut into documents");
  v.field("text_separator", o.text_separator, "text: the separator when text_split is separator");
  v.field("eot_token", o.eot_token, "shards: the end-of-text token id", Range{0, 2147483647});
  v.field("vocab_size", o.vocab_size, "shards: every token id must be below it", Range{1, 2147483648.0});
  v.field("tokenizer", o.tokenizer,
          "text: bytes (default), gpt2, or a tokenizer.json / SentencePiece .model file; shards: the one they were "
          "made with (default gpt2 when eot_token is 50256), for generate");
  v.choice("layout", o.layout, Names{{"thd", "thd"}, {"bshd", "bshd"}},
           "thd: packed documents, attention never crosses them; bshd: fixed (batch_size, seq_len) rows");
  v.choice("bshd_fill", o.bshd_fill, Names{{"document", "document"}, {"window", "window"}},
           "bshd: one document piece per row, or windows of the contiguous stream (llm.c style)");
  v.field("seq_len", o.seq_len, "thd: longest piece of a document; bshd: row length", Range{1, 1e7});
  v.field("batch_size", o.batch_size, "bshd: rows per batch; thd: sets the default tokens_per_batch", Range{1, 1e7});
  v.field("tokens_per_batch", o.tokens_per_batch, "thd: storage tokens per batch and DP rank; 0 = batch_size x seq_len",
          Range{0, 1e9});
  v.field("total_batch_tokens", o.total_batch_tokens,
          "tokens per optimizer step over all DP ranks (gradient accumulation: a multiple of tokens per batch x "
          "parallel.dp); 0 = one batch per step (or run.grad_accum_steps)",
          Range{0, 1e15});
  v.field("pad_multiple", o.pad_multiple, "pad every sequence slot to a multiple; under CP a multiple of 2 x cp",
          Range{1, 1e6});
  int64_t seed = static_cast<int64_t>(o.seed);
  v.field("seed", seed, "document order and synthetic examples", Range{0, 1e18});
  o.seed = static_cast<uint64_t>(seed);
  v.field("shuffle", o.shuffle, "shuffle the document order every epoch");
}

}  // namespace cpf::models::data

namespace cpf {

// run.precision: fp8's scaling recipe (framework/autograd/fp8_scaling.h); here, next to its type's namespace,
// for the schema's argument-dependent lookup.
template <class V>
void describe(V& v, Fp8ScalingOptions& o) {
  using config::Range;
  v.choice("recipe", o.recipe,
           config::Choices<Fp8Recipe>{{"current", Fp8Recipe::current}, {"delayed", Fp8Recipe::delayed}},
           "current: each tensor's scale from its own amax just before its cast (no state); delayed: from the "
           "amax history of earlier steps, the casts recording this step's (TransformerEngine's DelayedScaling)");
  v.field("margin", o.margin, "headroom: scales are 448 (E4M3) or 57344 (E5M2) / amax / 2^margin", Range{0, 64});
  v.field("amax_history", o.amax_history, "delayed: steps of amax kept per tensor", Range{1, 4096});
  v.choice(
      "amax_compute", o.amax_compute,
      config::Choices<raw::AmaxCompute>{{"max", raw::AmaxCompute::max}, {"most_recent", raw::AmaxCompute::most_recent}},
      "delayed: the scale follows the history's max, or its newest amax");
  v.field("cache_weights", o.cache_weights,
          "cast each weight to FP8 once per step and reuse it in recomputed blocks and later micro-batches (2 bytes "
          "a weight parameter while the step runs; off: cast at every call)");
  v.field("bf16_first_blocks", o.bf16_first_blocks,
          "the first N transformer blocks keep their linears in bf16 (the most quantisation-sensitive)", Range{0, 1e6});
  v.field("bf16_last_blocks", o.bf16_last_blocks, "the last N transformer blocks keep their linears in bf16",
          Range{0, 1e6});
  v.field("fast_forward_accumulation", o.fast_forward_accumulation,
          "the forward FP8 GEMMs with cuBLASLt's fast accumulation (partial sums not promoted to f32: faster, less "
          "exact; TransformerEngine's forward default; no effect on the CPU)");
  v.field("fuse_activation_casts", o.fuse_activation_casts,
          "the MLP's GELU or SwiGLU writes the FP8 codes of its output projection's input in one pass (the output "
          "never in bf16; the same values; measured faster on an H100, docs/fp8.md); false: the activation writes bf16 "
          "and the linear casts it");
}

// model.rope_scaling: Llama 3's RoPE frequency scaling (framework/tensor/rope_frequencies.h); here too for
// the schema's argument-dependent lookup.
template <class V>
void describe(V& v, RopeScaling& o) {
  using config::Range;
  v.field("factor", o.factor,
          "Llama 3's RoPE scaling (HF rope_type llama3): how much longer the context is than the original; 1 = none",
          Range{1, 1e6});
  v.field("low_freq_factor", o.low_freq_factor, "wavelengths above original / low_freq_factor are divided by factor",
          Range{1e-6, 1e6});
  v.field("high_freq_factor", o.high_freq_factor,
          "wavelengths below original / high_freq_factor stay as they are (above low_freq_factor)", Range{1e-6, 1e6});
  v.field("original_max_position_embeddings", o.original_context, "the context the model was first trained at",
          Range{1, 1e9});
}

}  // namespace cpf

namespace cpf::trainer {

enum class ResumeMode { auto_resume, never, replace };
enum class OptimizerType { adamw, sgd };
enum class RunDevice { cpu, cuda };
// Compute precision: fp32 everywhere, or bf16 activations and GEMMs over f32 master weights,
// optimizer state, norms, reductions, LSE and loss (docs/training.md).
// fp8: bf16, with the transformer blocks' linear layers' GEMMs in FP8 (docs/fp8.md).
enum class PrecisionMode { fp32, bf16, fp8 };

struct RunOptions {
  std::string name = "run";
  std::string out_dir;  // "" = runs/<name>
  int64_t seed = 1234;  // model initialisation
  int64_t steps = 1000;
  int64_t log_every = 10;
  int64_t eval_every = 100;      // 0 = only at the end
  int64_t eval_batches = 4;      // held-out batches per evaluation (loss)
  int64_t eval_examples = 200;   // synthetic: exact-match examples per evaluation
  std::string eval_path;         // text / shards: held-out files; "" = no held-out loss
  int64_t checkpoint_every = 0;  // 0 = only at the end
  int64_t keep_checkpoints = 2;
  ResumeMode resume = ResumeMode::auto_resume;
  int64_t profile = 0;                // profile this many steps after the first (step_profiler.h); 0 = off
  int64_t max_nonfinite_steps = 20;   // stop after this many consecutive non-finite steps; 0 = never
  double grad_clip = 1.0;             // 0 = no clipping
  double target_accuracy = 0.0;       // > 0: stop once exact-match accuracy reaches it
  double target_loss = 0.0;           // > 0: stop once the held-out loss falls to it
  int64_t threads = 0;                // OpenMP threads per rank; 0 = cores / ranks
  int64_t grad_accum_steps = 1;       // micro-batches per optimizer step (apps/trainer/step/grad_accumulation.h)
  std::string init_from;              // starting weights: a cpformer checkpoint or an HF folder (init_from.h)
  RunDevice device = RunDevice::cpu;  // cuda: rank r on cuda:(r % visible GPUs)
  PrecisionMode precision = PrecisionMode::fp32;
  bool cuda_graph = true;  // one GPU: capture a step's forward and backward once, replay it (step_graph.h)
};

struct OptimizerOptions {
  OptimizerType type = OptimizerType::adamw;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  bool decay_all = false;
};

struct ScheduleOptions {
  optim::LrDecay decay = optim::LrDecay::cosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  int64_t total_steps = 0;  // 0 = run.steps
};

struct ParallelOptions {
  int64_t dp = 1;
  int64_t cp = 1;
  cp::CommType cp_comm_type = cp::CommType::p2p;
  int64_t cp_a2a_size = 2;         // a2a+p2p: ranks of each a2a sub-group (cp = cp_a2a_size x p2p size)
  int64_t cp_a2a_head_groups = 0;  // a2a, a2a+p2p: ContextParallel::a2a_head_groups (0 = automatic)
  // thread: ranks are threads meeting in host memory (any device); nccl: one GPU per rank, NCCL
  // collectives (threads of this process, or one process per rank under torchrun/srun/mpirun).
  dist::Backend backend = dist::Backend::thread;
  // Training state sharded over the dp x cp ranks (framework/distributed/zero_shards.h).
  dist::ShardStage shard = dist::ShardStage::none;
};

// The `attention:` section: AttentionKernelConfig of every attention call (attention/attention_problem.h).
struct AttentionOptions {
  AttentionBackend backend = AttentionBackend::automatic;
  bool deterministic = false;
  cp::MlaLatentMode cp_mla_latent = cp::MlaLatentMode::automatic;  // MLA under ring CP (latent_kv.h)
};

struct TrainConfig {
  RunOptions run;
  models::GPTOptions model;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  models::data::DataOptions data;
  ParallelOptions parallel;
  AttentionOptions attention;
  Fp8ScalingOptions fp8;  // run.precision: fp8's scaling recipe
};

template <class V>
void describe(V& v, RunOptions& o) {
  using config::Range;
  v.field("name", o.name, "run name, used in logs and the default run folder");
  v.field("out_dir", o.out_dir, "run folder (config.yaml, metrics.jsonl, checkpoints/); empty = runs/<name>");
  v.field("seed", o.seed, "seed of the model initialisation", Range{0, 1e18});
  v.field("steps", o.steps, "optimizer steps to train", Range{1, 1e12});
  v.field("log_every", o.log_every, "print and record a metrics line every N steps", Range{1, 1e12});
  v.field("eval_every", o.eval_every, "evaluate every N steps; 0 = only at the end", Range{0, 1e12});
  v.field("eval_batches", o.eval_batches, "held-out batches per evaluation (loss)", Range{0, 1e6});
  v.field("eval_examples", o.eval_examples, "synthetic: held-out examples for exact-match accuracy", Range{0, 1e7});
  v.field("eval_path", o.eval_path, "text / shards: held-out files for the eval loss; empty = none");
  v.field("checkpoint_every", o.checkpoint_every,
          "save a checkpoint every N steps (and always at the end); 0 = end only", Range{0, 1e12});
  v.field("keep_checkpoints", o.keep_checkpoints, "checkpoints kept in the run folder; 0 = all", Range{0, 1e6});
  v.choice("resume", o.resume,
           config::Choices<ResumeMode>{
               {"auto", ResumeMode::auto_resume}, {"never", ResumeMode::never}, {"replace", ResumeMode::replace}},
           "auto: continue from the newest valid checkpoint in the run folder; never: start over, refused when the "
           "folder holds checkpoints; replace: start over, deleting its checkpoints and metrics");
  v.field("profile", o.profile,
          "time this many steps after the first per module and autograd op (GPU events, NVTX ranges); the table "
          "is printed and written to profile.txt; 0 = off",
          Range{0, 1e9});
  v.field("max_nonfinite_steps", o.max_nonfinite_steps,
          "stop with an error after this many consecutive steps with a non-finite gradient norm; 0 = never",
          Range{0, 1e12});
  v.field("grad_clip", o.grad_clip, "clip the global gradient norm to this; 0 = no clipping", Range{0, 1e9});
  v.field("target_accuracy", o.target_accuracy, "synthetic: stop once exact-match accuracy reaches it; 0 = off",
          Range{0, 1});
  v.field("target_loss", o.target_loss, "stop once the held-out loss falls to it; 0 = off", Range{0, 1e9});
  v.field("threads", o.threads, "OpenMP threads per rank; 0 = cores / ranks", Range{0, 1024});
  v.field("grad_accum_steps", o.grad_accum_steps,
          "micro-batches per optimizer step, accumulated exactly as one batch (or set data.total_batch_tokens)",
          Range{1, 1e6});
  v.field("init_from", o.init_from,
          "start from these weights (fine-tuning): a cpformer checkpoint or run folder, or a Hugging Face folder "
          "(config.json + model.safetensors, GPT-2 or Llama shape); empty = random init; ignored when resuming");
  v.choice("device", o.device, config::Choices<RunDevice>{{"cpu", RunDevice::cpu}, {"cuda", RunDevice::cuda}},
           "where every rank computes: cpu, or cuda (rank r on GPU r % visible GPUs)");
  v.choice("precision", o.precision,
           config::Choices<PrecisionMode>{
               {"fp32", PrecisionMode::fp32}, {"bf16", PrecisionMode::bf16}, {"fp8", PrecisionMode::fp8}},
           "fp32, or bf16 activations and GEMMs with f32 master weights, optimizer state, norms and loss; fp8: "
           "bf16 with the blocks' linear layers in FP8 (scaling recipe: the fp8 section; docs/fp8.md)");
  v.field("cuda_graph", o.cuda_graph,
          "cuda, one GPU: capture the forward and backward of the second step in a CUDA graph and replay it every "
          "later step (the run logs why when it cannot); false = every step eager");
}

template <class V>
void describe(V& v, OptimizerOptions& o) {
  using config::Range;
  v.choice("type", o.type, config::Choices<OptimizerType>{{"adamw", OptimizerType::adamw}, {"sgd", OptimizerType::sgd}},
           "update rule");
  v.field("lr", o.lr, "peak learning rate", Range{0, 10});
  v.field("beta1", o.beta1, "adamw: first-moment decay", Range{0, 0.999999});
  v.field("beta2", o.beta2, "adamw: second-moment decay", Range{0, 0.999999});
  v.field("eps", o.eps, "adamw: denominator epsilon", Range{1e-30, 1});
  v.field("weight_decay", o.weight_decay, "decoupled (adamw) or L2 (sgd) weight decay of matrices", Range{0, 10});
  v.field("momentum", o.momentum, "sgd: momentum", Range{0, 0.999999});
  v.field("nesterov", o.nesterov, "sgd: Nesterov momentum");
  v.field("decay_all", o.decay_all, "also decay norms, biases and embeddings");
}

template <class V>
void describe(V& v, ScheduleOptions& o) {
  using config::Range;
  v.choice("decay", o.decay,
           config::Choices<optim::LrDecay>{{"cosine", optim::LrDecay::cosine},
                                           {"linear", optim::LrDecay::linear},
                                           {"constant", optim::LrDecay::constant}},
           "learning-rate shape after warmup");
  v.field("warmup_steps", o.warmup_steps, "linear warmup steps", Range{0, 1e12});
  v.field("min_lr_ratio", o.min_lr_ratio, "floor of the decay, as a fraction of optimizer.lr", Range{0, 1});
  v.field("total_steps", o.total_steps, "step at which the floor is reached; 0 = run.steps", Range{0, 1e12});
}

template <class V>
void describe(V& v, ParallelOptions& o) {
  using config::Range;
  v.field("dp", o.dp, "data-parallel ranks (threads on CPU)", Range{1, 4096});
  v.field("cp", o.cp, "context-parallel ranks per data-parallel rank", Range{1, 4096});
  v.choice("cp_comm_type", o.cp_comm_type,
           config::Choices<cp::CommType>{{"p2p", cp::CommType::p2p},
                                         {"all_gather", cp::CommType::all_gather},
                                         {"a2a", cp::CommType::a2a},
                                         {"a2a+p2p", cp::CommType::a2a_p2p}},
           "context-parallel strategy of every attention layer");
  v.field("cp_a2a_size", o.cp_a2a_size, "a2a+p2p: ranks of each a2a sub-group (cp = cp_a2a_size x ring size)",
          Range{1, 4096});
  v.field("cp_a2a_head_groups", o.cp_a2a_head_groups,
          "a2a, a2a+p2p: head groups whose all-to-alls pipeline with attention; 0 = automatic (1: no pipelining, the "
          "measured best on NVLink)",
          Range{0, 64});
  v.choice("backend", o.backend,
           config::Choices<dist::Backend>{{"thread", dist::Backend::thread}, {"nccl", dist::Backend::nccl}},
           "thread: ranks are threads meeting in host memory; nccl: one GPU per rank (needs run.device: cuda; "
           "set by --gpus N and under torchrun/srun/mpirun)");
  v.choice("shard", o.shard,
           config::Choices<dist::ShardStage>{{"none", dist::ShardStage::none},
                                             {"optimizer", dist::ShardStage::optimizer},
                                             {"gradients", dist::ShardStage::gradients},
                                             {"parameters", dist::ShardStage::parameters}},
           "training state sharded over the dp x cp ranks: optimizer (ZeRO-1: AdamW moments), gradients (ZeRO-2: "
           "also the reduced gradients), parameters (ZeRO-3: also the weights, gathered per block; needs "
           "model.recompute on every block)");
}

template <class V>
void describe(V& v, AttentionOptions& o) {
  using B = AttentionBackend;
  v.choice("backend", o.backend,
           config::Choices<B>{{std::string(attention_backend_name(B::automatic)), B::automatic},
                              {std::string(attention_backend_name(B::cudnn)), B::cudnn},
                              {std::string(attention_backend_name(B::unfused)), B::unfused}},
           "CUDA attention kernels: auto (cuDNN when it can run the call, else unfused), cudnn or unfused");
  v.field("deterministic", o.deterministic,
          "CUDA: bitwise reproducible attention backward (cuDNN's slower path; the CPU always is)");
  using M = cp::MlaLatentMode;
  v.choice("cp_mla_latent", o.cp_mla_latent, config::Choices<M>{{"auto", M::automatic}, {"on", M::on}, {"off", M::off}},
           "MLA under p2p, all_gather or a2a+p2p CP: move the latent (kv_lora_rank + rope per token) instead of the "
           "expanded K/V; auto weighs the communication the attention does not hide against the re-expansion and logs "
           "why (CPF_CP_LINK_GBPS sets the link rate)");
}

template <class V>
void describe(V& v, TrainConfig& c) {
  v.section("run", c.run, "run folder, length, logging, evaluation, checkpoints");
  v.section("model", c.model, "GPT architecture");
  v.section("optimizer", c.optimizer, "AdamW or SGD");
  v.section("schedule", c.schedule, "learning-rate schedule");
  v.section("data", c.data, "data source and batches");
  v.section("parallel", c.parallel, "data and context parallelism");
  v.section("attention", c.attention, "attention kernels on CUDA tensors");
  v.section("fp8", c.fp8, "run.precision: fp8: how the FP8 GEMMs' scales are chosen (docs/fp8.md)");
}

// Reads `path` with `overrides` ("a.b=c"), fills defaults that depend on other sections (the model's
// vocab_size from the data source), and checks every combination. Throws config::ConfigError.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text (`name` appears in messages), e.g. the config stored in a checkpoint.
TrainConfig load_train_config_string(const std::string& yaml, const std::string& name,
                                     const std::vector<std::string>& overrides = {});

// The effective config as YAML (what the run folder's config.yaml holds).
std::string to_yaml(const TrainConfig& config);
// A Markdown table of every key, its type, default and meaning (docs/config.md).
std::string config_docs_markdown();

// Helpers derived from the config.
std::string run_dir(const TrainConfig& config);
int64_t data_vocab_size(const models::data::DataOptions& options);  // without opening the source
optim::LrScheduleOptions schedule_options(const TrainConfig& config);
// The model options the trainer builds: model: plus the compute dtype (run.precision) and the attention
// kernels (attention:).
models::GPTOptions model_options(const TrainConfig& config);
DType compute_dtype(const TrainConfig& config);  // bf16 for run.precision: bf16, else the parameter dtype
// What computes in which precision, for the run's banner and check-config: "fp32", "bf16 (f32 master
// weights)", or "fp8 linears (delayed scaling: amax history 16, max; margin 0), bf16 (f32 master weights)".
std::string precision_description(const TrainConfig& config);
AttentionKernelConfig attention_kernel_config(const TrainConfig& config);
// The device rank `rank` computes on: cpu, or cuda:(rank % visible GPUs). Throws, naming the fix, when
// run.device is cuda and the build has no CUDA backend or no GPU is visible (checked when training
// starts, not when the config is read, so GPU configs can be checked anywhere).
Device rank_device_of(const TrainConfig& config, int rank);
// The context-parallel verdict for the model and data of `config` (nullopt = supported or cp = 1).
std::optional<std::string> cp_problem(const TrainConfig& config);
// Why parallel.cp_a2a_head_groups cannot split the heads each rank attends under a2a or a2a+p2p (nullopt = it can).
std::optional<std::string> a2a_head_groups_problem(const TrainConfig& config);

}  // namespace cpf::trainer
