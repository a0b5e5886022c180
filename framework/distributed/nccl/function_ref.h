#pragma once
// FunctionRef: a non-owning reference to a callable, for callbacks that run before the call taking
// them returns (the NCCL calls of one operation, an operation's body). Unlike std::function it never
// allocates: a lambda capturing a few references by [&] is larger than std::function's small buffer,
// so each of the three nested callbacks of a posted operation cost a heap allocation.
//
// It refers to the callable object (a lambda, a functor; not a plain function) it was made from:
// never keep one past the full expression that made it.
#include <memory>
#include <type_traits>
#include <utility>

namespace cpf::dist::nccl {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                              std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): passed where a callback is expected
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_(&invoke<F>) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  template <class F>
  static R invoke(void* object, Args... args) {
    using Callable = std::remove_reference_t<F>;
    return (*static_cast<Callable*>(object))(std::forward<Args>(args)...);
  }

  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace cpf::dist::nccl
