"""The `rayshard` command line: one click group, one module per subcommand."""

from __future__ import annotations

import click

from rayshard.cli.plan_cmd import plan_command
from rayshard.cli.state_cmd import state_group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rayshard")
def main() -> None:
    """rayshard: elastic, exactly-once data loading for Ray Train."""


main.add_command(plan_command)
main.add_command(state_group)

__all__ = ["main"]
