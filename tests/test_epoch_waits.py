"""The epoch-end wait protocol without Ray: which commands wake waiting ranks, and how
`EpochWaits` answers (at once, on a signal, quiet after its timeout, busy past its limit).
The real-Ray side is `tests/runtime/test_epoch_end_wake.py`."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rayshard.core import commands as cmd
from rayshard.runtime.epoch_waits import MAX_WAITING, EpochWaits, changes_answers

LONG_S = 3600.0  # a wait that only a signal can end within the test


@pytest.mark.parametrize(
    ("command", "decision", "wakes"),
    [
        (cmd.Lost(1, "reader died"), cmd.RankLost(1, ((0, 8),)), True),
        (cmd.Lost(1, "left"), cmd.RankLost(1), True),
        (cmd.Register(0, 2, 0, 2), None, True),  # a join, or a rank replaced (its work back)
        (cmd.Restore({}), None, True),
        (cmd.Lease(0, 0), cmd.Leased(((0, 8),)), False),
        (cmd.Lease(0, 0, finishing=True), cmd.Leased((), wait=True), False),
        (cmd.Lease(0, 0), cmd.Leased(((0, 8),), stragglers=(1,)), True),  # work taken back
        (cmd.Ack(0, 0, 1, np.array([[0, 8]])), None, False),  # the epoch's end: by the shell
        (cmd.StartEpoch(0, 0), 3, False),
        (cmd.Attach(0, "reader-0"), None, False),
    ],
)
def test_which_commands_wake_waiting_ranks(command, decision, wakes):
    assert changes_answers(command, decision) is wakes


async def _held(waits: EpochWaits, token: str, count: int) -> list:
    """`count` waits on `token`, each held once this returns."""
    tasks = [asyncio.create_task(waits.wait(token, LONG_S, ended=False)) for _ in range(count)]
    await asyncio.sleep(0)  # each runs up to its wait
    assert waits.held == count and not any(task.done() for task in tasks)
    return tasks


def test_a_wait_without_a_token_gets_one_at_once():
    async def run():
        waits = EpochWaits()
        outcome, token = await waits.wait("", LONG_S, ended=False)
        assert (outcome, token) == ("changed", waits.token()) and waits.held == 0

    asyncio.run(run())


def test_a_held_wait_ends_at_the_signal_with_a_new_token():
    async def run():
        waits = EpochWaits()
        token = waits.token()
        held = await _held(waits, token, 3)
        waits.signal()
        answers = await asyncio.gather(*held)
        assert answers == [("changed", waits.token())] * 3 and waits.token() != token
        assert waits.held == 0

    asyncio.run(run())


def test_a_change_before_the_wait_ends_it_at_once():
    # The race of a rank told to wait: a change between its last token and its wait.
    async def run():
        waits = EpochWaits()
        token = waits.token()
        waits.signal()
        assert await waits.wait(token, LONG_S, ended=False) == ("changed", waits.token())

    asyncio.run(run())


def test_an_ended_epoch_ends_a_wait_at_once():
    async def run():
        waits = EpochWaits()
        token = waits.token()
        assert await waits.wait(token, LONG_S, ended=True) == ("changed", token)

    asyncio.run(run())


def test_a_quiet_wait_keeps_its_token():
    async def run():
        waits = EpochWaits()
        token = waits.token()
        assert await waits.wait(token, 0.0, ended=False) == ("quiet", token)
        assert waits.held == 0

    asyncio.run(run())


def test_waits_past_the_limit_are_busy_and_a_restarted_coordinators_tokens_differ():
    async def run():
        waits = EpochWaits()
        token = waits.token()
        held = await _held(waits, token, MAX_WAITING)
        assert await waits.wait(token, LONG_S, ended=False) == ("busy", token)
        waits.signal()
        await asyncio.gather(*held)
        # A new instance (a restarted coordinator) never matches an old token.
        again = EpochWaits()
        assert again.token() != token
        assert (await again.wait(token, LONG_S, ended=False))[0] == "changed"

    asyncio.run(run())
