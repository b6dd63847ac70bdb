"""A Lightning `Trainer` for tests in one process: CPU, quiet, no logger, no checkpoints."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


def quiet_trainer(*callbacks: Any, epochs: int, **options: Any) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **options,
    )
