// binding_registry.h -- part of the evaluator harness (read-only to the agent).
//
// Each kernels/<name>_binding.cpp registers its Python-facing functions at static-init time:
//
//     #include "binding_registry.h"
//     torch::Tensor my_op_forward(torch::Tensor x) { ... }
//     REGISTER_BINDING(my_op_forward, my_op_forward);
//
// binding.cpp's PYBIND11_MODULE walks the registry and defines every registered function on
// the one extension module `cuda_extension`.
#pragma once

#include <torch/extension.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace cuda_agent {

using BindingInstaller = std::function<void(pybind11::module_&)>;

class BindingRegistry {
 public:
  static BindingRegistry& instance() {
    static BindingRegistry registry;
    return registry;
  }
  void add(std::string name, BindingInstaller installer) {
    entries_.emplace_back(std::move(name), std::move(installer));
  }
  void install_all(pybind11::module_& module) const {
    for (const auto& entry : entries_) entry.second(module);
  }
  const std::vector<std::pair<std::string, BindingInstaller>>& entries() const { return entries_; }

 private:
  BindingRegistry() = default;
  std::vector<std::pair<std::string, BindingInstaller>> entries_;
};

struct BindingRegistrar {
  BindingRegistrar(const char* name, BindingInstaller installer) {
    BindingRegistry::instance().add(name, std::move(installer));
  }
};

}  // namespace cuda_agent

#define CUDA_AGENT_CONCAT_INNER(a, b) a##b
#define CUDA_AGENT_CONCAT(a, b) CUDA_AGENT_CONCAT_INNER(a, b)

// REGISTER_BINDING(python_name, cxx_function): expose cxx_function as cuda_extension.python_name.
#define REGISTER_BINDING(python_name, cxx_function)                                        \
  static ::cuda_agent::BindingRegistrar CUDA_AGENT_CONCAT(cuda_agent_registrar_, __LINE__)( \
      #python_name, [](pybind11::module_& m) { m.def(#python_name, &cxx_function); })
