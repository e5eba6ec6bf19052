"""Fast build path for workspace solutions: kernels and bindings compiled alone, in parallel, without torch headers.

A candidate's bindings compile against slim stand-ins for the torch headers (include/: torch::Tensor, allocation,
views, TORCH_CHECK, dtypes, devices, CUDA streams and guards, REGISTER_BINDING) and reach torch at run time
through a binding runtime built once per machine (runtime/, binding_runtime.py). Cold builds take about a second
or two instead of the 18-70 s of a torch-header build; an unchanged solution is a hash lookup; compile errors are
cached too.

    result = builder.build_fast(solution_dir_or_files, backend="cuda", cache_dir=..., arch_list="9.0")
    if result.ok:                 # result.so_path imports like a torch-built cuda_extension
        module = binding_runtime.load_fast_extension(result.so_path)  # or importlib's ExtensionFileLoader
    elif result.fallback_reason:  # a binding needs torch API outside the slim headers
        ...                       # build it the full torch way
    else:                         # the candidate's own compile error
        result.diagnostics        # [{"file": "kernels/op.cu", "line": 12, "message": "..."}]

Worker start: builder.warm_up(backend) and binding_runtime.ensure_binding_runtime() build the shared parts ahead
of the first candidate. evaluator_cuda.extension.build uses build_adapter.fast_build_workspace (same result type
as torch's build).
"""
