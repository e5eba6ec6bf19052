// Slim stand-in for <torch/torch.h> in fast-built bindings (see cuda_agent_fast_torch.h).
#pragma once
#include "cuda_agent_fast_torch.h"
