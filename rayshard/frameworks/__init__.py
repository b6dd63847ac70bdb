"""Adapters for training frameworks: Lightning, Hugging Face `Trainer`, torch
`DataLoader` and Accelerate. Each module imports its framework lazily, only when used."""

__all__ = ["lightning", "torch", "transformers"]
