// binding_runtime.cpp -- the binding runtime of the fast build path (built once per machine with torch headers).
//
// A candidate library built by evaluator_cuda.extension.fast never sees torch: its bindings hold opaque tensor handles
// and call the table of cuda_agent_abi functions defined here (metadata, allocation, views/copies, the current
// CUDA stream; no compute). This module
//   * fills that table from the real ATen API, turning every C++ exception into an error code + message;
//   * load_library(path) dlopens a candidate library, attaches the table, and returns {name: FastBinding};
//   * FastBinding(*args) converts Python arguments (torch.Tensor, int, float, bool, None, sequences) to the ABI,
//     calls the candidate's invoker and converts the result back (raising RuntimeError on a binding's error).
#include <Python.h>
#include <dlfcn.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/python_variable.h>

#ifdef CUDA_AGENT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../include/cuda_agent_fast_abi.h"  // only the ABI header: the slim torch headers must not shadow torch

static_assert(static_cast<int>(c10::ScalarType::Float) == 6, "c10::ScalarType numbering changed");
static_assert(static_cast<int>(c10::ScalarType::BFloat16) == 15, "c10::ScalarType numbering changed");
static_assert(static_cast<int>(c10::DeviceType::CUDA) == 1, "c10::DeviceType numbering changed");

namespace {

thread_local std::string g_last_error;

at::Tensor* as_tensor(cuda_agent_tensor t) { return reinterpret_cast<at::Tensor*>(t); }
cuda_agent_tensor as_handle(at::Tensor* t) { return reinterpret_cast<cuda_agent_tensor>(t); }

cuda_agent_tensor own(at::Tensor&& t) {
  if (!t.defined()) return nullptr;
  return as_handle(new at::Tensor(std::move(t)));
}

template <typename F>
int32_t guarded(F&& body) {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    g_last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown C++ exception in the binding runtime";
  }
  return 1;
}

at::TensorOptions options_for(int32_t scalar_type, int32_t device_type, int32_t device_index) {
  auto device = device_index < 0 ? c10::Device(static_cast<c10::DeviceType>(device_type))
                                 : c10::Device(static_cast<c10::DeviceType>(device_type),
                                               static_cast<c10::DeviceIndex>(device_index));
  return at::TensorOptions().dtype(static_cast<c10::ScalarType>(scalar_type)).device(device);
}

// ---- the table -------------------------------------------------------------------------------------------------

const char* abi_last_error() { return g_last_error.c_str(); }
cuda_agent_tensor abi_tensor_copy(cuda_agent_tensor t) {
  return t ? as_handle(new at::Tensor(*as_tensor(t))) : nullptr;
}
void abi_tensor_release(cuda_agent_tensor t) { delete as_tensor(t); }
int64_t abi_dim(cuda_agent_tensor t) { return as_tensor(t)->dim(); }
const int64_t* abi_sizes(cuda_agent_tensor t) { return as_tensor(t)->sizes().data(); }
const int64_t* abi_strides(cuda_agent_tensor t) { return as_tensor(t)->strides().data(); }
int64_t abi_numel(cuda_agent_tensor t) { return as_tensor(t)->numel(); }
int64_t abi_storage_offset(cuda_agent_tensor t) { return as_tensor(t)->storage_offset(); }
int32_t abi_scalar_type(cuda_agent_tensor t) { return static_cast<int32_t>(as_tensor(t)->scalar_type()); }
int32_t abi_device_type(cuda_agent_tensor t) { return static_cast<int32_t>(as_tensor(t)->device().type()); }
int32_t abi_device_index(cuda_agent_tensor t) { return as_tensor(t)->device().index(); }
int32_t abi_is_contiguous(cuda_agent_tensor t) { return as_tensor(t)->is_contiguous() ? 1 : 0; }
int32_t abi_requires_grad(cuda_agent_tensor t) { return as_tensor(t)->requires_grad() ? 1 : 0; }
void* abi_data_ptr(cuda_agent_tensor t) {
  void* p = nullptr;
  guarded([&] { p = as_tensor(t)->data_ptr(); });
  return p;
}

int32_t abi_empty(const int64_t* sizes, int64_t ndim, int32_t st, int32_t dt, int32_t di, cuda_agent_tensor* out) {
  return guarded([&] { *out = own(at::empty(c10::IntArrayRef(sizes, ndim), options_for(st, dt, di))); });
}
int32_t abi_empty_strided(const int64_t* sizes, const int64_t* strides, int64_t ndim, int32_t st, int32_t dt,
                          int32_t di, cuda_agent_tensor* out) {
  return guarded([&] {
    *out = own(at::empty_strided(c10::IntArrayRef(sizes, ndim), c10::IntArrayRef(strides, ndim),
                                 options_for(st, dt, di)));
  });
}
int32_t abi_zeros(const int64_t* sizes, int64_t ndim, int32_t st, int32_t dt, int32_t di, cuda_agent_tensor* out) {
  return guarded([&] { *out = own(at::zeros(c10::IntArrayRef(sizes, ndim), options_for(st, dt, di))); });
}
int32_t abi_contiguous(cuda_agent_tensor t, cuda_agent_tensor* out) {
  return guarded([&] { *out = own(as_tensor(t)->contiguous()); });
}
int32_t abi_view(cuda_agent_tensor t, const int64_t* sizes, int64_t ndim, cuda_agent_tensor* out) {
  return guarded([&] { *out = own(as_tensor(t)->view(c10::IntArrayRef(sizes, ndim))); });
}
int32_t abi_reshape(cuda_agent_tensor t, const int64_t* sizes, int64_t ndim, cuda_agent_tensor* out) {
  return guarded([&] { *out = own(as_tensor(t)->reshape(c10::IntArrayRef(sizes, ndim))); });
}

int32_t abi_as_strided(cuda_agent_tensor t, const int64_t* sizes, const int64_t* strides, int64_t ndim,
                       int64_t storage_offset, cuda_agent_tensor* out) {
  return guarded([&] {
    *out = own(as_tensor(t)->as_strided(c10::IntArrayRef(sizes, ndim), c10::IntArrayRef(strides, ndim),
                                        storage_offset));
  });
}

int32_t abi_current_cuda_stream(int32_t device_index, void** out_stream) {
#ifdef CUDA_AGENT_WITH_CUDA
  return guarded([&] {
    auto index = device_index < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(device_index);
    *out_stream = reinterpret_cast<void*>(c10::cuda::getCurrentCUDAStream(index).stream());
  });
#else
  (void)device_index;
  *out_stream = nullptr;
  g_last_error = "the binding runtime was built without CUDA (torch has no CUDA here)";
  return 1;
#endif
}
int32_t abi_current_cuda_device(int32_t* out_index) {
#ifdef CUDA_AGENT_WITH_CUDA
  return guarded([&] { *out_index = c10::cuda::current_device(); });
#else
  *out_index = -1;
  g_last_error = "the binding runtime was built without CUDA (torch has no CUDA here)";
  return 1;
#endif
}
int32_t abi_set_cuda_device(int32_t device_index) {
#ifdef CUDA_AGENT_WITH_CUDA
  return guarded([&] { c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index)); });
#else
  (void)device_index;
  g_last_error = "the binding runtime was built without CUDA (torch has no CUDA here)";
  return 1;
#endif
}

const cuda_agent_abi g_abi = {
    CUDA_AGENT_FAST_ABI_VERSION,
    sizeof(cuda_agent_abi),
    abi_last_error,
    abi_tensor_copy,
    abi_tensor_release,
    abi_dim,
    abi_sizes,
    abi_strides,
    abi_numel,
    abi_storage_offset,
    abi_scalar_type,
    abi_device_type,
    abi_device_index,
    abi_is_contiguous,
    abi_requires_grad,
    abi_data_ptr,
    abi_empty,
    abi_empty_strided,
    abi_zeros,
    abi_contiguous,
    abi_view,
    abi_reshape,
    abi_as_strided,
    abi_current_cuda_stream,
    abi_current_cuda_device,
    abi_set_cuda_device,
};

// ---- Python <-> ABI values -------------------------------------------------------------------------------------

// Keeps the storage that argument values point into alive for the duration of one call.
struct ArgStorage {
  std::vector<std::vector<int64_t>> int_lists;
  std::vector<std::vector<cuda_agent_tensor>> tensor_lists;
  std::vector<PyObject*> sequences;  // PySequence_Fast results whose items the tensor handles borrow from
  ~ArgStorage() {
    for (PyObject* seq : sequences) Py_DECREF(seq);
  }
};

const char* kind_name(int32_t kind) {
  switch (kind) {
    case CUDA_AGENT_TENSOR: return "torch.Tensor";
    case CUDA_AGENT_INT: return "int";
    case CUDA_AGENT_DOUBLE: return "float";
    case CUDA_AGENT_BOOL: return "bool";
    case CUDA_AGENT_INT_LIST: return "List[int]";
    case CUDA_AGENT_TENSOR_LIST: return "List[torch.Tensor]";
    case CUDA_AGENT_OPTIONAL_TENSOR: return "Optional[torch.Tensor]";
    default: return "?";
  }
}

// Tensor handles in arguments are borrowed: they point at the at::Tensor inside the Python object, which the
// argument tuple keeps alive until the call returns. Returns false (without a Python error set) on a type mismatch.
bool to_value(PyObject* obj, int32_t kind, cuda_agent_value* v, ArgStorage* storage) {
  std::memset(v, 0, sizeof(*v));
  v->kind = kind;
  switch (kind) {
    case CUDA_AGENT_TENSOR:
      if (!THPVariable_Check(obj)) return false;
      v->t = as_handle(const_cast<at::Tensor*>(&THPVariable_Unpack(obj)));
      return true;
    case CUDA_AGENT_OPTIONAL_TENSOR:
      if (obj == Py_None) return true;
      if (!THPVariable_Check(obj)) return false;
      v->t = as_handle(const_cast<at::Tensor*>(&THPVariable_Unpack(obj)));
      return true;
    case CUDA_AGENT_INT: {
      if (PyFloat_Check(obj) || !PyIndex_Check(obj)) return false;
      long long value = PyLong_AsLongLong(obj);  // uses __index__
      if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      v->i = value;
      return true;
    }
    case CUDA_AGENT_DOUBLE: {  // like pybind11's float caster: anything float() accepts (ints, 0-dim tensors)
      double value = PyFloat_AsDouble(obj);
      if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      v->d = value;
      return true;
    }
    case CUDA_AGENT_BOOL:  // like pybind11's bool caster: True/False, None, or a number's truth value
      if (obj == Py_True || obj == Py_False || obj == Py_None) {
        v->i = obj == Py_True ? 1 : 0;
        return true;
      }
      if (Py_TYPE(obj)->tp_as_number && Py_TYPE(obj)->tp_as_number->nb_bool) {
        int truth = PyObject_IsTrue(obj);
        if (truth < 0) {
          PyErr_Clear();
          return false;
        }
        v->i = truth;
        return true;
      }
      return false;
    case CUDA_AGENT_INT_LIST:
    case CUDA_AGENT_TENSOR_LIST: {
      if (THPVariable_Check(obj) || PyUnicode_Check(obj) || !PySequence_Check(obj)) return false;
      PyObject* seq = PySequence_Fast(obj, "expected a sequence");
      if (!seq) {
        PyErr_Clear();
        return false;
      }
      Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
      PyObject** items = PySequence_Fast_ITEMS(seq);
      bool ok = true;
      if (kind == CUDA_AGENT_INT_LIST) {
        std::vector<int64_t> values;
        values.reserve(n);
        for (Py_ssize_t k = 0; k < n && ok; ++k) {
          cuda_agent_value item;
          ok = to_value(items[k], CUDA_AGENT_INT, &item, storage);
          values.push_back(item.i);
        }
        storage->int_lists.push_back(std::move(values));
        v->ints = storage->int_lists.back().data();
      } else {
        std::vector<cuda_agent_tensor> values;
        values.reserve(n);
        for (Py_ssize_t k = 0; k < n && ok; ++k) {
          cuda_agent_value item;
          ok = to_value(items[k], CUDA_AGENT_TENSOR, &item, storage);
          values.push_back(item.t);
        }
        storage->tensor_lists.push_back(std::move(values));
        v->tensors = storage->tensor_lists.back().data();
      }
      v->count = n;
      storage->sequences.push_back(seq);  // released after the call: keeps the items alive
      return ok;
    }
    default:
      return false;
  }
}

// Wraps an owned handle (takes it over).
PyObject* wrap_owned(cuda_agent_tensor t) {
  if (!t) Py_RETURN_NONE;
  at::Tensor* tensor = as_tensor(t);
  PyObject* obj = THPVariable_Wrap(std::move(*tensor));
  delete tensor;
  return obj;
}

PyObject* from_result(cuda_agent_value* r) {
  switch (r->kind) {
    case CUDA_AGENT_NONE: Py_RETURN_NONE;
    case CUDA_AGENT_TENSOR: {
      PyObject* obj = wrap_owned(r->t);
      r->t = nullptr;
      return obj;
    }
    case CUDA_AGENT_INT: return PyLong_FromLongLong(r->i);
    case CUDA_AGENT_DOUBLE: return PyFloat_FromDouble(r->d);
    case CUDA_AGENT_BOOL: return PyBool_FromLong(static_cast<long>(r->i));
    case CUDA_AGENT_INT_LIST: {
      PyObject* list = PyList_New(r->count);
      for (int64_t k = 0; list && k < r->count; ++k) PyList_SET_ITEM(list, k, PyLong_FromLongLong(r->ints[k]));
      return list;
    }
    case CUDA_AGENT_TENSOR_LIST:
    case CUDA_AGENT_TUPLE: {
      bool tuple = r->kind == CUDA_AGENT_TUPLE;
      PyObject* seq = tuple ? PyTuple_New(r->count) : PyList_New(r->count);
      for (int64_t k = 0; k < r->count; ++k) {
        PyObject* item = wrap_owned(r->tensors[k]);
        r->tensors[k] = nullptr;
        if (tuple) PyTuple_SET_ITEM(seq, k, item); else PyList_SET_ITEM(seq, k, item);
      }
      return seq;
    }
    default:
      PyErr_Format(PyExc_RuntimeError, "fast binding returned an unknown result kind %d", r->kind);
      return nullptr;
  }
}

// ---- the FastBinding callable ----------------------------------------------------------------------------------

struct FastBinding {
  PyObject_HEAD
  const cuda_agent_binding* binding;
  cuda_agent_free_result_fn free_result;
  PyObject* library;  // a capsule holding the dlopen handle (never closed: code may still be referenced)
};

void fast_binding_dealloc(PyObject* self) {
  Py_XDECREF(reinterpret_cast<FastBinding*>(self)->library);
  Py_TYPE(self)->tp_free(self);
}

PyObject* type_error(const cuda_agent_binding* b, PyObject* args) {
  std::string shown;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(args); ++k) {
    shown += (k ? ", " : "");
    shown += Py_TYPE(PyTuple_GET_ITEM(args, k))->tp_name;
  }
  PyErr_Format(PyExc_TypeError,
               "%s(): incompatible function arguments. The following argument types are supported:\n"
               "    1. %s\n\nInvoked with argument types: (%s)",
               b->name, b->signature, shown.c_str());
  return nullptr;
}

PyObject* fast_binding_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* fb = reinterpret_cast<FastBinding*>(self);
  const cuda_agent_binding* b = fb->binding;
  if (kwargs && PyDict_Size(kwargs) > 0) return type_error(b, args);
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n != b->nargs) return type_error(b, args);
  ArgStorage storage;
  storage.int_lists.reserve(n);
  storage.tensor_lists.reserve(n);
  std::vector<cuda_agent_value> values(static_cast<size_t>(n));
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!to_value(PyTuple_GET_ITEM(args, k), b->arg_kinds[k], &values[k], &storage)) return type_error(b, args);
  }
  cuda_agent_value result;
  std::memset(&result, 0, sizeof(result));
  char error[2048];
  error[0] = '\0';
  int32_t status = b->invoke(values.data(), n, &result, error, sizeof(error));
  if (status != 0) {
    PyErr_SetString(PyExc_RuntimeError, error[0] ? error : "fast binding failed without a message");
    return nullptr;
  }
  PyObject* out = from_result(&result);
  fb->free_result(&result);
  return out;
}

PyObject* fast_binding_repr(PyObject* self) {
  auto* fb = reinterpret_cast<FastBinding*>(self);
  return PyUnicode_FromFormat("<fast binding %s%s>", fb->binding->name, fb->binding->signature);
}

PyObject* fast_binding_get_doc(PyObject* self, void*) {
  auto* fb = reinterpret_cast<FastBinding*>(self);
  return PyUnicode_FromFormat("%s%s", fb->binding->name, fb->binding->signature);
}

PyGetSetDef fast_binding_getset[] = {
    {"__doc__", fast_binding_get_doc, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject FastBindingType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- module functions ------------------------------------------------------------------------------------------

PyObject* bindings_of_library(const char* path) {
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    PyErr_Format(PyExc_ImportError, "cannot load fast extension %s: %s", path, dlerror());
    return nullptr;
  }
  auto attach = reinterpret_cast<cuda_agent_attach_fn>(dlsym(handle, "cuda_agent_fast_attach"));
  auto bindings = reinterpret_cast<cuda_agent_bindings_fn>(dlsym(handle, "cuda_agent_fast_bindings"));
  auto free_result = reinterpret_cast<cuda_agent_free_result_fn>(dlsym(handle, "cuda_agent_fast_free_result"));
  if (!attach || !bindings || !free_result) {
    PyErr_Format(PyExc_ImportError, "%s is not a fast-built extension (no cuda_agent_fast_* entry points)", path);
    return nullptr;
  }
  if (attach(&g_abi) != 0) {
    PyErr_Format(PyExc_ImportError, "%s was built for another binding ABI version (runtime has %d)", path,
                 CUDA_AGENT_FAST_ABI_VERSION);
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(handle, "cuda_agent_fast_library", nullptr);
  if (!capsule) return nullptr;
  int64_t count = 0;
  const cuda_agent_binding* table = bindings(&count);
  PyObject* result = PyDict_New();
  for (int64_t k = 0; result && k < count; ++k) {
    auto* fb = PyObject_New(FastBinding, &FastBindingType);
    if (!fb) {
      Py_CLEAR(result);
      break;
    }
    fb->binding = &table[k];
    fb->free_result = free_result;
    Py_INCREF(capsule);
    fb->library = capsule;
    PyDict_SetItemString(result, table[k].name, reinterpret_cast<PyObject*>(fb));
    Py_DECREF(fb);
  }
  Py_DECREF(capsule);
  return result;
}

PyObject* load_library(PyObject*, PyObject* args) {
  const char* path = nullptr;
  if (!PyArg_ParseTuple(args, "s", &path)) return nullptr;
  return bindings_of_library(path);
}

// A real extension module object (created from a PyModuleDef, as CPython's extension loader requires of what
// PyInit_* returns) holding the library's bindings. The def lives as long as the process, like a static one.
PyObject* extension_module(PyObject*, PyObject* args) {
  const char* path = nullptr;
  const char* name = nullptr;
  if (!PyArg_ParseTuple(args, "ss", &path, &name)) return nullptr;
  PyObject* bindings = bindings_of_library(path);
  if (!bindings) return nullptr;
  auto* def = new PyModuleDef{PyModuleDef_HEAD_INIT, strdup(name),
                              "Custom kernels of one CUDA-Agent workspace (fast build)", -1, nullptr};
  PyObject* module = PyModule_Create(def);
  if (module && PyDict_Update(PyModule_GetDict(module), bindings) < 0) Py_CLEAR(module);
  Py_DECREF(bindings);
  return module;
}

PyObject* abi_version(PyObject*, PyObject*) { return PyLong_FromLong(CUDA_AGENT_FAST_ABI_VERSION); }

PyObject* has_cuda(PyObject*, PyObject*) {
#ifdef CUDA_AGENT_WITH_CUDA
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}

PyMethodDef module_methods[] = {
    {"load_library", load_library, METH_VARARGS, "load_library(path) -> {name: binding}: attach a fast-built library"},
    {"extension_module", extension_module, METH_VARARGS,
     "extension_module(path, name) -> module: a fast-built library as an extension module object"},
    {"abi_version", abi_version, METH_NOARGS, "the binding ABI version of this runtime"},
    {"has_cuda", has_cuda, METH_NOARGS, "whether this runtime was built with CUDA streams"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, nullptr, "binding runtime of the fast build path", -1,
                          module_methods};

}  // namespace

#define CUDA_AGENT_STR_INNER(x) #x
#define CUDA_AGENT_STR(x) CUDA_AGENT_STR_INNER(x)
#define CUDA_AGENT_INIT_NAME_INNER(name) PyInit_##name
#define CUDA_AGENT_INIT_NAME(name) CUDA_AGENT_INIT_NAME_INNER(name)

extern "C" __attribute__((visibility("default"))) PyObject* CUDA_AGENT_INIT_NAME(TORCH_EXTENSION_NAME)() {
  FastBindingType.tp_name = "cuda_agent_binding_runtime.FastBinding";
  FastBindingType.tp_basicsize = sizeof(FastBinding);
  FastBindingType.tp_dealloc = fast_binding_dealloc;
  FastBindingType.tp_call = fast_binding_call;
  FastBindingType.tp_repr = fast_binding_repr;
  FastBindingType.tp_getset = fast_binding_getset;
  FastBindingType.tp_flags = Py_TPFLAGS_DEFAULT;
  if (PyType_Ready(&FastBindingType) < 0) return nullptr;
  module_def.m_name = CUDA_AGENT_STR(TORCH_EXTENSION_NAME);
  PyObject* module = PyModule_Create(&module_def);
  if (!module) return nullptr;
  Py_INCREF(&FastBindingType);
  PyModule_AddObject(module, "FastBinding", reinterpret_cast<PyObject*>(&FastBindingType));
  return module;
}
