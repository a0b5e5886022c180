#include "framework/tensor/profile.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "framework/core/error.h"
#include "framework/tensor/tensor.h"

namespace cpf::profile {
namespace {

constexpr size_t kDeviceTypes = 2;
// Pending GPU timers beyond this are resolved (waited for) at the next scope end, bounding memory
// when nobody calls snapshot() for a long run.
constexpr size_t kMaxPending = 4096;

struct PendingTimer {
  size_t row = 0;
  DeviceType type = DeviceType::cuda;
  void* timer = nullptr;
};

struct Table {
  std::mutex mutex;
  std::vector<Stats> rows;
  std::unordered_map<std::string, size_t> index;
  std::deque<PendingTimer> pending;
};

Table& table() {
  static Table* t = new Table;  // process lifetime: scopes may close during static destruction
  return *t;
}

std::array<DeviceHooks, kDeviceTypes>& hooks() {
  static std::array<DeviceHooks, kDeviceTypes> h{};
  return h;
}

std::atomic<bool> g_enabled{false};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t row_for(Table& t, const std::string& name) {
  auto it = t.index.find(name);
  if (it != t.index.end()) return it->second;
  t.rows.push_back(Stats{.name = name});
  t.index.emplace(name, t.rows.size() - 1);
  return t.rows.size() - 1;
}

void add_gpu_time(Stats& row, double ms) {
  row.gpu_calls += 1;
  row.gpu_total_ms += ms;
  row.gpu_max_ms = std::max(row.gpu_max_ms, ms);
}

// Reads (and releases) the pending timers from the front; without `wait`, stops at the first one
// not done yet. Called with the table's mutex held.
void resolve_pending(Table& t, bool wait, size_t keep = 0) {
  while (t.pending.size() > keep) {
    const PendingTimer p = t.pending.front();
    const DeviceHooks& h = hooks()[static_cast<size_t>(p.type)];
    const double ms = h.timer_elapsed_ms(p.timer, wait);
    if (ms < 0 && !wait) return;
    t.pending.pop_front();
    if (ms >= 0 && p.row < t.rows.size()) add_gpu_time(t.rows[p.row], ms);
    h.timer_release(p.timer);
  }
}

const DeviceHooks* range_hooks() {
  for (const DeviceHooks& h : hooks()) {
    if (h.range_push && h.range_pop) return &h;
  }
  return nullptr;
}

}  // namespace

void set_enabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }
bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

void register_device_hooks(DeviceType type, const DeviceHooks& h) {
  CPF_CHECK(static_cast<size_t>(type) < kDeviceTypes, "profile::register_device_hooks: unknown device type ",
            static_cast<int>(type));
  CPF_CHECK((h.timer_start == nullptr) == (h.timer_stop == nullptr) &&
                (h.timer_start == nullptr) == (h.timer_elapsed_ms == nullptr) &&
                (h.timer_start == nullptr) == (h.timer_release == nullptr),
            "profile::register_device_hooks: the four timer hooks come together (all set or all null)");
  std::lock_guard<std::mutex> lock(table().mutex);
  hooks()[static_cast<size_t>(type)] = h;
}

namespace {
thread_local bool t_has_device = false;
thread_local Device t_device;
}  // namespace

DeviceScope::DeviceScope(Device device) : had_previous_(t_has_device), previous_(t_device) {
  t_has_device = true;
  t_device = device;
}

DeviceScope::~DeviceScope() {
  t_has_device = had_previous_;
  t_device = previous_;
}

const Device* thread_device() { return t_has_device ? &t_device : nullptr; }

Scope::Scope(std::string_view name) { open(name, thread_device()); }
Scope::Scope(std::string_view name, Device device) { open(name, &device); }

namespace {
thread_local std::vector<Scope*> open_scope_stack;  // this thread's open scopes, outermost first
}  // namespace

std::string open_scopes() {
  std::string path;
  for (const Scope* scope : open_scope_stack) path += (path.empty() ? "" : " > ") + scope->name();
  return path;
}

double tensor_bytes(const Tensor& t) {
  return t.defined() ? static_cast<double>(t.numel()) * static_cast<double>(dtype_size(t.dtype())) : 0.0;
}

void add_work(double flops, double bytes) {
  if (!enabled()) return;
  // Every open scope: a parent's row covers its children's time, so it covers their work too.
  for (Scope* scope : open_scope_stack) scope->add_work(flops, bytes);
}

void Scope::open(std::string_view name, const Device* device) {
  name_ = std::string(name);
  open_scope_stack.push_back(this);
  recording_ = enabled();
  if (recording_ && device != nullptr && !device->is_cpu()) {
    const DeviceHooks& h = hooks()[static_cast<size_t>(device->type)];
    if (h.timer_start) {
      gpu_timer_ = h.timer_start(*device);
      gpu_type_ = device->type;
    }
  }
  if (const DeviceHooks* h = range_hooks()) {
    h->range_push(name_.c_str());
    range_open_ = true;
  }
  if (recording_) start_ns_ = now_ns();
}

Scope::~Scope() {
  if (recording_) {
    const double host_ms = static_cast<double>(now_ns() - start_ns_) / 1e6;
    const DeviceHooks& h = hooks()[static_cast<size_t>(gpu_type_)];
    if (gpu_timer_) {
      // A destructor must not throw: a device error here drops this GPU timing (the next CUDA call of the
      // program reports the error).
      try {
        h.timer_stop(gpu_timer_);
      } catch (...) {
        h.timer_release(gpu_timer_);
        gpu_timer_ = nullptr;
      }
    }
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    const size_t row = row_for(t, name_);
    Stats& s = t.rows[row];
    s.calls += 1;
    s.flops += flops_;
    s.bytes += bytes_;
    s.host_total_ms += host_ms;
    s.host_max_ms = std::max(s.host_max_ms, host_ms);
    if (gpu_timer_) {
      t.pending.push_back({row, gpu_type_, gpu_timer_});
      try {
        resolve_pending(t, false);
        if (t.pending.size() > kMaxPending) resolve_pending(t, true, kMaxPending / 2);
      } catch (...) {
        // Left pending: snapshot() reports the device error.
      }
    }
  }
  if (range_open_) range_hooks()->range_pop();
  // Scopes close in reverse order of opening on their thread.
  if (!open_scope_stack.empty() && open_scope_stack.back() == this) open_scope_stack.pop_back();
}

std::vector<Stats> snapshot() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  resolve_pending(t, true);
  return t.rows;
}

void reset() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (const PendingTimer& p : t.pending) hooks()[static_cast<size_t>(p.type)].timer_release(p.timer);
  t.pending.clear();
  t.rows.clear();
  t.index.clear();
}

std::string format_table(const std::vector<Stats>& stats) {
  size_t width = 4;
  for (const Stats& s : stats) width = std::max(width, s.name.size());
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %8s %12s %10s %10s %12s %10s %10s\n", static_cast<int>(width), "name", "calls",
                "host ms", "mean", "max", "gpu ms", "mean", "max");
  out += line;
  for (const Stats& s : stats) {
    const double mean = s.calls > 0 ? s.host_total_ms / static_cast<double>(s.calls) : 0.0;
    std::snprintf(line, sizeof line, "%-*s %8lld %12.3f %10.3f %10.3f", static_cast<int>(width), s.name.c_str(),
                  static_cast<long long>(s.calls), s.host_total_ms, mean, s.host_max_ms);
    out += line;
    if (s.gpu_calls > 0) {
      std::snprintf(line, sizeof line, " %12.3f %10.3f %10.3f\n", s.gpu_total_ms,
                    s.gpu_total_ms / static_cast<double>(s.gpu_calls), s.gpu_max_ms);
    } else {
      std::snprintf(line, sizeof line, " %12s %10s %10s\n", "-", "-", "-");
    }
    out += line;
  }
  return out;
}

}  // namespace cpf::profile
