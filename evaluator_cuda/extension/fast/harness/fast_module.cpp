// fast_module.cpp -- part of the fast build harness, linked into every fast-built candidate library.
// Exports the three entry points the binding runtime looks up with dlsym (the fast build's binding.cpp), and
// PyInit_cuda_extension, so the library also imports like the torch-built extension (`import cuda_extension`,
// importlib's ExtensionFileLoader): it asks evaluator_cuda.extension.fast.binding_runtime for the module object.
#include <dlfcn.h>

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

// The CPython entry point, without Python.h: the few C-API functions are looked up in the running interpreter.
CUDA_AGENT_EXPORT void* PyInit_cuda_extension() {
  using import_fn = void* (*)(const char*);
  using call_method_fn = void* (*)(void*, const char*, const char*, ...);
  using decref_fn = void (*)(void*);
  using set_string_fn = void (*)(void*, const char*);
  auto import_module = reinterpret_cast<import_fn>(dlsym(RTLD_DEFAULT, "PyImport_ImportModule"));
  auto call_method = reinterpret_cast<call_method_fn>(dlsym(RTLD_DEFAULT, "PyObject_CallMethod"));
  auto decref = reinterpret_cast<decref_fn>(dlsym(RTLD_DEFAULT, "Py_DecRef"));
  auto set_string = reinterpret_cast<set_string_fn>(dlsym(RTLD_DEFAULT, "PyErr_SetString"));
  void** import_error = reinterpret_cast<void**>(dlsym(RTLD_DEFAULT, "PyExc_ImportError"));
  if (!import_module || !call_method || !decref) return nullptr;
  Dl_info self;
  if (!dladdr(reinterpret_cast<void*>(&cuda_agent_fast_attach), &self) || !self.dli_fname) {
    if (set_string && import_error) set_string(*import_error, "fast extension: cannot find its own path");
    return nullptr;
  }
  void* runtime = import_module("evaluator_cuda.extension.fast.binding_runtime");
  if (!runtime) return nullptr;  // the ImportError is already set
  void* module = call_method(runtime, "extension_module_for", "s", self.dli_fname);
  decref(runtime);
  return module;  // a new reference, or NULL with the Python error set
}
