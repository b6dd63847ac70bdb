"""rayshard text example: a tiny causal language model on the Python standard library.

The source files of this Python's own standard library (`sysconfig.get_paths()["stdlib"]`)
are cut into chunks of whole lines and stored as text in Parquet. A small byte-level BPE
(the `tokenizers` package, trained at start on those chunks) tokenizes them inside the
reader actors through `Loader(transform=...)`, which returns fixed-length `input_ids` and
`attention_mask` numpy arrays; a one-layer causal transformer trains on them under Ray
Train's TorchTrainer. Ends with the coverage table.

Runs on an embedded local Ray (`make example-text`) and unchanged on a cluster
(`ray submit cluster.yaml examples/train_text.py`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import sysconfig
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import rayshard.train
from rayshard.loader import Loader
from rayshard.runtime.audit import format_report, start_audit
from rayshard.runtime.ray_tuning import apply_ray_env_defaults
from rayshard.sources.parquet import ParquetSource

SEQ_LEN, VOCAB, PAD = 128, 2048, 0


def stdlib_chunks(max_bytes: int, chunk_chars: int = 450) -> list[tuple[str, str]]:
    """(file, text) chunks of whole lines from the standard library's top-level modules,
    in file-name order, up to `max_bytes` of text."""
    folder = sysconfig.get_paths()["stdlib"]
    chunks: list[tuple[str, str]] = []
    total = 0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
            lines = handle.readlines()
        current = ""
        for line in lines:
            if current and len(current) + len(line) > chunk_chars:
                chunks.append((name, current))
                total += len(current)
                current = ""
            current += line
        if current.strip():
            chunks.append((name, current))
            total += len(current)
        if total >= max_bytes:
            break
    return chunks


def make_dataset(folder: str, max_bytes: int, files: int = 4) -> str:
    os.makedirs(folder, exist_ok=True)
    chunks = stdlib_chunks(max_bytes)
    bounds = np.linspace(0, len(chunks), files + 1).astype(int)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "file": [f for f, _ in chunks[lo:hi]],
                "text": [t for _, t in chunks[lo:hi]],
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{index}.parquet"), row_group_size=64)
    return folder


def source_texts(source: ParquetSource) -> list[str]:
    """Every row's `text`, read through the loader's own source (so `--data` names files
    as the loader does: a file, a folder, a glob, a URI)."""
    rows = source.layout().num_samples
    return [t for batch in source.read(0, rows, ["text"]) for t in batch.column("text").to_pylist()]


def train_tokenizer(source: ParquetSource, vocab_size: int = VOCAB) -> str:
    """A byte-level BPE trained on the dataset's text; returned as JSON (it pickles as a
    string into the transform, which builds the tokenizer once per reader)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = source_texts(source)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer.to_str()


class Tokenize:
    """The loader's transform: text -> `input_ids` (<bos> + tokens, cut or padded to
    `seq_len`) and `attention_mask` (1 for real tokens), as numpy arrays."""

    def __init__(self, tokenizer_json: str, seq_len: int = SEQ_LEN) -> None:
        self.tokenizer_json, self.seq_len = tokenizer_json, seq_len
        self._tokenizer = None

    def __getstate__(self) -> dict:
        return {"tokenizer_json": self.tokenizer_json, "seq_len": self.seq_len}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["tokenizer_json"], state["seq_len"])

    def __call__(self, batch: dict, ctx) -> dict:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_str(self.tokenizer_json)
        bos = self._tokenizer.token_to_id("<bos>")
        ids = np.full((len(batch["text"]), self.seq_len), PAD, dtype=np.int64)
        for row, encoding in enumerate(self._tokenizer.encode_batch(batch["text"])):
            tokens = [bos, *encoding.ids][: self.seq_len]
            ids[row, : len(tokens)] = tokens
        return {
            "id": batch["id"],
            "input_ids": ids,
            "attention_mask": (ids != PAD).astype(np.int64),
        }


class TinyCausalLM(torch.nn.Module):
    """Token + position embeddings, one pre-norm transformer layer with a causal mask."""

    def __init__(self, vocab: int = VOCAB, dim: int = 64, seq_len: int = SEQ_LEN) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(seq_len, dim)
        self.layer = torch.nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=4 * dim, batch_first=True, norm_first=True, dropout=0.0
        )
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        hidden = self.tokens(input_ids) + self.positions(positions)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length, device=hidden.device)
        return self.head(self.layer(hidden, src_mask=mask, is_causal=True))


def train_loop_per_worker(config: dict) -> None:
    """One Train worker: token ids from the readers -> next-token loss on real tokens."""
    torch.set_num_threads(1)
    batches = rayshard.train.iterator(config["loader"])
    audit = config["audit"]
    model = ray.train.torch.prepare_model(TinyCausalLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    while batches.epoch < config["epochs"]:
        epoch, tokens, loss_sum = batches.epoch, 0, 0.0
        for batch in batches:
            real = (~batch["_padded"]).unsqueeze(1)
            ids, mask = batch["input_ids"], batch["attention_mask"]
            logits = model(ids[:, :-1])
            weight = (mask[:, 1:] * real).float()  # predict real tokens of real rows only
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
            )
            loss = (losses * weight.reshape(-1)).sum() / weight.sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            audit.add.remote(epoch, batch["id"][~batch["_padded"]].cpu().numpy())
            tokens += int(weight.sum())
            loss_sum += float(loss) * int(weight.sum())
        with tempfile.TemporaryDirectory() as folder:
            rayshard.train.save_state(batches, folder)
            loss = loss_sum / max(tokens, 1)
            metrics = {"epoch": epoch, "loss": loss, "perplexity": math.exp(loss)}
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        help="Parquet with an int64 `id` column (unique per row: the coverage audit counts "
        "it) and a `text` column: a file, a folder, a glob or a URI, as `ParquetSource` "
        "takes; on a multi-node cluster, storage every node can read (default: the "
        "stdlib, written under ./rayshard-output, which only this machine sees)",
    )
    parser.add_argument("--max-bytes", type=int, default=600_000, help="stdlib text to use")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--storage", default=os.path.abspath("rayshard-output/ray-results"))
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS"),
        help="Ray address (default: RAY_ADDRESS, else the cluster `ray start` runs here, else "
        "a new local Ray); `local` always starts a new one",
    )
    args = parser.parse_args(argv)

    apply_ray_env_defaults()  # for the local Ray this may start (see rayshard.runtime.ray_tuning)
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    data = args.data or make_dataset(os.path.abspath("rayshard-output/stdlib-text"), args.max_bytes)
    source = ParquetSource(data, columns=["id", "text"])
    started = time.perf_counter()
    tokenizer_json = train_tokenizer(source)
    print(f"BPE tokenizer ({VOCAB} tokens) trained in {time.perf_counter() - started:.1f} s")
    loader = Loader(
        source,
        batch_size=args.batch_size,
        name="text",
        shuffle=True,
        seed=7,
        transform=Tokenize(tokenizer_json),
    )
    num_samples = loader.layout.num_samples
    audit = start_audit(num_samples)
    print(
        f"rayshard text: {num_samples} chunks of standard-library source, tokenized in the "
        f"readers to {SEQ_LEN} tokens; {args.workers} workers, {args.epochs} epochs",
        flush=True,
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"loader": loader, "audit": audit, "epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=f"rayshard-text-{int(time.time())}", storage_path=args.storage),
    )
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    report = ray.get(audit.report.remote())
    exact = len(report) == args.epochs and all(
        r["lost"] == 0 and r["duplicates"] == 0 for r in report.values()
    )
    print("\n" + format_report(report))
    print(
        f"trained {args.epochs} epochs in {elapsed:.1f} s; final loss "
        f"{result.metrics.get('loss', float('nan')):.3f} per token, perplexity "
        f"{result.metrics.get('perplexity', float('nan')):.1f} (uniform: {VOCAB})"
    )
    loader.shutdown()
    if not exact:
        print("rayshard text: FAILED coverage check", flush=True)
        return 1
    print("rayshard text: OK (every chunk once per epoch)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
