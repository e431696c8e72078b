"""A TCP proxy in front of each Kafka broker that the test steers: it delays, duplicates, holds back and cuts
the traffic between the clients and the brokers, the faults the public analyses of Kafka clients found bugs
with (messages delayed, retried and reordered on the network), where a process kill finds none.

Each node of the test cluster gets a listener of its own (``FAULTY``) whose advertised address is this proxy's
port for that node, so a client bootstrapped through the proxy reaches every broker (partition leaders and
transaction coordinators alike) only through it. The proxy understands Kafka's framing (a 4-byte size, then the
request), so it duplicates and delays whole requests, never half of one:

* ``delay_ms``: each request and each response waits a random time up to this before it is forwarded, on its
  own connection in order (TCP's guarantee), while other connections overtake it;
* ``duplicate``: the share of the clients' transactional and produce requests (Produce, AddPartitionsToTxn,
  AddOffsetsToTxn, EndTxn) sent to the broker twice (a retry the network made; the broker answers both, and the
  client must cope with the stray response). InitProducerId is never doubled: a doubled one bumps the epoch
  twice and fences its own producer, a failure the publish retries, not a fault of interest;
* ``late``: the share of those requests of which a copy reaches the broker ``late_s`` seconds later, on a
  connection of its own (so TCP's order does not hold it back): the delayed produce or EndTxn of an earlier
  transaction arriving during a later one, the case of Jepsen's 2024 analyses; its response is discarded;
* :meth:`FaultProxy.hold`: every byte in both directions is held back for a while, then delivered, on every
  connection (a partition of the network that heals; held longer than the transaction timeout, the requests
  of a transaction arrive after the broker aborted it);
* :meth:`FaultProxy.cut`: every connection is closed at once (the client reconnects).

It runs in a thread of the test process (asyncio); :meth:`FaultProxy.stats` counts what it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import threading
import time
from dataclasses import dataclass, field

DOUBLED = {0, 24, 25, 26}
"""Kafka API keys a ``duplicate`` fault may send twice: Produce, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn."""


@dataclass
class Faults:
    delay_ms: float = 0.0
    duplicate: float = 0.0
    late: float = 0.0
    late_s: float = 5.0


@dataclass
class _Stats:
    connections: int = 0
    requests: int = 0
    duplicated: int = 0
    late: int = 0
    held_s: float = 0.0
    cuts: int = 0
    closed: dict[str, int] = field(default_factory=dict)


class FaultProxy:
    """``routes``: listening port → the broker's (host, port) it forwards to."""

    def __init__(self, routes: dict[int, tuple[str, int]], seed: int = 0) -> None:
        self.routes, self.faults, self.rng = routes, Faults(), random.Random(seed)
        self.stats = _Stats()
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.base_events.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._pending: set[asyncio.Future] = set()
        """Late copies not yet sent (kept referenced, as asyncio asks)."""
        self._held = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="fault-proxy")

    def start(self) -> FaultProxy:
        self._thread.start()
        self._held_release()
        for port, target in self.routes.items():
            server = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(lambda r, w, t=target: self._serve(r, w, t), "127.0.0.1", port), self._loop)
            self._servers.append(server.result(10))
        return self

    def stop(self) -> None:
        async def close() -> None:
            for s in self._servers:
                s.close()
            for w in list(self._writers):
                w.transport.abort()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:  # connections and late copies: ended here, not destroyed pending
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        """No faults, and the counts from zero."""
        self.faults, self.stats = Faults(), _Stats()

    def set(self, delay_ms: float = 0.0, duplicate: float = 0.0, late: float = 0.0, late_s: float = 5.0) -> None:
        self.faults = Faults(delay_ms, duplicate, late, late_s)

    def hold(self, seconds: float) -> None:
        """Hold back every byte, both ways, for ``seconds`` (blocking the caller as long), then deliver it."""
        self._loop.call_soon_threadsafe(self._held.clear)
        time.sleep(seconds)
        self.stats.held_s += seconds
        self._held_release()

    def cut(self) -> None:
        """Close every open connection now."""
        async def close() -> None:
            for w in list(self._writers):
                w.transport.abort()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self.stats.cuts += 1

    def _held_release(self) -> None:
        self._loop.call_soon_threadsafe(self._held.set)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     target: tuple[str, int]) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # stop() ends every connection: not an error
            await self._connection(client_r, client_w, target)

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                          target: tuple[str, int]) -> None:
        self.stats.connections += 1
        try:
            broker_r, broker_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, broker_w}
        up = asyncio.ensure_future(self._pump(client_r, broker_w, target))
        down = asyncio.ensure_future(self._pump(broker_r, client_w, None))
        done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for w in (client_w, broker_w):
            w.transport.abort()
            self._writers.discard(w)
        for task in done:
            why = type(task.exception()).__name__ if task.exception() else "eof"
            self.stats.closed[why] = self.stats.closed.get(why, 0) + 1

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    target: tuple[str, int] | None) -> None:
        """Whole frames from ``reader`` to ``writer``, each after its delay, in order; ``target``: the broker
        (client requests flow this way, and may be doubled), None for responses."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", head)[0])
                frame = head + body
                faults = self.faults
                if faults.delay_ms:
                    await asyncio.sleep(self.rng.uniform(0, faults.delay_ms) / 1000)
                await self._held.wait()
                writer.write(frame)
                if target is not None:
                    self.stats.requests += 1
                    doubled = struct.unpack(">h", body[:2])[0] in DOUBLED
                    if doubled and faults.duplicate and self.rng.random() < faults.duplicate:
                        writer.write(frame)
                        self.stats.duplicated += 1
                    if doubled and faults.late and self.rng.random() < faults.late:
                        copy = asyncio.ensure_future(self._late(frame, target, faults.late_s))
                        self._pending.add(copy)
                        copy.add_done_callback(self._pending.discard)
                await writer.drain()

    async def _late(self, frame: bytes, target: tuple[str, int], after: float) -> None:
        """``frame`` again, ``after`` seconds on, on a new connection to the broker; its response read and dropped."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.sleep(after)
            reader, writer = await asyncio.open_connection(*target)
            try:
                writer.write(frame)
                await writer.drain()
                size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))[0]
                await asyncio.wait_for(reader.readexactly(size), 30)
                self.stats.late += 1
            finally:
                writer.transport.abort()
