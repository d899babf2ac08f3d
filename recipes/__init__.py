"""Training recipes: plain modules with one entry point `main(ctx, cfg)`; they never import launcher internals."""
