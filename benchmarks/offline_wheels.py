"""Wheels of Ray for a GPU machine that has CUDA PyTorch but no package index, small enough
to copy there with the repository (about 48 MB): `benchmarks/gpu_checks.sh` installs them
(`RAYSHARD_WHEELS=DEST`) before the benchmarks that need Ray.

    python benchmarks/offline_wheels.py DEST [--python-version 3.12] [--ray 2.60.0]
                                             [--extra NAME==VERSION ...] [--no-default-extras]

Downloads, for that Python on manylinux x86-64 and without dependencies, Ray and the
packages Ray's `data` and `train` extras need beyond such an image (jsonschema and its
three helpers, pydantic with pydantic-core pinned to it, and tensorboardX; `--extra` adds
more, `--no-default-extras` drops that list), then rewrites Ray's wheel without its Java
worker (`ray/jars`, 31 of its 79 MB; rayshard starts Python workers only). A pure-Python
check of the result: `pip install --no-index --no-deps --target DIR DEST/*.whl`, then
`import ray` with DIR on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
EXTRA = (
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "pydantic==2.11.7",  # (asks only typing-extensions>=4.12.2 of the image)
    "pydantic-core==2.33.2",  # the one that pydantic pins
    "annotated-types",
    "typing-inspection",
    "tensorboardX",
)
DROPPED = ("ray/jars/",)


def strip_wheel(wheel: Path, dest: Path, dropped: tuple[str, ...] = DROPPED) -> Path:
    """`wheel` rewritten into `dest` without the files under `dropped`, and without their
    lines in its RECORD (the wheel's file list, which pip installs by)."""
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            if info.filename.startswith(dropped):
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in data.decode().splitlines() if not line.startswith(dropped)]
                data = ("\n".join(kept) + "\n").encode()
            target.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return out


def download(names: list[str], dest: Path, python_version: str) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", *platforms]
    subprocess.run([*command, "-d", str(dest), *names], check=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with `wanted`: the wheels to download besides Ray's."""
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    parser.add_argument("--ray", default=ray.__version__, help="Ray's version (this one's)")
    parser.add_argument("--extra", nargs="*", default=[], help="wheels to add to the list")
    parser.add_argument(
        "--no-default-extras", action="store_true", help="only Ray and the --extra wheels"
    )
    args = parser.parse_args(argv)
    args.wanted = [*(() if args.no_default_extras else EXTRA), *args.extra]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    if args.wanted:
        download(args.wanted, args.dest, args.python_version)
    whole = args.dest / "whole"
    whole.mkdir(exist_ok=True)
    download([f"ray=={args.ray}"], whole, args.python_version)
    for wheel in whole.glob("ray-*.whl"):
        strip_wheel(wheel, args.dest)
        wheel.unlink()
    whole.rmdir()
    total = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    print(f"{args.dest}: {len(list(args.dest.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
