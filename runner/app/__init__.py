"""The entry points: `run` (cli: compose with Hydra, then launch one job with launch), its launch agent
(agent), the task a scheduler starts (task: ``python -P -m runner.app.task``), and the shapes of
``topology=NxM`` that are no file (topology_shapes). The top layer: it may import every other."""
