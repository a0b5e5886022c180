#pragma once
// nn::Module: a named tree of parameters, buffers and child modules. The recursive named walk
// ("blocks.0.attn.q_proj.weight") is what optimizers, checkpoints and data parallelism iterate over.
// Parameters are Tensor handles: the module and its owner share one TensorImpl, so loading a
// checkpoint copies into the existing storage instead of replacing handles.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::nn {

using NamedTensor = std::pair<std::string, Tensor>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Depth-first, registration order, children after own parameters; names joined with '.'.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<NamedTensor> named_buffers() const;
  int64_t num_parameters() const;

  void train(bool training = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Drops every parameter's gradient (undefined, so the next backward allocates fresh ones).
  void zero_grad();
  // Moves every parameter and buffer (and any gradient) to `device` in place: the handles stay the same
  // TensorImpl, so members such as Linear::weight() and lists taken from named_parameters() follow.
  // Build optimizers after the move (their state is allocated on the parameters' device). Values are
  // copied exactly; a no-op for tensors already there.
  void to(Device device);

  // Writes every parameter and buffer, under its named_parameters()/named_buffers() name, to a plain
  // safetensors file (readable by any safetensors library). It is written next to `path` and renamed
  // over it when complete, so an interrupted save never leaves a truncated file at `path`.
  // Defined in cpf_io (framework/io/module_io.cpp): link cpformer::io (or cpformer::models) to use it.
  void save(const std::string& path) const;
  // Loads such a file into the parameters and buffers in place (on their devices, converted to their
  // dtypes). The file must hold exactly the module's names with the same shapes and finite values:
  // otherwise it throws, listing every missing, unexpected and mis-shaped tensor, and changes nothing.
  // Defined in cpf_io like save().
  void load(const std::string& path);

 protected:
  // Marks `value` as a parameter (requires grad) and returns the same handle.
  Tensor register_parameter(const std::string& name, Tensor value);
  Tensor register_buffer(const std::string& name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool buffers, std::vector<NamedTensor>& out) const;

  std::vector<NamedTensor> parameters_;
  std::vector<NamedTensor> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace cpf::nn
