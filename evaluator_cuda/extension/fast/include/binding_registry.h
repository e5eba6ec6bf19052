// binding_registry.h -- the fast build's stand-in for the harness registry (same REGISTER_BINDING macro).
//
// REGISTER_BINDING(python_name, cxx_function) records, at static-init time, a type-erased invoker for
// cxx_function: it converts cuda_agent_value arguments to the C++ parameter types, calls the function, converts
// the result back, and turns any C++ exception into an error message (nothing unwinds into the runtime).
// Supported parameters: Tensor, optional<Tensor>, integers, float/double, bool, std::vector<int64_t>/<int>,
// IntArrayRef, std::vector<Tensor>. Results: void, Tensor, std::vector<Tensor>, std::tuple/std::pair of Tensors,
// integers, float/double, bool, std::vector<int64_t>.
#pragma once

#include <deque>

#include "cuda_agent_fast_torch.h"

namespace cuda_agent {
namespace fast {

template <typename T>
struct always_false : std::false_type {};

template <typename T, typename Enable = void>
struct ArgTraits {
  static_assert(always_false<T>::value,
                "cuda_agent_fast: unsupported argument type in REGISTER_BINDING (the full torch build supports it)");
};
template <>
struct ArgTraits<at::Tensor> {
  static constexpr int32_t kind = CUDA_AGENT_TENSOR;
  static constexpr const char* name = "torch.Tensor";
  static at::Tensor from(const cuda_agent_value& v) { return at::Tensor::borrow(v.t); }
};
template <>
struct ArgTraits<c10::optional<at::Tensor>> {
  static constexpr int32_t kind = CUDA_AGENT_OPTIONAL_TENSOR;
  static constexpr const char* name = "Optional[torch.Tensor]";
  static c10::optional<at::Tensor> from(const cuda_agent_value& v) {
    if (!v.t) return c10::nullopt;
    return at::Tensor::borrow(v.t);
  }
};
template <typename T>
struct ArgTraits<T, std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value>> {
  static constexpr int32_t kind = CUDA_AGENT_INT;
  static constexpr const char* name = "int";
  static T from(const cuda_agent_value& v) { return static_cast<T>(v.i); }
};
template <typename T>
struct ArgTraits<T, std::enable_if_t<std::is_floating_point<T>::value>> {
  static constexpr int32_t kind = CUDA_AGENT_DOUBLE;
  static constexpr const char* name = "float";
  static T from(const cuda_agent_value& v) { return static_cast<T>(v.d); }
};
template <>
struct ArgTraits<bool> {
  static constexpr int32_t kind = CUDA_AGENT_BOOL;
  static constexpr const char* name = "bool";
  static bool from(const cuda_agent_value& v) { return v.i != 0; }
};
template <typename T>
struct ArgTraits<std::vector<T>, std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value>> {
  static constexpr int32_t kind = CUDA_AGENT_INT_LIST;
  static constexpr const char* name = "List[int]";
  static std::vector<T> from(const cuda_agent_value& v) { return std::vector<T>(v.ints, v.ints + v.count); }
};
template <>
struct ArgTraits<c10::IntArrayRef> {
  static constexpr int32_t kind = CUDA_AGENT_INT_LIST;
  static constexpr const char* name = "List[int]";
  static c10::IntArrayRef from(const cuda_agent_value& v) {
    return c10::IntArrayRef(v.ints, static_cast<size_t>(v.count));
  }
};
template <>
struct ArgTraits<std::vector<at::Tensor>> {
  static constexpr int32_t kind = CUDA_AGENT_TENSOR_LIST;
  static constexpr const char* name = "List[torch.Tensor]";
  static std::vector<at::Tensor> from(const cuda_agent_value& v) {
    std::vector<at::Tensor> out;
    out.reserve(static_cast<size_t>(v.count));
    for (int64_t k = 0; k < v.count; ++k) out.push_back(at::Tensor::borrow(v.tensors[k]));
    return out;
  }
};

template <typename T>
cuda_agent_tensor* tensor_array(size_t n) {
  auto* out = static_cast<cuda_agent_tensor*>(std::calloc(n ? n : 1, sizeof(cuda_agent_tensor)));
  if (!out) throw std::bad_alloc();
  return out;
}

template <typename T, typename Enable = void>
struct ResultTraits {
  static_assert(always_false<T>::value,
                "cuda_agent_fast: unsupported result type in REGISTER_BINDING (the full torch build supports it)");
};
template <>
struct ResultTraits<at::Tensor> {
  static constexpr const char* name = "torch.Tensor";
  static void to(at::Tensor&& r, cuda_agent_value* out) {
    out->kind = CUDA_AGENT_TENSOR;
    out->t = r.release_handle();
  }
};
template <>
struct ResultTraits<std::vector<at::Tensor>> {
  static constexpr const char* name = "List[torch.Tensor]";
  static void to(std::vector<at::Tensor>&& r, cuda_agent_value* out) {
    cuda_agent_tensor* handles = tensor_array<at::Tensor>(r.size());
    for (size_t k = 0; k < r.size(); ++k) handles[k] = r[k].release_handle();
    out->kind = CUDA_AGENT_TENSOR_LIST;
    out->tensors = handles;
    out->count = static_cast<int64_t>(r.size());
  }
};
template <typename... Ts>
struct ResultTraits<std::tuple<Ts...>, std::enable_if_t<(std::is_same<Ts, at::Tensor>::value && ...)>> {
  static constexpr const char* name = "Tuple[torch.Tensor, ...]";
  static void to(std::tuple<Ts...>&& r, cuda_agent_value* out) {
    cuda_agent_tensor* handles = tensor_array<at::Tensor>(sizeof...(Ts));
    size_t k = 0;
    std::apply([&](Ts&... t) { ((handles[k++] = t.release_handle()), ...); }, r);
    out->kind = CUDA_AGENT_TUPLE;
    out->tensors = handles;
    out->count = static_cast<int64_t>(sizeof...(Ts));
  }
};
template <>
struct ResultTraits<std::pair<at::Tensor, at::Tensor>> {
  static constexpr const char* name = "Tuple[torch.Tensor, torch.Tensor]";
  static void to(std::pair<at::Tensor, at::Tensor>&& r, cuda_agent_value* out) {
    ResultTraits<std::tuple<at::Tensor, at::Tensor>>::to(std::make_tuple(std::move(r.first), std::move(r.second)),
                                                         out);
  }
};
template <typename T>
struct ResultTraits<T, std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value>> {
  static constexpr const char* name = "int";
  static void to(T&& r, cuda_agent_value* out) {
    out->kind = CUDA_AGENT_INT;
    out->i = static_cast<int64_t>(r);
  }
};
template <typename T>
struct ResultTraits<T, std::enable_if_t<std::is_floating_point<T>::value>> {
  static constexpr const char* name = "float";
  static void to(T&& r, cuda_agent_value* out) {
    out->kind = CUDA_AGENT_DOUBLE;
    out->d = static_cast<double>(r);
  }
};
template <>
struct ResultTraits<bool> {
  static constexpr const char* name = "bool";
  static void to(bool&& r, cuda_agent_value* out) {
    out->kind = CUDA_AGENT_BOOL;
    out->i = r ? 1 : 0;
  }
};
template <>
struct ResultTraits<std::vector<int64_t>> {
  static constexpr const char* name = "List[int]";
  static void to(std::vector<int64_t>&& r, cuda_agent_value* out) {
    auto* ints = static_cast<int64_t*>(std::calloc(r.size() ? r.size() : 1, sizeof(int64_t)));
    if (!ints) throw std::bad_alloc();
    std::copy(r.begin(), r.end(), ints);
    out->kind = CUDA_AGENT_INT_LIST;
    out->ints = ints;
    out->count = static_cast<int64_t>(r.size());
  }
};

inline void write_error(char* error, int64_t error_size, const char* message) {
  if (error_size <= 0) return;
  std::snprintf(error, static_cast<size_t>(error_size), "%s", message);
}

template <auto Fn, typename Signature = decltype(Fn)>
struct BindingOf;

template <auto Fn, typename R, typename... Args>
struct BindingOf<Fn, R (*)(Args...)> {
  static constexpr int32_t arg_kinds[sizeof...(Args) + 1] = {ArgTraits<std::decay_t<Args>>::kind..., 0};

  static std::string signature() {
    std::string out = "(";
    size_t k = 0;
    const char* names[sizeof...(Args) + 1] = {ArgTraits<std::decay_t<Args>>::name..., ""};
    for (k = 0; k < sizeof...(Args); ++k) out += (k ? ", arg" : "arg") + std::to_string(k) + ": " + names[k];
    out += ") -> ";
    if constexpr (std::is_void<R>::value) out += "None"; else out += ResultTraits<std::decay_t<R>>::name;
    return out;
  }
  static int32_t result_kind() {
    if constexpr (std::is_void<R>::value) return CUDA_AGENT_NONE;
    else return -1;  // decided by the value (tensor lists vs tuples are told apart when filled)
  }

  template <size_t... I>
  static void call(const cuda_agent_value* args, cuda_agent_value* result, std::index_sequence<I...>) {
    std::tuple<std::decay_t<Args>...> values(ArgTraits<std::decay_t<Args>>::from(args[I])...);
    (void)args;
    if constexpr (std::is_void<R>::value) {
      Fn(std::get<I>(values)...);
      result->kind = CUDA_AGENT_NONE;
    } else {
      std::decay_t<R> r = Fn(std::get<I>(values)...);
      ResultTraits<std::decay_t<R>>::to(std::move(r), result);
    }
  }

  static int32_t invoke(const cuda_agent_value* args, int64_t nargs, cuda_agent_value* result, char* error,
                        int64_t error_size) {
    try {
      if (nargs != static_cast<int64_t>(sizeof...(Args))) {
        write_error(error, error_size, "fast binding called with the wrong number of arguments");
        return 1;
      }
      call(args, result, std::index_sequence_for<Args...>{});
      return 0;
    } catch (const std::exception& e) {
      write_error(error, error_size, e.what());
    } catch (...) {
      write_error(error, error_size, "unknown C++ exception in a fast binding");
    }
    return 1;
  }
};

template <auto Fn, typename R, typename... Args>
struct BindingOf<Fn, R (*)(Args...) noexcept> : BindingOf<static_cast<R (*)(Args...)>(Fn)> {};

// Everything REGISTER_BINDING collected in this library (one registry per library: hidden visibility).
struct Registry {
  std::vector<cuda_agent_binding> bindings;
  std::deque<std::string> strings;  // names and signatures the bindings point into

  static Registry& instance() {
    static Registry registry;
    return registry;
  }
};

struct Registrar {
  Registrar(const char* name, cuda_agent_invoke_fn invoke, const int32_t* arg_kinds, int64_t nargs,
            int32_t result_kind, std::string signature) {
    Registry& registry = Registry::instance();
    registry.strings.emplace_back(name);
    const char* stored_name = registry.strings.back().c_str();
    registry.strings.emplace_back(std::move(signature));
    const char* stored_signature = registry.strings.back().c_str();
    registry.bindings.push_back(cuda_agent_binding{stored_name, invoke, arg_kinds, nargs, result_kind,
                                                   stored_signature});
  }
};

template <auto Fn>
Registrar make_registrar(const char* name) {
  using Binding = BindingOf<Fn>;
  constexpr int64_t nargs = static_cast<int64_t>(sizeof(Binding::arg_kinds) / sizeof(int32_t)) - 1;
  return Registrar(name, &Binding::invoke, Binding::arg_kinds, nargs, Binding::result_kind(), Binding::signature());
}

}  // namespace fast
}  // namespace cuda_agent

#define CUDA_AGENT_CONCAT_INNER(a, b) a##b
#define CUDA_AGENT_CONCAT(a, b) CUDA_AGENT_CONCAT_INNER(a, b)

// REGISTER_BINDING(python_name, cxx_function): expose cxx_function as cuda_extension.python_name.
#define REGISTER_BINDING(python_name, cxx_function)                                         \
  static ::cuda_agent::fast::Registrar CUDA_AGENT_CONCAT(cuda_agent_registrar_, __LINE__) = \
      ::cuda_agent::fast::make_registrar<&cxx_function>(#python_name)
