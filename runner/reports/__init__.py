"""How runs ended, for people and tools: the end-of-run summary (run_summary) and a sweep's table and plot
(sweep). They read the plan and the run folder (``runner.plan.outcome``); never the worker."""
