"""What a recipe works with inside one process: its run context (context), model wrapping and sharding
(sharding), loop progress (progress) and its channel to its host agent (output). Depends on ``runner.spec`` types
only; recipes reach it through ``runner.api``."""
