// binding.cpp -- part of the evaluator harness (read-only to the agent).
// Defines the single extension module and installs every binding that registered itself.
#include "binding_registry.h"

PYBIND11_MODULE(cuda_extension, m) {
  m.doc() = "Custom kernels of one CUDA-Agent workspace";
  ::cuda_agent::BindingRegistry::instance().install_all(m);
}
