"""A TCP proxy on 127.0.0.1 in front of nats-server, to fault a client's connection at a chosen moment."""

from __future__ import annotations

import asyncio

from airflow_jetstream.embedded.server import free_port


class CuttableProxy:
    """Forwards bytes between clients and nats-server until :meth:`cut` aborts the live connections.

    With ``hold_after`` set, the first time the server sends bytes containing it the proxy starts dropping what
    clients send, before those bytes are forwarded to the client: whatever a client sends after reading them never
    reaches the server (a partition that keeps the connection open), with no timing involved.
    """

    def __init__(self, target_port: int, *, hold_after: bytes | None = None) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.hold_after = hold_after
        #: Whether the server sent ``hold_after``: client bytes are dropped from then on.
        self.holding = False
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> CuttableProxy:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer, upstream=True), self._pipe(up_reader, writer),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    upstream: bool = False) -> None:
        tail = b""  # the end of the last chunk from the server, so a marker split over two reads is seen
        try:
            while data := await reader.read(65536):
                if upstream:
                    if self.holding:
                        continue
                elif self.hold_after is not None and not self.holding:
                    self.holding = self.hold_after in tail + data
                    tail = data[-len(self.hold_after):]
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        self.server.close()
        await self.server.wait_closed()
