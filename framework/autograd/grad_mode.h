#pragma once
// Whether differentiable ops record graph nodes on this thread (each rank thread has its own mode).

namespace cpf {

bool grad_enabled();
void set_grad_enabled(bool enabled);

// Disables recording for a scope: optimizer steps, evaluation, gradcheck perturbations.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace cpf
