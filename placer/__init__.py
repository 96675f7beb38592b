"""placer: where every rank of a large-model training job should go."""

__version__ = "0.1.0"
