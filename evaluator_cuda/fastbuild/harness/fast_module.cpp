// fast_module.cpp -- part of the fast build harness, linked into every fast-built candidate library.
// Exports the three entry points the binding runtime looks up with dlsym (the fast build's binding.cpp).
#include "binding_registry.h"

#define CUDA_AGENT_EXPORT extern "C" __attribute__((visibility("default")))

CUDA_AGENT_EXPORT int32_t cuda_agent_fast_attach(const cuda_agent_abi* abi) {
  if (!abi || abi->abi_version != CUDA_AGENT_FAST_ABI_VERSION || abi->table_size < sizeof(cuda_agent_abi)) return 1;
  ::cuda_agent::fast::abi_table() = abi;
  return 0;
}

CUDA_AGENT_EXPORT const cuda_agent_binding* cuda_agent_fast_bindings(int64_t* count) {
  auto& bindings = ::cuda_agent::fast::Registry::instance().bindings;
  *count = static_cast<int64_t>(bindings.size());
  return bindings.data();
}

CUDA_AGENT_EXPORT void cuda_agent_fast_free_result(cuda_agent_value* result) {
  if (result->kind == CUDA_AGENT_TENSOR_LIST || result->kind == CUDA_AGENT_TUPLE) {
    for (int64_t k = 0; k < result->count; ++k) {
      if (result->tensors[k]) ::cuda_agent::fast::abi().tensor_release(result->tensors[k]);
    }
    std::free(result->tensors);
  } else if (result->kind == CUDA_AGENT_INT_LIST) {
    std::free(const_cast<int64_t*>(result->ints));
  } else if (result->kind == CUDA_AGENT_TENSOR && result->t) {
    ::cuda_agent::fast::abi().tensor_release(result->t);
  }
  result->tensors = nullptr;
  result->ints = nullptr;
  result->t = nullptr;
  result->count = 0;
}
