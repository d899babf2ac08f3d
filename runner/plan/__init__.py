"""From a validated job to what a run is: one record per process by a pure function (processes), every path
of a run's folder (paths), the files that say how each rank ended (outcome), and the plan in words and JSON
(render). Depends on ``runner.spec`` only."""
