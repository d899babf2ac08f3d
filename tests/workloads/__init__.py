"""Recipes used by the tests: each leaves artifacts the tests check."""
