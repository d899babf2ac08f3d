"""From a validated job to what a run is: one place per process (runner.spec.place) by a pure function
(processes), and the plan in words and JSON (render). Depends on ``runner.spec`` and on ``runner.records`` (the
run folder's names: where the init file of a file:// rendezvous is) only."""
