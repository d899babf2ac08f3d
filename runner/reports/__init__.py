"""How runs ended, for people and tools: the end-of-run summary (run_summary), a sweep's table and plot (sweep),
what the ranks' dumps say of a hang or a slow rank (hangs), where the ranks are when `run` asks (where). They read
the plan and the run folder's records (runner.records); never the worker, which uses hangs itself."""
