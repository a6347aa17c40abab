"""Ledger claims are fenced: a holder frozen past its deadline cannot change its successor's result, and no
host's clock decides a deadline (the server's does). Real nats-server; the frozen holder is a real process
stopped with SIGSTOP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import CONSUMED
from tests.support.polling import async_wait_until

RUN = "fenced-run"

#: A claimant in its own process: claims the batch, says so, then waits for a line on stdin and tries to mark the
#: batch consumed, then to release it, printing what each answered.
CLAIMANT = """
import asyncio, json, sys
from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.errors import ClaimLostError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger

async def main():
    async with open_connection(ConnectionSettings(servers=sys.argv[1])) as conn:
        ledger = await BatchLedger.open(conn, visibility_timeout=2)
        claim = await ledger.claim("fenced-run", "b0", owner="zombie")
        print(json.dumps({"revision": claim.revision, "claim_id": claim.claim_id}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        answers = {}
        for name, call in (("mark_consumed", lambda: ledger.mark_consumed(claim)),
                           ("release", lambda: ledger.release(claim, error="late")),
                           ("extend", lambda: ledger.extend(claim))):
            try:
                await call()
                answers[name] = "done"
            except ClaimLostError as exc:
                answers[name] = exc.reason
        print(json.dumps(answers), flush=True)

asyncio.run(main())
"""


def test_a_claimant_frozen_past_its_deadline_cannot_finish_over_its_successor(
        settings: ConnectionSettings) -> None:
    """Holds on the code before claim tokens too (the claim_id check under the revision compare-and-set); this
    test keeps it so."""
    async def record() -> None:
        async with open_connection(settings) as conn:
            await (await BatchLedger.open(conn)).record(RUN, "b0", stream="ORDERS", count=3, first_seq=1, last_seq=3)

    asyncio.run(record())
    zombie = subprocess.Popen([sys.executable, "-c", CLAIMANT, settings.servers[0]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert zombie.stdout is not None and zombie.stdin is not None
        claimed = json.loads(zombie.stdout.readline())
        os.kill(zombie.pid, signal.SIGSTOP)

        async def succeed() -> tuple[int, str]:
            async with open_connection(settings) as conn:
                successor = await BatchLedger.open(conn, visibility_timeout=60)
                held: list = []

                async def take() -> bool:
                    held.append(await successor.claim(RUN, "b0", owner="successor"))
                    return held[-1] is not None

                await async_wait_until(take, "the frozen claim to expire and the successor to claim", 30, 0.2)
                done = await successor.mark_consumed(held[-1])
                return done.revision, held[-1].claim_id

        consumed_at, successor_claim = asyncio.run(succeed())
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.stdin.write("go\n")
        zombie.stdin.flush()
        answers = json.loads(zombie.stdout.readline())
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.kill()
        zombie.wait(30)
    assert answers == {"mark_consumed": "claim_lost", "release": "claim_lost", "extend": "claim_lost"}

    async def stored():
        async with open_connection(settings) as conn:
            return await BatchLedger(conn).get(RUN, "b0")

    rec = asyncio.run(stored())
    assert (rec.state, rec.owner, rec.claim_id, rec.revision) == (CONSUMED, "successor", successor_claim, consumed_at)
    assert claimed["revision"] < consumed_at, "a later claim's token is higher"


#: A client whose host clock is ``argv[2]`` seconds off (the whole process's ``time.time``, set before anything is
#: imported): claims batch ``argv[3]`` as ``argv[4]``, reaps the run and prints what it got.
SKEWED_CLIENT = """
import sys, time
real_time = time.time
time.time = lambda: real_time() + float(sys.argv[2])
import asyncio, json
from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger

async def main():
    async with open_connection(ConnectionSettings(servers=sys.argv[1])) as conn:
        ledger = await BatchLedger.open(conn, visibility_timeout=600)
        claim = await ledger.claim("fenced-run", sys.argv[3], owner=sys.argv[4])
        reaped = await ledger.reap("fenced-run")
        print(json.dumps({"claimed": claim is not None, "reaped": reaped["returned_count"]}))

asyncio.run(main())
"""


def skewed_client(settings: ConnectionSettings, skew: float, batch_id: str, owner: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", SKEWED_CLIENT, settings.servers[0], str(skew), batch_id, owner],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_a_skewed_host_clock_does_not_decide_who_holds_a_claim(settings: ConnectionSettings) -> None:
    """Before, deadlines were the hosts' wall clocks: a successor whose clock ran 2 h ahead took over a live
    claim (and its reap returned it), and a claimant whose clock ran 2 h behind wrote a deadline already past,
    so an honest host took its batch at once."""
    async def honest(step: str) -> object:
        async with open_connection(settings) as conn:
            ledger = await BatchLedger.open(conn, visibility_timeout=600)
            if step == "record":
                for batch_id in ("ahead", "behind"):
                    await ledger.record(RUN, batch_id, stream="ORDERS", count=1)
                return await ledger.claim(RUN, "ahead", owner="holder")
            if step == "claim behind":
                return await ledger.claim(RUN, "behind", owner="successor")
            held = [await ledger.get(RUN, batch_id) for batch_id in ("ahead", "behind")]
            return [(rec.state, rec.owner) for rec in [await ledger.mark_consumed(claim) for claim in held if claim]]

    assert asyncio.run(honest("record")) is not None
    assert skewed_client(settings, +7200, "ahead", "successor") == {"claimed": False, "reaped": 0}
    assert skewed_client(settings, -7200, "behind", "holder") == {"claimed": True, "reaped": 0}
    assert asyncio.run(honest("claim behind")) is None
    assert asyncio.run(honest("finish")) == [(CONSUMED, "holder"), (CONSUMED, "holder")]
