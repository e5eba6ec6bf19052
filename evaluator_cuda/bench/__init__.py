"""`cuda-agent bench`: a task set evaluated and reported KernelBench-style."""
