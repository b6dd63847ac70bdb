"""rayshard: a Ray-based elastic distributed data loader for training."""

__version__ = "0.1.0"
