// cuda_agent_fast_torch.h -- the slim torch API that fast-built bindings compile against.
//
// It offers the part of the torch C++ API a binding legitimately needs -- tensor metadata, allocation
// (empty/empty_like/zeros/zeros_like/empty_strided), views and contiguous copies, TORCH_CHECK, dtypes and devices --
// with the same spelling as torch (at::, c10::, torch::), but every operation goes through the binding runtime's
// cuda_agent_abi table. No torch header is included, so a binding compiles in about a second. A binding that
// needs more than this (tensor compute, pybind11, other headers) does not compile here and the builder falls back
// to the full torch build.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_agent_fast_abi.h"

namespace cuda_agent {
namespace fast {

// The runtime's table, set once when the runtime attaches the library (one per library: hidden visibility).
inline const cuda_agent_abi*& abi_table() {
  static const cuda_agent_abi* table = nullptr;
  return table;
}

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (void)std::initializer_list<int>{((out << parts), 0)...};
  return out.str();
}

}  // namespace fast
}  // namespace cuda_agent

namespace c10 {

// The error TORCH_CHECK throws; the registry turns it into a Python RuntimeError carrying what().
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  const char* what_without_backtrace() const noexcept { return what(); }
  std::string msg() const { return what(); }
};
using ValueError = Error;
using TypeError = Error;
using IndexError = Error;
using NotImplementedError = Error;

}  // namespace c10

namespace cuda_agent {
namespace fast {

[[noreturn]] inline void raise_runtime_error() {
  const char* message = abi_table() ? abi_table()->last_error() : "binding runtime not attached";
  throw ::c10::Error(message ? message : "binding runtime error");
}

inline const cuda_agent_abi& abi() {
  if (!abi_table()) throw ::c10::Error("fast binding used before the binding runtime attached it");
  return *abi_table();
}

inline void check_status(int32_t status) {
  if (status != 0) raise_runtime_error();
}

}  // namespace fast
}  // namespace cuda_agent

#define CUDA_AGENT_FAST_CHECK_MSG_0(cond) \
  ::cuda_agent::fast::concat("Expected " #cond " to be true, but got false.")
#define TORCH_CHECK(cond, ...)                                                                 \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::string cuda_agent_message_ = ::cuda_agent::fast::concat("" __VA_ARGS__);          \
      throw ::c10::Error(cuda_agent_message_.empty() ? CUDA_AGENT_FAST_CHECK_MSG_0(cond)       \
                                                     : cuda_agent_message_);                   \
    }                                                                                          \
  } while (false)
#define TORCH_CHECK_VALUE(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define TORCH_CHECK_TYPE(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define TORCH_CHECK_INDEX(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define TORCH_CHECK_NOT_IMPLEMENTED(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define TORCH_INTERNAL_ASSERT(cond, ...) TORCH_CHECK(cond, "Internal assert failed: " #cond " ", ##__VA_ARGS__)
#define AT_ASSERT(cond) TORCH_CHECK(cond)
#define AT_ASSERTM(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define AT_ERROR(...) throw ::c10::Error(::cuda_agent::fast::concat(__VA_ARGS__))
#define TORCH_WARN(...) (std::cerr << "Warning: " << ::cuda_agent::fast::concat(__VA_ARGS__) << std::endl)
#define TORCH_WARN_ONCE(...) TORCH_WARN(__VA_ARGS__)

namespace c10 {

// Numbering follows c10::ScalarType (the runtime static_asserts the ones it relies on).
enum class ScalarType : int8_t {
  Byte = 0,
  Char = 1,
  Short = 2,
  Int = 3,
  Long = 4,
  Half = 5,
  Float = 6,
  Double = 7,
  ComplexHalf = 8,
  ComplexFloat = 9,
  ComplexDouble = 10,
  Bool = 11,
  QInt8 = 12,
  QUInt8 = 13,
  QInt32 = 14,
  BFloat16 = 15,
  Undefined = -1,
};

constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kChar = ScalarType::Char;
constexpr ScalarType kShort = ScalarType::Short;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kDouble = ScalarType::Double;
constexpr ScalarType kBool = ScalarType::Bool;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kUInt8 = ScalarType::Byte;
constexpr ScalarType kInt8 = ScalarType::Char;
constexpr ScalarType kInt16 = ScalarType::Short;
constexpr ScalarType kInt32 = ScalarType::Int;
constexpr ScalarType kInt64 = ScalarType::Long;
constexpr ScalarType kFloat16 = ScalarType::Half;
constexpr ScalarType kFloat32 = ScalarType::Float;
constexpr ScalarType kFloat64 = ScalarType::Double;
constexpr ScalarType kComplexFloat = ScalarType::ComplexFloat;
constexpr ScalarType kComplexDouble = ScalarType::ComplexDouble;

inline const char* toString(ScalarType t) {
  switch (t) {
    case ScalarType::Byte: return "Byte";
    case ScalarType::Char: return "Char";
    case ScalarType::Short: return "Short";
    case ScalarType::Int: return "Int";
    case ScalarType::Long: return "Long";
    case ScalarType::Half: return "Half";
    case ScalarType::Float: return "Float";
    case ScalarType::Double: return "Double";
    case ScalarType::ComplexHalf: return "ComplexHalf";
    case ScalarType::ComplexFloat: return "ComplexFloat";
    case ScalarType::ComplexDouble: return "ComplexDouble";
    case ScalarType::Bool: return "Bool";
    case ScalarType::BFloat16: return "BFloat16";
    default: return "UNKNOWN_SCALAR";
  }
}
inline std::ostream& operator<<(std::ostream& out, ScalarType t) { return out << toString(t); }

inline size_t elementSize(ScalarType t) {
  switch (t) {
    case ScalarType::Byte: case ScalarType::Char: case ScalarType::Bool: case ScalarType::QInt8:
    case ScalarType::QUInt8: return 1;
    case ScalarType::Short: case ScalarType::Half: case ScalarType::BFloat16: return 2;
    case ScalarType::Int: case ScalarType::Float: case ScalarType::QInt32: case ScalarType::ComplexHalf: return 4;
    case ScalarType::Long: case ScalarType::Double: case ScalarType::ComplexFloat: return 8;
    case ScalarType::ComplexDouble: return 16;
    default: throw Error("elementSize: unknown scalar type");
  }
}
inline bool isFloatingType(ScalarType t) {
  return t == ScalarType::Half || t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::BFloat16;
}
inline bool isIntegralType(ScalarType t, bool include_bool) {
  return t == ScalarType::Byte || t == ScalarType::Char || t == ScalarType::Short || t == ScalarType::Int ||
         t == ScalarType::Long || (include_bool && t == ScalarType::Bool);
}

// 16-bit float storage types (arithmetic belongs in the kernels; these only name the element type).
struct alignas(2) Half {
  uint16_t x;
};
struct alignas(2) BFloat16 {
  uint16_t x;
};

// What Tensor::dtype() returns: comparable with ScalarType like caffe2::TypeMeta.
class TypeMeta {
 public:
  constexpr TypeMeta() : type_(ScalarType::Float) {}
  constexpr TypeMeta(ScalarType t) : type_(t) {}  // NOLINT: implicit like torch
  constexpr ScalarType toScalarType() const { return type_; }
  size_t itemsize() const { return elementSize(type_); }
  const char* name() const { return toString(type_); }
  operator ScalarType() const { return type_; }  // NOLINT: implicit like torch
  friend bool operator==(TypeMeta a, TypeMeta b) { return a.type_ == b.type_; }
  friend bool operator!=(TypeMeta a, TypeMeta b) { return a.type_ != b.type_; }
  friend bool operator==(TypeMeta a, ScalarType b) { return a.type_ == b; }
  friend bool operator!=(TypeMeta a, ScalarType b) { return a.type_ != b; }
  friend bool operator==(ScalarType a, TypeMeta b) { return a == b.type_; }
  friend bool operator!=(ScalarType a, TypeMeta b) { return a != b.type_; }
  friend std::ostream& operator<<(std::ostream& out, TypeMeta t) { return out << t.name(); }

 private:
  ScalarType type_;
};
inline ScalarType typeMetaToScalarType(TypeMeta t) { return t.toScalarType(); }

template <typename T>
struct CppTypeToScalarType;
#define CUDA_AGENT_FAST_SCALAR(cpp_type, scalar)                                  \
  template <>                                                                     \
  struct CppTypeToScalarType<cpp_type> {                                          \
    static constexpr ScalarType value = ScalarType::scalar;                       \
  };
CUDA_AGENT_FAST_SCALAR(uint8_t, Byte)
CUDA_AGENT_FAST_SCALAR(int8_t, Char)
CUDA_AGENT_FAST_SCALAR(int16_t, Short)
CUDA_AGENT_FAST_SCALAR(int32_t, Int)
CUDA_AGENT_FAST_SCALAR(int64_t, Long)
CUDA_AGENT_FAST_SCALAR(Half, Half)
CUDA_AGENT_FAST_SCALAR(float, Float)
CUDA_AGENT_FAST_SCALAR(double, Double)
CUDA_AGENT_FAST_SCALAR(bool, Bool)
CUDA_AGENT_FAST_SCALAR(BFloat16, BFloat16)
#undef CUDA_AGENT_FAST_SCALAR

// Numbering follows c10::DeviceType.
enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
constexpr DeviceType kCPU = DeviceType::CPU;
constexpr DeviceType kCUDA = DeviceType::CUDA;
using DeviceIndex = int8_t;

class Device {
 public:
  Device(DeviceType type, DeviceIndex index = -1) : type_(type), index_(index) {}  // NOLINT: implicit like torch
  explicit Device(const std::string& spec) {
    std::string kind = spec.substr(0, spec.find(':'));
    TORCH_CHECK(kind == "cuda" || kind == "cpu", "fast binding: unsupported device string ", spec);
    type_ = kind == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
    index_ = spec.find(':') == std::string::npos
                 ? -1
                 : static_cast<DeviceIndex>(std::stoi(spec.substr(spec.find(':') + 1)));
  }
  DeviceType type() const { return type_; }
  DeviceIndex index() const { return index_; }
  bool has_index() const { return index_ >= 0; }
  bool is_cuda() const { return type_ == DeviceType::CUDA; }
  bool is_cpu() const { return type_ == DeviceType::CPU; }
  std::string str() const {
    std::string name = is_cuda() ? "cuda" : "cpu";
    return has_index() ? name + ":" + std::to_string(index_) : name;
  }
  friend bool operator==(const Device& a, const Device& b) { return a.type_ == b.type_ && a.index_ == b.index_; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
  friend std::ostream& operator<<(std::ostream& out, const Device& d) { return out << d.str(); }

 private:
  DeviceType type_;
  DeviceIndex index_;
};

enum class MemoryFormat : int8_t { Contiguous, Preserve, ChannelsLast, ChannelsLast3d };
enum class Layout : int8_t { Strided };
constexpr Layout kStrided = Layout::Strided;

// A non-owning view of a contiguous array, like c10::ArrayRef.
template <typename T>
class ArrayRef {
 public:
  using value_type = T;
  using iterator = const T*;
  using const_iterator = const T*;
  constexpr ArrayRef() : data_(nullptr), size_(0) {}
  constexpr ArrayRef(const T& one) : data_(&one), size_(1) {}  // NOLINT: implicit like torch
  constexpr ArrayRef(const T* data, size_t size) : data_(data), size_(size) {}
  ArrayRef(const std::vector<T>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT
  template <size_t N>
  constexpr ArrayRef(const std::array<T, N>& a) : data_(a.data()), size_(N) {}  // NOLINT
  constexpr ArrayRef(const std::initializer_list<T>& list)  // NOLINT: implicit like torch
      : data_(nullptr), size_(list.size()) {
    data_ = list.begin();  // valid for the full expression, as in c10::ArrayRef
  }
  constexpr const T* begin() const { return data_; }
  constexpr const T* end() const { return data_ + size_; }
  constexpr const T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  const T& operator[](size_t i) const { return data_[i]; }
  const T& at(size_t i) const {
    TORCH_CHECK(i < size_, "ArrayRef: index ", i, " out of range for size ", size_);
    return data_[i];
  }
  const T& front() const { return at(0); }
  const T& back() const { return at(size_ - 1); }
  std::vector<T> vec() const { return std::vector<T>(data_, data_ + size_); }
  operator std::vector<T>() const { return vec(); }  // NOLINT
  ArrayRef slice(size_t start, size_t n) const { return ArrayRef(data_ + start, n); }
  ArrayRef slice(size_t start) const { return ArrayRef(data_ + start, size_ - start); }
  bool equals(ArrayRef other) const { return size_ == other.size_ && std::equal(begin(), end(), other.begin()); }
  friend bool operator==(ArrayRef a, ArrayRef b) { return a.equals(b); }
  friend bool operator!=(ArrayRef a, ArrayRef b) { return !a.equals(b); }
  friend bool operator==(ArrayRef a, const std::vector<T>& b) { return a.equals(b); }
  friend bool operator!=(ArrayRef a, const std::vector<T>& b) { return !a.equals(b); }

 private:
  const T* data_;
  size_t size_;
};
using IntArrayRef = ArrayRef<int64_t>;
template <typename T>
std::ostream& operator<<(std::ostream& out, ArrayRef<T> list) {
  out << "[";
  for (size_t i = 0; i < list.size(); ++i) out << (i ? ", " : "") << list[i];
  return out << "]";
}

template <typename T>
using optional = std::optional<T>;
using std::nullopt;
using std::make_optional;

class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(ScalarType t) { dtype_ = t; }                  // NOLINT: implicit like torch
  TensorOptions(TypeMeta t) { dtype_ = t.toScalarType(); }     // NOLINT
  TensorOptions(Device d) : device_(d) {}                      // NOLINT
  TensorOptions(DeviceType t) : device_(Device(t)) {}          // NOLINT
  TensorOptions dtype(ScalarType t) const { TensorOptions o = *this; o.dtype_ = t; return o; }
  TensorOptions dtype(TypeMeta t) const { return dtype(t.toScalarType()); }
  TensorOptions dtype(optional<ScalarType> t) const { return t ? dtype(*t) : *this; }
  template <typename T>
  TensorOptions dtype() const { return dtype(CppTypeToScalarType<T>::value); }
  TensorOptions device(Device d) const { TensorOptions o = *this; o.device_ = d; return o; }
  TensorOptions device(DeviceType t, DeviceIndex index = -1) const { return device(Device(t, index)); }
  TensorOptions device_index(DeviceIndex index) const { return device(Device(DeviceType::CUDA, index)); }
  TensorOptions requires_grad(bool flag) const {
    TORCH_CHECK(!flag, "fast binding: outputs with requires_grad=True are not supported");
    return *this;
  }
  TensorOptions layout(Layout) const { return *this; }
  TensorOptions memory_format(MemoryFormat format) const {
    TORCH_CHECK(format == MemoryFormat::Contiguous || format == MemoryFormat::Preserve,
                "fast binding: only contiguous memory format is supported");
    return *this;
  }
  TensorOptions pinned_memory(bool flag) const {
    TORCH_CHECK(!flag, "fast binding: pinned memory is not supported");
    return *this;
  }
  TypeMeta dtype() const { return TypeMeta(dtype_); }
  Device device() const { return device_; }
  ScalarType scalar_type() const { return dtype_; }
  bool requires_grad() const { return false; }

 private:
  ScalarType dtype_ = ScalarType::Float;
  Device device_ = Device(DeviceType::CPU);
};

inline TensorOptions dtype(ScalarType t) { return TensorOptions().dtype(t); }
inline TensorOptions dtype(TypeMeta t) { return TensorOptions().dtype(t); }
template <typename T>
TensorOptions dtype() { return TensorOptions().dtype(CppTypeToScalarType<T>::value); }
inline TensorOptions device(Device d) { return TensorOptions().device(d); }
inline TensorOptions device(DeviceType t, DeviceIndex index = -1) { return TensorOptions().device(t, index); }
inline TensorOptions device_index(DeviceIndex index) { return TensorOptions().device_index(index); }
inline TensorOptions requires_grad(bool flag = true) { return TensorOptions().requires_grad(flag); }

}  // namespace c10

namespace at {

using c10::ArrayRef;
using c10::BFloat16;
using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Half;
using c10::IntArrayRef;
using c10::Layout;
using c10::MemoryFormat;
using c10::ScalarType;
using c10::TensorOptions;
using c10::optional;
using c10::nullopt;
using c10::kByte;
using c10::kChar;
using c10::kShort;
using c10::kInt;
using c10::kLong;
using c10::kHalf;
using c10::kFloat;
using c10::kDouble;
using c10::kBool;
using c10::kBFloat16;
using c10::kUInt8;
using c10::kInt8;
using c10::kInt16;
using c10::kInt32;
using c10::kInt64;
using c10::kFloat16;
using c10::kFloat32;
using c10::kFloat64;
using c10::kComplexFloat;
using c10::kComplexDouble;
using c10::kCPU;
using c10::kCUDA;
using c10::kStrided;
using c10::dtype;
using c10::device;
using c10::elementSize;
using c10::isFloatingType;
using c10::toString;

// An owned reference to a runtime tensor (copying shares the tensor, like at::Tensor).
class Tensor {
 public:
  Tensor() = default;
  Tensor(const Tensor& other) : handle_(other.handle_ ? cuda_agent::fast::abi().tensor_copy(other.handle_) : nullptr) {}
  Tensor(Tensor&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  Tensor& operator=(const Tensor& other) {
    if (this != &other) {
      Tensor copy(other);
      std::swap(handle_, copy.handle_);
    }
    return *this;
  }
  Tensor& operator=(Tensor&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~Tensor() {
    if (handle_) cuda_agent::fast::abi().tensor_release(handle_);
  }

  // Takes over an owned handle / makes an owned reference from a borrowed one (used by the registry).
  static Tensor adopt(cuda_agent_tensor handle) {
    Tensor t;
    t.handle_ = handle;
    return t;
  }
  static Tensor borrow(cuda_agent_tensor handle) {
    return adopt(handle ? cuda_agent::fast::abi().tensor_copy(handle) : nullptr);
  }
  cuda_agent_tensor release_handle() {
    cuda_agent_tensor h = handle_;
    handle_ = nullptr;
    return h;
  }

  bool defined() const { return handle_ != nullptr; }
  int64_t dim() const { return cuda_agent::fast::abi().dim(h()); }
  int64_t ndimension() const { return dim(); }
  IntArrayRef sizes() const { return IntArrayRef(cuda_agent::fast::abi().sizes(h()), static_cast<size_t>(dim())); }
  IntArrayRef strides() const {
    return IntArrayRef(cuda_agent::fast::abi().strides(h()), static_cast<size_t>(dim()));
  }
  int64_t size(int64_t d) const { return sizes()[wrap(d)]; }
  int64_t stride(int64_t d) const { return strides()[wrap(d)]; }
  int64_t numel() const { return cuda_agent::fast::abi().numel(h()); }
  int64_t storage_offset() const { return cuda_agent::fast::abi().storage_offset(h()); }
  ScalarType scalar_type() const { return static_cast<ScalarType>(cuda_agent::fast::abi().scalar_type(h())); }
  c10::TypeMeta dtype() const { return c10::TypeMeta(scalar_type()); }
  size_t element_size() const { return elementSize(scalar_type()); }
  size_t itemsize() const { return element_size(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  Device device() const {
    const cuda_agent_abi& t = cuda_agent::fast::abi();
    return Device(static_cast<DeviceType>(t.device_type(h())), static_cast<c10::DeviceIndex>(t.device_index(h())));
  }
  int64_t get_device() const { return device().is_cuda() ? device().index() : -1; }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_contiguous() const { return cuda_agent::fast::abi().is_contiguous(h()) != 0; }
  bool is_contiguous(MemoryFormat format) const {
    TORCH_CHECK(format == MemoryFormat::Contiguous, "fast binding: only MemoryFormat::Contiguous is supported");
    return is_contiguous();
  }
  bool is_floating_point() const { return isFloatingType(scalar_type()); }
  bool requires_grad() const { return cuda_agent::fast::abi().requires_grad(h()) != 0; }
  TensorOptions options() const { return TensorOptions().dtype(scalar_type()).device(device()); }

  void* data_ptr() const {
    void* p = cuda_agent::fast::abi().data_ptr(h());
    if (!p && numel() > 0) cuda_agent::fast::raise_runtime_error();
    return p;
  }
  const void* const_data_ptr() const { return data_ptr(); }
  void* mutable_data_ptr() const { return data_ptr(); }
  template <typename T>
  T* data_ptr() const {
    check_element_type<T>("data_ptr");
    return static_cast<T*>(data_ptr());
  }
  template <typename T>
  const T* const_data_ptr() const { return data_ptr<std::remove_const_t<T>>(); }
  template <typename T>
  T* mutable_data_ptr() const { return data_ptr<T>(); }
  template <typename T>
  T* data() const { return data_ptr<T>(); }

  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const {
    TORCH_CHECK(format == MemoryFormat::Contiguous, "fast binding: only MemoryFormat::Contiguous is supported");
    if (is_contiguous()) return *this;
    cuda_agent_tensor out = nullptr;
    cuda_agent::fast::check_status(cuda_agent::fast::abi().contiguous(h(), &out));
    return adopt(out);
  }
  Tensor view(IntArrayRef shape) const {
    cuda_agent_tensor out = nullptr;
    cuda_agent::fast::check_status(
        cuda_agent::fast::abi().view(h(), shape.data(), static_cast<int64_t>(shape.size()), &out));
    return adopt(out);
  }
  Tensor reshape(IntArrayRef shape) const {
    cuda_agent_tensor out = nullptr;
    cuda_agent::fast::check_status(
        cuda_agent::fast::abi().reshape(h(), shape.data(), static_cast<int64_t>(shape.size()), &out));
    return adopt(out);
  }
  Tensor flatten() const { return reshape({-1}); }

  // Views (no data moves): built from the tensor's geometry with as_strided.
  Tensor as_strided(IntArrayRef sizes, IntArrayRef strides, optional<int64_t> offset = nullopt) const {
    TORCH_CHECK(sizes.size() == strides.size(), "as_strided: sizes and strides differ in length");
    cuda_agent_tensor out = nullptr;
    cuda_agent::fast::check_status(cuda_agent::fast::abi().as_strided(
        h(), sizes.data(), strides.data(), static_cast<int64_t>(sizes.size()), offset ? *offset : storage_offset(),
        &out));
    return adopt(out);
  }
  Tensor transpose(int64_t a, int64_t b) const {
    std::vector<int64_t> sz = sizes().vec(), st = strides().vec();
    std::swap(sz[wrap(a)], sz[wrap(b)]);
    std::swap(st[wrap(a)], st[wrap(b)]);
    return as_strided(sz, st);
  }
  Tensor t() const {
    TORCH_CHECK(dim() <= 2, "t() expects a tensor with <= 2 dimensions, but self is ", dim(), "D");
    return dim() < 2 ? *this : transpose(0, 1);
  }
  Tensor permute(IntArrayRef dims) const {
    TORCH_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: number of dims don't match");
    std::vector<int64_t> sz, st;
    std::vector<bool> seen(dims.size(), false);
    for (int64_t d : dims) {
      size_t k = wrap(d);
      TORCH_CHECK(!seen[k], "permute: repeated dim");
      seen[k] = true;
      sz.push_back(size(d));
      st.push_back(stride(d));
    }
    return as_strided(sz, st);
  }
  Tensor unsqueeze(int64_t d) const {
    int64_t n = dim() + 1;
    TORCH_CHECK(d >= -n && d < n, "unsqueeze: dimension out of range");
    size_t k = static_cast<size_t>(d < 0 ? d + n : d);
    std::vector<int64_t> sz = sizes().vec(), st = strides().vec();
    int64_t stride_here = k < sz.size() ? sz[k] * st[k] : 1;
    sz.insert(sz.begin() + k, 1);
    st.insert(st.begin() + k, stride_here);
    return as_strided(sz, st);
  }
  Tensor narrow(int64_t d, int64_t start, int64_t length) const {
    size_t k = wrap(d);
    int64_t n = size(d);
    if (start < 0) start += n;
    TORCH_CHECK(start >= 0 && length >= 0 && start + length <= n, "start (", start, ") + length (", length,
                ") exceeds dimension size (", n, ").");
    std::vector<int64_t> sz = sizes().vec();
    sz[k] = length;
    return as_strided(sz, strides(), storage_offset() + start * stride(d));
  }
  Tensor select(int64_t d, int64_t index) const {
    size_t k = wrap(d);
    int64_t n = size(d);
    TORCH_CHECK(index >= -n && index < n, "select(): index ", index, " out of range for tensor of size ",
                sizes(), " at dimension ", d);
    if (index < 0) index += n;
    std::vector<int64_t> sz = sizes().vec(), st = strides().vec();
    sz.erase(sz.begin() + k);
    st.erase(st.begin() + k);
    return as_strided(sz, st, storage_offset() + index * stride(d));
  }

 private:
  cuda_agent_tensor h() const {
    if (!handle_) throw ::c10::Error("fast binding: operation on an undefined tensor");
    return handle_;
  }
  size_t wrap(int64_t d) const {
    int64_t n = dim();
    TORCH_CHECK(d >= -n && d < n, "Dimension out of range (expected to be in range of [", -n, ", ", n - 1,
                "], but got ", d, ")");
    return static_cast<size_t>(d < 0 ? d + n : d);
  }
  template <typename T>
  void check_element_type(const char* what) const {
    using Plain = std::remove_cv_t<T>;
    ScalarType want = element_type_of<Plain>();
    TORCH_CHECK(want == scalar_type() || (want == ScalarType::Byte && scalar_type() == ScalarType::Bool),
                "expected scalar type ", toString(want), " but found ", toString(scalar_type()), " (", what, ")");
  }
  template <typename T>
  static ScalarType element_type_of() {
    if constexpr (std::is_same<T, long>::value || std::is_same<T, long long>::value) {
      static_assert(sizeof(T) == 8, "cuda_agent_fast: 64-bit integer expected");
      return ScalarType::Long;
    } else if constexpr (std::is_same<T, char>::value) {
      return ScalarType::Char;
    } else if constexpr (std::is_same<T, unsigned char>::value) {
      return ScalarType::Byte;
    } else {
      return c10::CppTypeToScalarType<T>::value;
    }
  }
  cuda_agent_tensor handle_ = nullptr;
};

inline std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  if (!t.defined()) return out << "[ Tensor (undefined) ]";
  return out << "[ " << toString(t.scalar_type()) << " tensor of size " << t.sizes() << " on " << t.device() << " ]";
}

using TensorList = ArrayRef<Tensor>;

inline Tensor empty(IntArrayRef size, TensorOptions options = {}, optional<MemoryFormat> format = nullopt) {
  TORCH_CHECK(!format || *format == MemoryFormat::Contiguous || *format == MemoryFormat::Preserve,
              "fast binding: only contiguous memory format is supported");
  cuda_agent_tensor out = nullptr;
  cuda_agent::fast::check_status(cuda_agent::fast::abi().empty(
      size.data(), static_cast<int64_t>(size.size()), static_cast<int32_t>(options.scalar_type()),
      static_cast<int32_t>(options.device().type()), options.device().index(), &out));
  return Tensor::adopt(out);
}
inline Tensor empty(IntArrayRef size, ScalarType t) { return empty(size, TensorOptions().dtype(t)); }
inline Tensor empty_strided(IntArrayRef size, IntArrayRef stride, TensorOptions options = {}) {
  TORCH_CHECK(size.size() == stride.size(), "empty_strided: sizes and strides differ in length");
  cuda_agent_tensor out = nullptr;
  cuda_agent::fast::check_status(cuda_agent::fast::abi().empty_strided(
      size.data(), stride.data(), static_cast<int64_t>(size.size()), static_cast<int32_t>(options.scalar_type()),
      static_cast<int32_t>(options.device().type()), options.device().index(), &out));
  return Tensor::adopt(out);
}
inline Tensor zeros(IntArrayRef size, TensorOptions options = {}) {
  cuda_agent_tensor out = nullptr;
  cuda_agent::fast::check_status(cuda_agent::fast::abi().zeros(
      size.data(), static_cast<int64_t>(size.size()), static_cast<int32_t>(options.scalar_type()),
      static_cast<int32_t>(options.device().type()), options.device().index(), &out));
  return Tensor::adopt(out);
}
inline Tensor zeros(IntArrayRef size, ScalarType t) { return zeros(size, TensorOptions().dtype(t)); }
inline Tensor empty_like(const Tensor& t, optional<MemoryFormat> format = nullopt) {
  return empty(t.sizes(), t.options(), format);
}
inline Tensor empty_like(const Tensor& t, TensorOptions options, optional<MemoryFormat> format = nullopt) {
  return empty(t.sizes(), options, format);
}
inline Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
inline Tensor zeros_like(const Tensor& t, TensorOptions options) { return zeros(t.sizes(), options); }

inline optional<Device> device_of(const Tensor& t) {
  if (!t.defined()) return nullopt;
  return t.device();
}
inline optional<Device> device_of(const optional<Tensor>& t) { return t ? device_of(*t) : nullopt; }

}  // namespace at

namespace c10 {
using at::Tensor;
using at::TensorList;
using at::device_of;
}  // namespace c10

namespace torch {
using namespace at;  // NOLINT: torch:: re-exports at:: like the real headers
using at::Tensor;
using c10::Device;
using c10::DeviceType;
using c10::Error;
using c10::IntArrayRef;
using c10::ScalarType;
using c10::TensorOptions;
using c10::requires_grad;
namespace indexing {}
}  // namespace torch

// The AT_DISPATCH_* macros: run a lambda with scalar_t bound to the tensor's element type.
#define CUDA_AGENT_FAST_CASE(enum_type, cpp_type, ...) \
  case ::c10::ScalarType::enum_type: {                 \
    using scalar_t = cpp_type;                         \
    return __VA_ARGS__();                              \
  }
#define CUDA_AGENT_FAST_DISPATCH(TYPE, NAME, CASES)                                                   \
  [&] {                                                                                               \
    const ::c10::ScalarType cuda_agent_type_ = ::c10::ScalarType(TYPE);                               \
    switch (cuda_agent_type_) {                                                                       \
      CASES                                                                                           \
      default:                                                                                        \
        throw ::c10::Error(::cuda_agent::fast::concat('"', NAME, "\" not implemented for '",          \
                                                      ::c10::toString(cuda_agent_type_), "'"));       \
    }                                                                                                 \
  }()
#define AT_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...)                                                   \
  CUDA_AGENT_FAST_DISPATCH(TYPE, NAME, CUDA_AGENT_FAST_CASE(Float, float, __VA_ARGS__)               \
                                           CUDA_AGENT_FAST_CASE(Double, double, __VA_ARGS__))
#define AT_DISPATCH_FLOATING_TYPES_AND_HALF(TYPE, NAME, ...)                                          \
  CUDA_AGENT_FAST_DISPATCH(TYPE, NAME, CUDA_AGENT_FAST_CASE(Float, float, __VA_ARGS__)               \
                                           CUDA_AGENT_FAST_CASE(Double, double, __VA_ARGS__)          \
                                               CUDA_AGENT_FAST_CASE(Half, ::c10::Half, __VA_ARGS__))
#define AT_DISPATCH_FLOATING_TYPES_AND(SCALARTYPE, TYPE, NAME, ...)                                      \
  CUDA_AGENT_FAST_DISPATCH(TYPE, NAME, CUDA_AGENT_FAST_CASE(Float, float, __VA_ARGS__)                  \
                                           CUDA_AGENT_FAST_CASE(Double, double, __VA_ARGS__)             \
                                               CUDA_AGENT_FAST_EXTRA_CASE(SCALARTYPE, __VA_ARGS__))
#define AT_DISPATCH_FLOATING_TYPES_AND2(SCALARTYPE1, SCALARTYPE2, TYPE, NAME, ...)                       \
  CUDA_AGENT_FAST_DISPATCH(TYPE, NAME, CUDA_AGENT_FAST_CASE(Float, float, __VA_ARGS__)                  \
                                           CUDA_AGENT_FAST_CASE(Double, double, __VA_ARGS__)             \
                                               CUDA_AGENT_FAST_EXTRA_CASE(SCALARTYPE1, __VA_ARGS__)      \
                                                   CUDA_AGENT_FAST_EXTRA_CASE(SCALARTYPE2, __VA_ARGS__))
#define AT_DISPATCH_INTEGRAL_TYPES(TYPE, NAME, ...)                                                      \
  CUDA_AGENT_FAST_DISPATCH(TYPE, NAME, CUDA_AGENT_FAST_CASE(Byte, uint8_t, __VA_ARGS__)                 \
                           CUDA_AGENT_FAST_CASE(Char, int8_t, __VA_ARGS__)                               \
                           CUDA_AGENT_FAST_CASE(Short, int16_t, __VA_ARGS__)                             \
                           CUDA_AGENT_FAST_CASE(Int, int32_t, __VA_ARGS__)                               \
                           CUDA_AGENT_FAST_CASE(Long, int64_t, __VA_ARGS__))
#define AT_DISPATCH_ALL_TYPES(TYPE, NAME, ...)                                                           \
  CUDA_AGENT_FAST_DISPATCH(TYPE, NAME, CUDA_AGENT_FAST_CASE(Byte, uint8_t, __VA_ARGS__)                 \
                           CUDA_AGENT_FAST_CASE(Char, int8_t, __VA_ARGS__)                               \
                           CUDA_AGENT_FAST_CASE(Short, int16_t, __VA_ARGS__)                             \
                           CUDA_AGENT_FAST_CASE(Int, int32_t, __VA_ARGS__)                               \
                           CUDA_AGENT_FAST_CASE(Long, int64_t, __VA_ARGS__)                              \
                           CUDA_AGENT_FAST_CASE(Float, float, __VA_ARGS__)                               \
                           CUDA_AGENT_FAST_CASE(Double, double, __VA_ARGS__))
// A case for a ScalarType value given as an expression (at::kHalf, at::ScalarType::BFloat16, ...).
#define CUDA_AGENT_FAST_EXTRA_CASE(SCALARTYPE, ...)                                         \
  case SCALARTYPE: {                                                                        \
    using scalar_t = typename ::cuda_agent::fast::CppTypeOf<SCALARTYPE>::type;              \
    return __VA_ARGS__();                                                                   \
  }

namespace cuda_agent {
namespace fast {
template <c10::ScalarType S>
struct CppTypeOf;
template <> struct CppTypeOf<c10::ScalarType::Byte> { using type = uint8_t; };
template <> struct CppTypeOf<c10::ScalarType::Char> { using type = int8_t; };
template <> struct CppTypeOf<c10::ScalarType::Short> { using type = int16_t; };
template <> struct CppTypeOf<c10::ScalarType::Int> { using type = int32_t; };
template <> struct CppTypeOf<c10::ScalarType::Long> { using type = int64_t; };
template <> struct CppTypeOf<c10::ScalarType::Half> { using type = c10::Half; };
template <> struct CppTypeOf<c10::ScalarType::Float> { using type = float; };
template <> struct CppTypeOf<c10::ScalarType::Double> { using type = double; };
template <> struct CppTypeOf<c10::ScalarType::Bool> { using type = bool; };
template <> struct CppTypeOf<c10::ScalarType::BFloat16> { using type = c10::BFloat16; };
}  // namespace fast
}  // namespace cuda_agent
