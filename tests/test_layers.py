"""The package layout is the architecture: a pure core (`core`, `plan`, `config`) that
loads neither Ray nor torch, the data path (`data`) and sources below the Ray shell
(`runtime`, `device`), the public surface on top, and experiment tooling outside the
library. These tests read the import statements, so a layer crossing fails here first."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import rayshard

PACKAGE = pathlib.Path(rayshard.__file__).parent
PURE = ("core", "plan", "config")
SHELL = tuple(
    f"rayshard.{name}" for name in ("runtime", "device", "frameworks", "cli", "loader", "train")
)
# module prefixes each layer may not import: nothing below the shell reaches up into it,
# and the planner stands on the leaf checks alone
FORBIDDEN = {
    "core": SHELL,
    "plan": (
        *SHELL,
        "rayshard.core",
        "rayshard.data",
        "rayshard.sources",
        "rayshard.config.loader_config",
        "rayshard.config.parts",
    ),
    "config": SHELL,
    "data": (*SHELL[:1], *SHELL[2:]),  # formats stage batches for the device feed
    "sources": SHELL,
}
PUBLIC_SURFACE = {"__init__", "errors", "loader", "train"}


def _modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imports(path: pathlib.Path) -> set[str]:
    """Every `rayshard...` or `rayshard_experiments` module named in an import of `path`,
    including imports inside functions (those run too, just later)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n.split(".")[0] in ("rayshard", "rayshard_experiments")}


def _layer(path: pathlib.Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_each_layer_imports_only_what_is_below_it(layer):
    crossings = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in _modules()
        if _layer(path) == layer
        for name in sorted(_imports(path))
        if name.startswith(tuple(f"{prefix}." for prefix in FORBIDDEN[layer]))
        or name in FORBIDDEN[layer]
    ]
    assert crossings == []


def test_the_library_never_imports_the_experiment_tooling():
    users = [
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if any(n.startswith("rayshard_experiments") for n in _imports(p))
    ]
    assert users == []


def test_the_top_level_holds_only_the_public_surface():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == PUBLIC_SURFACE, f"move {sorted(top - PUBLIC_SURFACE)} into a package"


def test_no_module_is_much_over_300_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > 320
    }
    assert long == {}


def test_the_pure_layers_load_neither_ray_nor_torch():
    modules = [
        ".".join(("rayshard", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for p in _modules()
        if _layer(p) in PURE
    ]
    assert len(modules) > 20
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_configuration_classes_resolve_lazily_from_the_config_package():
    code = (
        "import sys\n"
        "import rayshard.config.checks\n"
        "print('rayshard.config.loader_config' in sys.modules)\n"
        "from rayshard.config import LoaderConfig, PlanConfig, ReadConfig, RuntimeConfig\n"
        "from rayshard.config.loader_config import LoaderConfig as Direct\n"
        "print(LoaderConfig is Direct, PlanConfig.__name__, ReadConfig.__name__)\n"
        "print(RuntimeConfig.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "PlanConfig", "ReadConfig", "RuntimeConfig"]
