"""rayshard mixing example: pretrain a tiny byte-level LM on two sources mixed 0.7/0.3.

Two real text sources from this Python's standard library: chunks of its modules' source
code (written to Parquet by pyarrow, with a `file` column) and its docstrings (written by
pandas, with a `qualname` column). Both are tokenized byte-level (token = byte + 2;
0 is padding, 1 begins a document) into a `tokens` list column. A `MixedSource` draws
exactly 70% of every epoch from the code and 30% from the docstrings (the smaller source is
repeated in whole cycles plus a seeded remainder, the larger one subsampled anew every
epoch). The readers pack the picked documents into rows of exactly 256 tokens (documents
split across rows where needed; `position_ids` restart per document, `document_ids` give a
block-diagonal causal attention mask); `--pad` pads each document to the batch's longest
row (at most 256) instead. A one-layer causal transformer trains under Ray Train's
TorchTrainer. Ends with samples and tokens per source and epoch, as the model received
them, and checks that every epoch delivered exactly the mix's picks, each once (packed:
every token of every picked document once).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import sysconfig
import tempfile
import time
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import rayshard.train
from rayshard.data.columns import Padding
from rayshard.data.packing import Packing
from rayshard.loader import Loader
from rayshard.runtime.ray_tuning import apply_ray_env_defaults
from rayshard.sources.mixed import MixedSource
from rayshard.sources.parquet import ParquetSource

SEQ_LEN, VOCAB, PAD, BOS = 256, 258, 0, 1
MAX_POSITION = 4096  # position_ids continue across rows inside a split document
WEIGHTS = (0.7, 0.3)
NAMES = ("code", "docstrings")


def byte_tokens(text: str) -> list[int]:
    """<bos> + UTF-8 bytes shifted past the two special ids."""
    return [BOS, *(b + 2 for b in text.encode("utf-8"))]


def stdlib_modules(max_files: int) -> list[str]:
    folder = sysconfig.get_paths()["stdlib"]
    names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))[:max_files]
    return [os.path.join(folder, n) for n in names]


def make_sources(folder: str, max_files: int) -> tuple[str, str]:
    """Code chunks (pyarrow) and docstrings (pandas) of the first `max_files` modules."""
    code, docs = [], []
    for path in stdlib_modules(max_files):
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        name = os.path.basename(path)
        chunk = ""
        for line in text.splitlines(keepends=True):
            if chunk and len(chunk) + len(line) > 600:
                code.append((name, chunk))
                chunk = ""
            chunk += line
        if chunk.strip():
            code.append((name, chunk))
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append((f"{name}:{getattr(node, 'name', '<module>')}", doc))
    os.makedirs(os.path.join(folder, "code"), exist_ok=True)
    os.makedirs(os.path.join(folder, "docstrings"), exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "file": [f for f, _ in code],
                "tokens": pa.array([byte_tokens(t) for _, t in code], pa.list_(pa.int16())),
            }
        ),
        os.path.join(folder, "code", "part-0.parquet"),
        row_group_size=128,
    )
    pd.DataFrame(
        {
            "qualname": [q for q, _ in docs],
            "tokens": [np.array(byte_tokens(t), dtype=np.int64) for _, t in docs],
        }
    ).to_parquet(os.path.join(folder, "docstrings", "part-0.parquet"), row_group_size=128)
    return os.path.join(folder, "code"), os.path.join(folder, "docstrings")


def make_loader(
    code: str, docs: str, batch_size: int, samples: int | None, pack: bool = True
) -> Loader:
    source = MixedSource(
        [ParquetSource(code), ParquetSource(docs)],
        WEIGHTS,
        samples_per_epoch=samples,
        columns=["tokens"],
        split_rows=256,
    )
    return Loader(
        source,
        batch_size=batch_size,
        name="pretrain-mix",
        shuffle=True,
        seed=7,
        **(
            {"packing": Packing(column="tokens", seq_len=SEQ_LEN, pad_id=PAD)}
            if pack
            else {"padding": {"tokens": Padding(pad_value=PAD, max_length=SEQ_LEN)}}
        ),
    )


class MixAudit:
    """Per epoch, what the training loops received: (position, tokens) per document
    (packed: per document id and batch, so a document split across rows comes in parts)."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[int, int]]] = {}

    def add(self, epoch: int, rows: list[tuple[int, int]]) -> None:
        self.rows.setdefault(epoch, []).extend(rows)

    def get(self) -> dict[int, list[tuple[int, int]]]:
        return self.rows


class TinyCausalLM(torch.nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, dim)
        self.positions = torch.nn.Embedding(MAX_POSITION, dim)
        self.layer = torch.nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=4 * dim, batch_first=True, norm_first=True, dropout=0.0
        )
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, documents: torch.Tensor):
        """Causal attention inside each document only (block-diagonal by `documents`)."""
        length = ids.shape[1]
        hidden = self.tokens(ids) + self.positions(positions.clamp(max=MAX_POSITION - 1))
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        allowed = causal & (documents.unsqueeze(2) == documents.unsqueeze(1))
        allowed |= torch.eye(length, dtype=torch.bool, device=ids.device)  # padding sees itself
        mask = (~allowed).repeat_interleave(self.layer.self_attn.num_heads, dim=0)
        return self.head(self.layer(hidden, src_mask=mask))


def model_inputs(batch: dict) -> tuple[torch.Tensor, ...]:
    """(ids, positions, document ids, target weights) of a packed or a padded batch; a
    target counts where it continues the same real document."""
    ids = batch["tokens"].long()
    real = ~batch["_padded"]
    if "document_ids" in batch:  # packed
        documents, positions = batch["document_ids"].long(), batch["position_ids"].long()
        valid = batch["mask"] & real.unsqueeze(1)
    else:  # padded: one document per row
        valid = batch["tokens_mask"] & real.unsqueeze(1)
        documents = torch.where(valid, batch["_index"].long().unsqueeze(1), -1)
        positions = torch.arange(ids.shape[1]).expand_as(ids)
    weight = valid[:, 1:] & (documents[:, 1:] == documents[:, :-1])
    return ids, positions, documents, weight.float()


def delivered(batch: dict) -> list[tuple[int, int]]:
    """(document position in the epoch's mix, tokens of it in this batch), real rows."""
    real = ~batch["_padded"]
    if "document_ids" in batch:
        documents = batch["document_ids"][real]
        found, counts = torch.unique(documents[documents >= 0], return_counts=True)
        return list(zip(found.tolist(), counts.tolist()))
    return list(zip(batch["_index"][real].tolist(), batch["tokens_lengths"][real].tolist()))


def train_loop_per_worker(config: dict) -> None:
    torch.set_num_threads(1)
    batches = rayshard.train.iterator(config["loader"])
    model = ray.train.torch.prepare_model(TinyCausalLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    while batches.epoch < config["epochs"]:
        epoch, tokens, loss_sum = batches.epoch, 0, 0.0
        for batch in batches:
            ids, positions, documents, weight = model_inputs(batch)
            logits = model(ids[:, :-1], positions[:, :-1], documents[:, :-1])
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none"
            )
            loss = (losses * weight.reshape(-1)).sum() / weight.sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            config["audit"].add.remote(epoch, delivered(batch))
            tokens += int(weight.sum())
            loss_sum += float(loss) * int(weight.sum())
        with tempfile.TemporaryDirectory() as folder:
            rayshard.train.save_state(batches, folder)
            metrics = {"epoch": epoch, "loss": loss_sum / max(tokens, 1)}
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))


def check_epochs(
    source: MixedSource, seed: int, epochs: int, got: dict, *, padded: bool = False
) -> bool:
    """Print samples and tokens per source and epoch; True when every epoch delivered
    exactly the mix's picks: every position of the mix, each with all its document's
    tokens once (packed: every token; `padded`: cut at 256)."""
    ok = len(got) == epochs
    print(f"{'epoch':>5} {'source':>10} {'samples':>8} {'share':>6} {'tokens':>9} {'exact':>6}")
    for epoch, rows in sorted(got.items()):
        total = source.layout().num_samples
        source_of, _ = source.mix(seed).locate(epoch, 0, total)
        picked = pa.Table.from_batches(list(source.for_epoch(epoch, seed).read(0, total)))
        lengths = [len(tokens) for tokens in picked["tokens"].to_pylist()]
        tokens = Counter()
        for position, count in rows:
            tokens[position] += count
        exact = sorted(tokens) == list(range(total)) and all(
            tokens[p] == (min(lengths[p], SEQ_LEN) if padded else lengths[p]) for p in range(total)
        )
        for s, name in enumerate(NAMES):
            mine = [tokens[p] for p in range(total) if source_of[p] == s]
            counted = len(mine) == source.counts[s]
            print(
                f"{epoch:>5} {name:>10} {len(mine):>8} {len(mine) / total:>6.2f} "
                f"{sum(mine):>9} {str(exact and counted):>6}"
            )
            ok = ok and exact and counted
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=25, help="stdlib modules to read")
    parser.add_argument("--samples", type=int, help="samples per epoch (default: all rows)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="rows (packed or padded)")
    parser.add_argument("--pad", action="store_true", help="pad documents instead of packing")
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--storage", default=os.path.abspath("rayshard-output/ray-results"))
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"))
    args = parser.parse_args(argv)

    apply_ray_env_defaults()
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    code, docs = make_sources(os.path.abspath("rayshard-output/pretrain-mix"), args.modules)
    loader = make_loader(code, docs, args.batch_size, args.samples, pack=not args.pad)
    source = loader.source
    print(
        f"rayshard mix: {source.sizes[0]} code chunks + {source.sizes[1]} docstrings, weights "
        f"{WEIGHTS} -> {source.counts[0]} + {source.counts[1]} samples per epoch; "
        f"{'padded' if args.pad else f'packed into rows of {SEQ_LEN} tokens'}; "
        f"{args.workers} workers, {args.epochs} epochs",
        flush=True,
    )
    audit = ray.remote(MixAudit).options(num_cpus=0).remote()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"loader": loader, "audit": audit, "epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=f"rayshard-mix-{int(time.time())}", storage_path=args.storage),
    )
    started = time.perf_counter()
    result = trainer.fit()
    print(
        f"trained {args.epochs} epochs in {time.perf_counter() - started:.1f} s; final loss "
        f"{result.metrics.get('loss', float('nan')):.3f} per byte"
    )
    got = ray.get(audit.get.remote())
    ok = check_epochs(source, loader.settings.plan.seed, args.epochs, got, padded=args.pad)
    loader.shutdown()
    if not ok:
        print("rayshard mix: FAILED per-source count or coverage check", flush=True)
        return 1
    print("rayshard mix: OK (exact per-source counts, every pick once per epoch)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
