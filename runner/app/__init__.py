"""The entry points: `run` (cli: compose with Hydra, then launch one job with launch), its launch agent
(agent), the task a scheduler starts (task: ``python -P -m runner.app.task``), and the config source that
answers ``topology=NxM`` (config_source). The top layer: it may import every other."""
