"""From a validated job to what a run is: one record per process by a pure function (processes), every path
of a run's folder (paths), the files that say how each rank ended (outcome) and what the ranks recorded of
their collectives, read as a hang or a straggler (diagnostics), and the plan in words and JSON (render).
Depends on ``runner.spec`` only."""
