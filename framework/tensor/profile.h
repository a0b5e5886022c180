#pragma once
// Profiling scopes for library and trainer code: one RAII type.
//
//   {
//     cpf::profile::Scope scope("attention");                     // NVTX range + host wall time
//     cpf::profile::Scope step("step", Device::cuda(0));          // ... + GPU time on cuda:0's current stream
//     cpf::profile::DeviceScope rank_device(Device::cuda(1));     // later Scope("x") on this thread time cuda:1
//     ...
//   }
//   cpf::profile::set_enabled(true);   // before the scopes whose times should be recorded
//   std::cout << cpf::profile::format_table(cpf::profile::snapshot());
//
// Every scope opens a range named `name` on the devices' profiler channel (NVTX on CUDA builds, so
// Nsight Systems shows it; nothing on CPU-only builds) whether or not recording is enabled: a range
// costs about as much as a function call when no profiler is attached.
//
// While recording is enabled (set_enabled(true), off by default), each scope also adds its host
// wall time to a process-wide table keyed by name, and a scope given a CUDA device adds its GPU time:
// two events recorded on the device's current stream of this thread (DeviceStream::current) at
// construction and destruction. The events are read later, never at scope end (that would
// synchronise the stream): snapshot() waits for the pending ones. Host time is what the scope's code
// took on the calling thread, including kernel launches but not the kernels; GPU time is what the
// device spent between the two events, including work other code queued there meanwhile.
//
// Thread-safe: scopes on different threads (ranks) add to the same table. Scopes nest; each entry
// counts only its own name (a parent's time includes its children's).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "framework/tensor/device.h"

namespace cpf {
class Tensor;
}  // namespace cpf

namespace cpf::profile {

// Recording on or off for the whole process (the NVTX ranges are unaffected).
void set_enabled(bool enabled);
bool enabled();

// The device whose current stream Scope(name) times on this thread: none by default. A rank thread
// (the trainer's, or a user's) sets it once, and library code then writes Scope("name") alone. RAII:
// restores the previous setting (scopes nest).
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  bool had_previous_ = false;
  Device previous_;
};
// This thread's device set by DeviceScope, or nullptr.
const Device* thread_device();

// The scopes open on this thread, outermost first, joined by " > " ("step > forward/attention"); "" when
// none. What an error raised inside them (a device out of memory) names as the phase it happened in.
std::string open_scopes();

// While recording: `flops` floating-point operations and `bytes` of memory traffic (read + written) done
// by the work just queued, added to every scope open on this thread, so the table can say what rate each
// scope achieved (TFLOP/s, GB/s over its GPU time). The ops that dominate a training step call it: the
// GEMMs (2 M N K), attention (2 x visible (query, key) pairs x heads x the head dims it multiplies), norms,
// activations, RoPE, the loss and the optimizer (bytes). Free when recording is off.
void add_work(double flops, double bytes);
// A tensor's bytes (numel x element size): what add_work's callers sum; 0 for an undefined tensor.
double tensor_bytes(const Tensor& t);

class Scope {
 public:
  // GPU time too when a DeviceScope of a CUDA device is open on this thread.
  explicit Scope(std::string_view name);
  // `device`: also measure GPU time on its current stream when it is a CUDA device and the CUDA
  // backend is linked (a CPU device measures host time only), whatever DeviceScope says.
  Scope(std::string_view name, Device device);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  const std::string& name() const { return name_; }
  void add_work(double flops, double bytes) {
    flops_ += flops;
    bytes_ += bytes;
  }

 private:
  void open(std::string_view name, const Device* device);
  std::string name_;
  double flops_ = 0, bytes_ = 0;
  int64_t start_ns_ = 0;
  void* gpu_timer_ = nullptr;  // the backend's event pair, or null
  DeviceType gpu_type_ = DeviceType::cpu;
  bool recording_ = false;
  bool range_open_ = false;
};

// One row of the table: every scope of that name closed since the last reset().
struct Stats {
  std::string name;
  int64_t calls = 0;
  double host_total_ms = 0;
  double host_max_ms = 0;
  int64_t gpu_calls = 0;  // the calls that measured GPU time
  double gpu_total_ms = 0;
  double gpu_max_ms = 0;
  double flops = 0, bytes = 0;  // add_work's totals inside the scope (its children included)
};

// The table, in the order names first closed a scope; waits for the GPU events still pending.
std::vector<Stats> snapshot();
// Empties the table (pending GPU timings are dropped).
void reset();
// A fixed-width text table: name, calls, host total/mean/max ms, GPU total/mean/max ms (or "-").
std::string format_table(const std::vector<Stats>& stats);

// What a device backend provides (the CUDA backend registers NVTX ranges and event timers when it
// is linked). Every pointer may be null.
struct DeviceHooks {
  void (*range_push)(const char* name) = nullptr;
  void (*range_pop)() = nullptr;
  // Records a start event on `device`'s current stream of this thread; returns the timer.
  void* (*timer_start)(Device device) = nullptr;
  // Records the end event on the stream the timer started on.
  void (*timer_stop)(void* timer) = nullptr;
  // Milliseconds between the events; with wait = false, -1 while the end event is not done yet.
  double (*timer_elapsed_ms)(void* timer, bool wait) = nullptr;
  void (*timer_release)(void* timer) = nullptr;
};
void register_device_hooks(DeviceType type, const DeviceHooks& hooks);

}  // namespace cpf::profile
