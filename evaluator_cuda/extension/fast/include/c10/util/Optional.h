// Slim stand-in for <c10/util/Optional.h> in fast-built bindings (see cuda_agent_fast_torch.h).
#pragma once
#include "cuda_agent_fast_torch.h"
