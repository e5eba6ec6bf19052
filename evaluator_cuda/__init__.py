"""PyTorch/CUDA evaluator: compile, verify, profile and reward untrusted kernels. Depends on torch only."""
