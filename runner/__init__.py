"""run: declarative job specs for PyTorch distributed training (spec -> validation -> plan -> launch)."""
