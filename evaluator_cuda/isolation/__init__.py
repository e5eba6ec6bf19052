"""What keeps candidate code away from the grader: child processes with limits (sandbox), the
channel to them (wire), the guard against torch compute and the static source checks."""
