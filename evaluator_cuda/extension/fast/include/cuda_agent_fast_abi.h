/* cuda_agent_fast_abi.h -- the C interface between a fast-built candidate library and the binding runtime.
 *
 * The binding runtime (built once per machine against the real torch headers) owns every torch object.
 * A candidate library (the agent's kernels and bindings, compiled against the slim headers in this folder,
 * never against torch) sees tensors only as opaque handles and reaches torch only through the table below.
 * The table holds tensor metadata, allocation, views/copies and the current CUDA stream: no compute.
 *
 * Every function that can fail returns 0 on success and non-zero on failure; the message of the failure is
 * then available from last_error() (thread-local inside the runtime). Exceptions never cross this boundary.
 */
#ifndef CUDA_AGENT_FAST_ABI_H
#define CUDA_AGENT_FAST_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_AGENT_FAST_ABI_VERSION 1

/* An owned reference to one runtime tensor (NULL = undefined tensor). */
typedef struct cuda_agent_tensor_s* cuda_agent_tensor;

typedef struct cuda_agent_abi {
  uint32_t abi_version;
  uint32_t table_size; /* sizeof(cuda_agent_abi) as the runtime saw it */

  /* errors */
  const char* (*last_error)(void);

  /* lifetime: copy makes a second owned reference to the same tensor; release drops one */
  cuda_agent_tensor (*tensor_copy)(cuda_agent_tensor t);
  void (*tensor_release)(cuda_agent_tensor t);

  /* metadata (t must be defined) */
  int64_t (*dim)(cuda_agent_tensor t);
  const int64_t* (*sizes)(cuda_agent_tensor t);   /* valid while t lives; dim() entries */
  const int64_t* (*strides)(cuda_agent_tensor t); /* valid while t lives; dim() entries */
  int64_t (*numel)(cuda_agent_tensor t);
  int64_t (*storage_offset)(cuda_agent_tensor t);
  int32_t (*scalar_type)(cuda_agent_tensor t); /* c10::ScalarType numbering */
  int32_t (*device_type)(cuda_agent_tensor t); /* c10::DeviceType numbering */
  int32_t (*device_index)(cuda_agent_tensor t);
  int32_t (*is_contiguous)(cuda_agent_tensor t);
  int32_t (*requires_grad)(cuda_agent_tensor t);
  void* (*data_ptr)(cuda_agent_tensor t); /* address of the first element */

  /* allocation: sizes has ndim entries; strides (empty_strided) too */
  int32_t (*empty)(const int64_t* sizes, int64_t ndim, int32_t scalar_type, int32_t device_type,
                   int32_t device_index, cuda_agent_tensor* out);
  int32_t (*empty_strided)(const int64_t* sizes, const int64_t* strides, int64_t ndim, int32_t scalar_type,
                           int32_t device_type, int32_t device_index, cuda_agent_tensor* out);
  int32_t (*zeros)(const int64_t* sizes, int64_t ndim, int32_t scalar_type, int32_t device_type,
                   int32_t device_index, cuda_agent_tensor* out);

  /* views and copies */
  int32_t (*contiguous)(cuda_agent_tensor t, cuda_agent_tensor* out);
  int32_t (*view)(cuda_agent_tensor t, const int64_t* sizes, int64_t ndim, cuda_agent_tensor* out);
  int32_t (*reshape)(cuda_agent_tensor t, const int64_t* sizes, int64_t ndim, cuda_agent_tensor* out);
  /* a view of t's storage with the given geometry (transpose, permute, narrow, select, unsqueeze, expand) */
  int32_t (*as_strided)(cuda_agent_tensor t, const int64_t* sizes, const int64_t* strides, int64_t ndim,
                        int64_t storage_offset, cuda_agent_tensor* out);

  /* CUDA context: the current stream of a device (-1 = current device), current device, set device */
  int32_t (*current_cuda_stream)(int32_t device_index, void** out_stream);
  int32_t (*current_cuda_device)(int32_t* out_index);
  int32_t (*set_cuda_device)(int32_t device_index);
} cuda_agent_abi;

/* One registered binding, as the candidate library describes it to the runtime. */
enum cuda_agent_value_kind {
  CUDA_AGENT_NONE = 0,
  CUDA_AGENT_TENSOR = 1,
  CUDA_AGENT_INT = 2,
  CUDA_AGENT_DOUBLE = 3,
  CUDA_AGENT_BOOL = 4,
  CUDA_AGENT_INT_LIST = 5,
  CUDA_AGENT_TENSOR_LIST = 6,
  CUDA_AGENT_OPTIONAL_TENSOR = 7, /* argument only: a tensor or None */
  CUDA_AGENT_TUPLE = 8            /* result only: a tuple of tensors (from std::tuple / std::pair) */
};

/* One argument or result. Lists point into storage owned by whoever filled the value. */
typedef struct cuda_agent_value {
  int32_t kind;
  int64_t i;   /* INT, BOOL */
  double d;    /* DOUBLE */
  cuda_agent_tensor t; /* TENSOR, OPTIONAL_TENSOR (NULL = None) */
  const int64_t* ints; /* INT_LIST */
  cuda_agent_tensor* tensors; /* TENSOR_LIST, TUPLE */
  int64_t count;       /* INT_LIST, TENSOR_LIST, TUPLE length */
} cuda_agent_value;

/* Calls the binding with nargs arguments. On success fills *result (tensors in it are owned references that
 * the runtime takes over; a list's handle array is released with free_result) and returns 0. On failure
 * returns non-zero and writes the message (NUL-terminated, truncated to error_size) into error. */
typedef int32_t (*cuda_agent_invoke_fn)(const cuda_agent_value* args, int64_t nargs, cuda_agent_value* result,
                                        char* error, int64_t error_size);

typedef struct cuda_agent_binding {
  const char* name;
  cuda_agent_invoke_fn invoke;
  const int32_t* arg_kinds; /* nargs entries */
  int64_t nargs;
  int32_t result_kind;
  const char* signature; /* human-readable, for error messages */
} cuda_agent_binding;

/* Exported by every candidate library. attach() gives it the runtime's table (returns 0 when the versions
 * agree); bindings() lists what REGISTER_BINDING collected; free_result() releases a result's list storage. */
typedef int32_t (*cuda_agent_attach_fn)(const cuda_agent_abi* abi);
typedef const cuda_agent_binding* (*cuda_agent_bindings_fn)(int64_t* count);
typedef void (*cuda_agent_free_result_fn)(cuda_agent_value* result);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_AGENT_FAST_ABI_H */
