"""`python -m rayshard.cli`: the `rayshard` command (the console entry calls the same
`main`), for environments where the script is not on PATH."""

from rayshard.cli import main

if __name__ == "__main__":
    main(prog_name="rayshard")
