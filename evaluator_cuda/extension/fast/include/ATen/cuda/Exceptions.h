// Slim stand-in for <ATen/cuda/Exceptions.h> in fast-built bindings (see cuda_agent_fast_cuda.h).
#pragma once
#include "cuda_agent_fast_cuda.h"
