"""Tiny stand-in for examples/train.py in the `ray submit` end-to-end test.

`ray submit` copies this file to ~/hello_ray.py on the head node and runs it there with
`python ~/hello_ray.py` in a login shell of the SSH user. It connects to the cluster that
`ray up` started, runs remote tasks, checks that rayshard is importable from the project
copy that `ray up` synced to the node, and prints a marker line the e2e script looks for.
"""

from __future__ import annotations

import os
import socket
import sys

import ray

MARKER = "rayshard e2e hello: OK"


def main() -> int:
    ray.init(address="auto", log_to_driver=False)

    @ray.remote
    def square(x: int) -> tuple[int, int]:
        return x * x, os.getpid()

    results = ray.get([square.remote(i) for i in range(8)])
    total = sum(value for value, _ in results)
    if total != sum(i * i for i in range(8)):
        print(f"rayshard e2e hello: FAILED (sum of squares {total})", flush=True)
        return 1

    import rayshard

    location = list(getattr(rayshard, "__path__", [])) or [getattr(rayshard, "__file__", "?")]
    resources = ray.cluster_resources()
    try:  # Ray >= 2.52: which authentication mode this driver actually uses
        from ray._raylet import AuthenticationMode, get_authentication_mode

        auth = "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"
    except ImportError:
        auth = "n/a"
    ray.shutdown()
    print(
        f"{MARKER} host={socket.gethostname()} user={os.environ.get('USER', '?')} "
        f"python={sys.executable} ray={ray.__version__} "
        f"auth={auth} "
        f"cpus={resources.get('CPU', 0):g} worker_pids={len({pid for _, pid in results})} "
        f"rayshard={location[0]}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
