// cuda_agent_fast_all.h -- everything the slim headers offer, in one header the fast build precompiles (PCH) and
// force-includes into every binding. CUDA_AGENT_FAST_CUDA is defined for the cuda backend.
#pragma once
#include "binding_registry.h"
#ifdef CUDA_AGENT_FAST_CUDA
#include <cuda_runtime.h>

#include "cuda_agent_fast_cuda.h"
#endif
