// Slim stand-in for <c10/cuda/CUDAFunctions.h> in fast-built bindings (see cuda_agent_fast_cuda.h).
#pragma once
#include "cuda_agent_fast_cuda.h"
