"""`pid_watch` and a process whose main thread ended while another thread lives: `/proc`
shows its main thread as a zombie (state Z), yet the process runs on and must not be taken
for dead, neither through its pidfd nor by the `/proc` polling fallback (real child
processes, no Ray)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time

import pytest

from rayshard.runtime import pid_watch

pytestmark = pytest.mark.skipif(not pid_watch.pidfds_work(), reason="no pidfds on this system")

NODE = "a" * 56
LEADER_EXIT_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static void *worker(void *arg) { for (;;) sleep(1); return 0; }
int main(void) {
    pthread_t thread;
    pthread_create(&thread, 0, worker, 0);
    printf("ready\n"); fflush(stdout);
    pthread_exit(0); /* the main thread ends; the process lives on in `worker` */
}
"""
# The same without a compiler: the main thread calls pthread_exit through ctypes.
LEADER_EXIT_PY = """
import ctypes, threading, time
threading.Thread(target=lambda: time.sleep(3600)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def _leader_exit_command(folder) -> list[str]:
    """A program whose main thread ends while another thread lives on."""
    if shutil.which("cc"):
        source, binary = folder / "leader_exit.c", folder / "leader_exit"
        source.write_text(LEADER_EXIT_C)
        built = subprocess.run(["cc", "-pthread", "-o", str(binary), str(source)], check=False)
        if built.returncode == 0:
            return [str(binary)]
    return [sys.executable, "-c", LEADER_EXIT_PY]


@pytest.fixture
def leader_exited(tmp_path):
    """A live child process whose main thread has ended (shown as state Z)."""
    child = subprocess.Popen(_leader_exit_command(tmp_path), stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        for _ in range(100):  # the main thread's end shows in /proc a moment later
            stat = pid_watch._stat(child.pid)
            if stat is not None and stat[0] == b"Z":
                break
            time.sleep(0.02)
        else:
            pytest.skip("the child's main thread did not end (pthread_exit unavailable)")
        assert child.poll() is None  # alive: another thread runs
        yield child
    finally:
        child.kill()
        child.wait()


def _token(child: subprocess.Popen) -> str:
    start = pid_watch.start_ticks(child.pid)
    return f"pid:{NODE}:{pid_watch.pid_namespace()}:{child.pid}:{start}"


def test_a_process_whose_main_thread_ended_is_not_taken_for_dead(leader_exited):
    token = _token(leader_exited)
    assert pid_watch.watchable(token, NODE)
    assert not pid_watch._ended(pid_watch.parse(token))  # the polling fallback

    async def waits() -> None:
        with pytest.raises(asyncio.TimeoutError):  # the pidfd: not readable while it runs
            await asyncio.wait_for(pid_watch.exited(token), 0.5)

    asyncio.run(waits())
    assert leader_exited.poll() is None


def test_its_end_is_seen_once_every_thread_ended(leader_exited):
    token = _token(leader_exited)

    async def ends() -> None:
        watch = asyncio.ensure_future(pid_watch.exited(token))
        await asyncio.sleep(0.1)
        assert not watch.done()
        leader_exited.kill()  # now a zombie of one thread, not reaped yet
        await asyncio.wait_for(watch, 10)

    asyncio.run(ends())
    assert pid_watch._ended(pid_watch.parse(token))  # Z with one thread: ended
