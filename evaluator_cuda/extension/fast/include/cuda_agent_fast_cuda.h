// cuda_agent_fast_cuda.h -- the slim CUDA part of the torch API for fast-built bindings: the current stream,
// device guards, device properties and CUDA error checks. Streams and devices come from the binding runtime
// (torch's own current stream), properties and error strings from the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

#include "cuda_agent_fast_torch.h"

#define C10_CUDA_CHECK(expr)                                                                           \
  do {                                                                                                 \
    const cudaError_t cuda_agent_status_ = (expr);                                                     \
    TORCH_CHECK(cuda_agent_status_ == cudaSuccess, "CUDA error: ", cudaGetErrorString(cuda_agent_status_)); \
  } while (false)
#define C10_CUDA_CHECK_WARN(expr)                                                               \
  do {                                                                                          \
    const cudaError_t cuda_agent_status_ = (expr);                                              \
    if (cuda_agent_status_ != cudaSuccess) TORCH_WARN("CUDA warning: ", cudaGetErrorString(cuda_agent_status_)); \
  } while (false)
#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_CUDA_CHECK(cudaGetLastError())
#define AT_CUDA_CHECK(expr) C10_CUDA_CHECK(expr)

namespace c10 {
namespace cuda {

inline DeviceIndex current_device() {
  int32_t index = -1;
  cuda_agent::fast::check_status(cuda_agent::fast::abi().current_cuda_device(&index));
  return static_cast<DeviceIndex>(index);
}
inline void set_device(DeviceIndex index) {
  cuda_agent::fast::check_status(cuda_agent::fast::abi().set_cuda_device(index));
}
inline DeviceIndex device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<DeviceIndex>(count);
}

class CUDAStream {
 public:
  CUDAStream(cudaStream_t stream, DeviceIndex device) : stream_(stream), device_(device) {}
  cudaStream_t stream() const { return stream_; }
  operator cudaStream_t() const { return stream_; }  // NOLINT: implicit like torch
  DeviceIndex device_index() const { return device_; }
  Device device() const { return Device(DeviceType::CUDA, device_); }
  void synchronize() const { C10_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  bool query() const { return cudaStreamQuery(stream_) == cudaSuccess; }
  friend bool operator==(const CUDAStream& a, const CUDAStream& b) { return a.stream_ == b.stream_; }
  friend bool operator!=(const CUDAStream& a, const CUDAStream& b) { return a.stream_ != b.stream_; }

 private:
  cudaStream_t stream_;
  DeviceIndex device_;
};

inline CUDAStream getCurrentCUDAStream(DeviceIndex device = -1) {
  void* stream = nullptr;
  cuda_agent::fast::check_status(cuda_agent::fast::abi().current_cuda_stream(device, &stream));
  return CUDAStream(static_cast<cudaStream_t>(stream), device < 0 ? current_device() : device);
}
inline CUDAStream getDefaultCUDAStream(DeviceIndex device = -1) {
  return CUDAStream(static_cast<cudaStream_t>(nullptr), device < 0 ? current_device() : device);
}

// Sets the current device for its lifetime and restores the previous one after.
class CUDAGuard {
 public:
  explicit CUDAGuard(DeviceIndex index) : original_(::c10::cuda::current_device()), current_(index) {
    switch_to(index);
  }
  explicit CUDAGuard(Device device) : CUDAGuard(index_of(device)) {}
  CUDAGuard(const CUDAGuard&) = delete;
  CUDAGuard& operator=(const CUDAGuard&) = delete;
  ~CUDAGuard() {
    if (current_ != original_) cuda_agent::fast::abi().set_cuda_device(original_);
  }
  void set_device(Device device) { set_index(index_of(device)); }
  void reset_device(Device device) { set_device(device); }
  void set_index(DeviceIndex index) {
    switch_to(index);
    current_ = index;
  }
  Device original_device() const { return Device(DeviceType::CUDA, original_); }
  Device current_device() const { return Device(DeviceType::CUDA, current_); }

 private:
  static DeviceIndex index_of(Device device) {
    TORCH_CHECK(device.is_cuda(), "CUDAGuard: expected a CUDA device but got ", device);
    return device.has_index() ? device.index() : ::c10::cuda::current_device();
  }
  void switch_to(DeviceIndex index) {
    if (index != ::c10::cuda::current_device()) ::c10::cuda::set_device(index);
  }
  DeviceIndex original_;
  DeviceIndex current_;
};

// Like CUDAGuard, but may hold no device (then it does nothing).
class OptionalCUDAGuard {
 public:
  OptionalCUDAGuard() = default;
  explicit OptionalCUDAGuard(optional<Device> device) {
    if (device) set_device(*device);
  }
  explicit OptionalCUDAGuard(Device device) { set_device(device); }
  explicit OptionalCUDAGuard(DeviceIndex index) { set_index(index); }
  OptionalCUDAGuard(const OptionalCUDAGuard&) = delete;
  OptionalCUDAGuard& operator=(const OptionalCUDAGuard&) = delete;
  void set_device(Device device) {
    if (!device.is_cuda()) return;
    if (!guard_) guard_ = std::make_unique<CUDAGuard>(device); else guard_->set_device(device);
  }
  void reset_device(Device device) { set_device(device); }
  void set_index(DeviceIndex index) {
    if (!guard_) guard_ = std::make_unique<CUDAGuard>(index); else guard_->set_index(index);
  }
  optional<Device> original_device() const {
    return guard_ ? optional<Device>(guard_->original_device()) : nullopt;
  }
  optional<Device> current_device() const { return guard_ ? optional<Device>(guard_->current_device()) : nullopt; }
  void reset() { guard_.reset(); }

 private:
  std::unique_ptr<CUDAGuard> guard_;
};

}  // namespace cuda
}  // namespace c10

namespace at {
namespace cuda {

using c10::cuda::CUDAGuard;
using c10::cuda::CUDAStream;
using c10::cuda::OptionalCUDAGuard;
using c10::cuda::current_device;
using c10::cuda::device_count;
using c10::cuda::getCurrentCUDAStream;
using c10::cuda::getDefaultCUDAStream;

inline cudaDeviceProp* getDeviceProperties(DeviceIndex device) {
  static std::mutex lock;
  static std::map<int, std::unique_ptr<cudaDeviceProp>> cache;
  std::lock_guard<std::mutex> hold(lock);
  int index = device;
  auto& slot = cache[index];
  if (!slot) {
    slot = std::make_unique<cudaDeviceProp>();
    C10_CUDA_CHECK(cudaGetDeviceProperties(slot.get(), index));
  }
  return slot.get();
}
inline cudaDeviceProp* getCurrentDeviceProperties() { return getDeviceProperties(c10::cuda::current_device()); }
inline bool is_available() { return c10::cuda::device_count() > 0; }

}  // namespace cuda
}  // namespace at
