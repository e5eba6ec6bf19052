"""The parts of scripts/bench_evaluator.py: one module per subcommand and the pieces they share.

    common.py       paths of the checkout, a task and a candidate loaded outside the evaluator, $OUT
    report.py       progress lines with elapsed seconds (Clock), number formatting, PASS/FAIL
    timing.py       wall-clock helpers, builds timed in a fresh interpreter, and the timing child
                    (do_bench on CUDA, a perf_counter median on the host) that examples and speed share
    examples.py     subcommand `examples`
    speed.py        subcommand `speed`: speed_cases.py (sized cases), speed_builds.py (compile times of both
                    forms), kernelbench_form.py (the load_inline form of a workspace), speed_evaluations.py
                    (repeated evaluations, medians), speed_dry_run.py (--dry-run), speed_report.py (tables)
    compile.py      subcommand `compile`: compile_sources.py (the one-kernel candidate), compile_checks.py
                    (outputs compared, call overhead, the examples built fast)
"""
