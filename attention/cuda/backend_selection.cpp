// Backend selection for CUDA attention calls (backend_selection.h).
#include "attention/cuda/backend_selection.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/logging.h"
#if CPF_HAVE_CUDNN
#include "attention/cuda/cudnn/fused_attention.h"
#endif

namespace cpf::attention_cuda {
namespace {

// The environment's request, or nullptr when CPF_ATTENTION_BACKEND is unset or empty.
const char* env_request() {
  const char* value = std::getenv(kBackendEnvVar);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

std::string mask_words(const AttentionWindow& w) {
  if (w.left < 0 && w.right < 0) return "no mask";
  if (w.left < 0 && w.right == 0) return "causal";
  std::ostringstream os;
  os << "window left=" << w.left << " right=" << w.right;
  return os.str();
}

// True when some sequence does not fill its bshd/sbhd row (a padding mask).
bool padded(const AttentionProblem& p) {
  if (p.format == QkvFormat::thd) return false;
  for (const AttentionSequence& s : p.sequences) {
    if (s.q_len != p.s_q || s.kv_len != p.s_kv) return true;
  }
  return false;
}

// Why cuDNN cannot run the call ("" when it can); the prepared call goes to `call` when it can.
std::string cudnn_reason(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse,
                         std::shared_ptr<const cudnn::PreparedCall>& call) {
#if CPF_HAVE_CUDNN
  // The first use also checks that the library loads at all.
  if (cudnn::runtime_version() == 0) return "cuDNN cannot be loaded on this machine (cudnnGetVersion failed)";
  // Its backward has no input for a gradient on lse (dispatch.cpp relies on this).
  if (backward && has_dlse) return "dlse is set (cuDNN's backward takes no gradient of the log-sum-exp)";
  std::shared_ptr<const cudnn::PreparedCall> prepared = cudnn::prepare_call(p, dtype, backward, has_dlse);
  std::string reason = cudnn::prepared_reason(*prepared);
  if (reason.empty()) call = std::move(prepared);
  return reason;
#else
  (void)p, (void)dtype, (void)backward, (void)has_dlse, (void)call;
  return "this build has no cuDNN (CPF_WITH_CUDNN=OFF)";
#endif
}

std::string requested_why(AttentionBackend configured) {
  if (const char* env = env_request()) return std::string("requested by ") + kBackendEnvVar + "=" + env;
  return "requested by attention.backend: " + std::string(attention_backend_name(configured));
}

}  // namespace

bool built_with_cudnn() {
#if CPF_HAVE_CUDNN
  return true;
#else
  return false;
#endif
}

AttentionBackend requested_backend(AttentionBackend configured) {
  const char* env = env_request();
  if (env == nullptr) return configured;
  try {
    return parse_attention_backend(env);
  } catch (const Error& e) {
    CPF_FAIL("environment variable ", kBackendEnvVar, "='", env, "' is not a valid attention backend: ", e.message(),
             "; unset it or use auto, cudnn or unfused");
  }
}

std::string describe_problem(const AttentionProblem& p, DType dtype, bool backward) {
  std::ostringstream os;
  os << dtype_name(dtype) << ", " << qkv_format_name(p.format) << ", " << mask_words(p.window);
  if (padded(p)) os << ", padded";
  os << ", b=" << p.batch << " hq=" << p.h_q << " hkv=" << p.h_kv << " sq=" << p.s_q << " skv=" << p.s_kv
     << " dqk=" << p.d_qk << " dv=" << p.d_v;
  if (p.format == QkvFormat::thd) os << " sequences=" << p.sequences.size();
  os << ", " << (backward ? "backward" : "forward");
  return os.str();
}

BackendChoice select_backend(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse) {
  const AttentionBackend requested = requested_backend(p.config.backend);
  switch (requested) {
    case AttentionBackend::unfused: return {AttentionBackend::unfused, requested_why(p.config.backend), nullptr};
    case AttentionBackend::cudnn: {
      std::shared_ptr<const cudnn::PreparedCall> call;
      const std::string reason = cudnn_reason(p, dtype, backward, has_dlse, call);
      CPF_CHECK(reason.empty(), "attention: backend cudnn cannot run ", describe_problem(p, dtype, backward), ": ",
                reason, "; use attention.backend: auto or unfused");
      return {AttentionBackend::cudnn, "", std::move(call)};
    }
    case AttentionBackend::automatic: {
      std::shared_ptr<const cudnn::PreparedCall> call;
      std::string reason = cudnn_reason(p, dtype, backward, has_dlse, call);
      if (reason.empty()) return {AttentionBackend::cudnn, "", std::move(call)};
      return {AttentionBackend::unfused, "cuDNN: " + reason, nullptr};
    }
  }
  CPF_FAIL("attention: unknown backend value ", static_cast<int>(requested));
}

std::string describe_selection(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse) {
  const BackendChoice choice = select_backend(p, dtype, backward, has_dlse);
  std::string text(attention_backend_name(choice.backend));
  if (!choice.why.empty()) text += " (" + choice.why + ")";
  return text;
}

namespace {

// The logged configuration as plain fields: every call compares one of these instead of formatting the
// process-wide key string, which only configurations new to this thread pay for.
struct LogKey {
  Device device;
  DType dtype = DType::f32;
  QkvFormat format = QkvFormat::bshd;
  AttentionWindow window;
  bool padded = false, backward = false, has_dlse = false;
  int64_t h_q = 0, h_kv = 0, d_qk = 0, d_v = 0;
  AttentionBackend backend = AttentionBackend::automatic;
  std::string why;
  bool operator==(const LogKey&) const = default;
};

bool seen_on_this_thread(LogKey key) {
  thread_local std::vector<LogKey> seen;
  if (std::find(seen.begin(), seen.end(), key) != seen.end()) return true;
  if (seen.size() < 256) seen.push_back(std::move(key));  // bounded: beyond, the process-wide key decides
  return false;
}

}  // namespace

BackendChoice select_and_log_backend(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse,
                                     const Device& device) {
  BackendChoice choice = select_backend(p, dtype, backward, has_dlse);
  if (seen_on_this_thread({device, dtype, p.format, p.window, padded(p), backward, has_dlse, p.h_q, p.h_kv, p.d_qk,
                           p.d_v, choice.backend, choice.why})) {
    return choice;
  }
  // One line per configuration: lengths and batch size are left out of the key, so a training run
  // with varying sequence lengths logs each configuration once, not every step.
  std::ostringstream key;
  key << device << ' ' << dtype_name(dtype) << ' ' << qkv_format_name(p.format) << ' ' << mask_words(p.window) << ' '
      << padded(p) << ' ' << p.h_q << ' ' << p.h_kv << ' ' << p.d_qk << ' ' << p.d_v << ' ' << backward << ' '
      << has_dlse << ' ' << attention_backend_name(choice.backend) << ' ' << choice.why;
  if (first_time_seen("attention backend", key.str())) {
    std::string line = "attention on " + device.str() + " (" + describe_problem(p, dtype, backward) +
                       "): " + std::string(attention_backend_name(choice.backend));
    if (!choice.why.empty()) line += " (" + choice.why + ")";
    log_info(line);
  }
  return choice;
}

}  // namespace cpf::attention_cuda
