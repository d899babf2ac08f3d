"""Workloads the benchmarks run the same way under every launcher."""
