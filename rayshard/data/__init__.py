"""The data path inside one process: columns to arrays (`columns`, `ragged`), rows to
batches (`batching`), packing options (`packing`), user transforms (`transforms`) and the
output formats (`formats`). No Ray here: the runtime calls these in readers or consumers."""
