"""Scripts that run on every rank under torchrun (torch + stdlib only)."""
