"""The job spec and its rules: the typed schema behind every YAML option (schema), hosts from the topology
(topology), every rule a spec must pass before anything starts (validation, problems), what validation may
ask of the machine (probe), how a recipe target is found (targets), the validated job (job), and where one
process of it runs (place).

Depends on nothing else of the runner but ``runner.common``."""
