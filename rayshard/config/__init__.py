"""Configuration: `LoaderConfig` and its parts (`parts`), the `RAYSHARD_*` environment
(`env`) and the shared value checks (`checks`). Nothing is imported eagerly here, so the
pure core can use `checks` without loading the sources the configuration names."""
