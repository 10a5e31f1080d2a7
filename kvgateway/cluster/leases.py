"""Leases in a JetStream key-value bucket: one key per thing held, its value the owner and the time
the lease runs out. Taken and renewed with compare-and-set on the key's revision, so two processes
never both believe they hold it after a write; taken over once its holder let it run out.

nats-server 2.9 (Debian's) has no per-key TTL: the expiry is in the value and read against the
reader's clock, so the processes' clocks must agree to well within a lease (NTP does). 2.11's
per-message TTL would let the server expire it instead.
"""

from __future__ import annotations

import contextlib
import time

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue


class Lease(msgspec.Struct, frozen=True):
    owner: str
    until: float


class Leases:
    """The leases of one bucket, as ``owner`` sees and takes them."""

    def __init__(self, kv: KeyValue, owner: str, seconds: float) -> None:
        self._kv = kv
        self.owner = owner
        self.seconds = seconds

    async def hold(self, key: str, now: float | None = None) -> bool:
        """Take ``key`` (free or run out) or renew it (ours); False while another holds it."""
        now = time.time() if now is None else now
        mine = msgspec.json.encode(Lease(self.owner, now + self.seconds))
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            try:
                await self._kv.create(key, mine)
            except KeyWrongLastSequenceError:
                return False  # another process created it first
            return True
        held = _decode(entry.value)
        if held.owner != self.owner and held.until > now:
            return False
        try:
            await self._kv.update(key, mine, last=entry.revision)
        except KeyWrongLastSequenceError:
            return False  # another process took or renewed it in between
        return True

    async def release(self, key: str) -> None:
        """Give ``key`` up now, if it is ours (another process may take it at once)."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return
        if _decode(entry.value).owner == self.owner:
            with contextlib.suppress(KeyWrongLastSequenceError):
                await self._kv.update(key, msgspec.json.encode(Lease("", 0.0)), last=entry.revision)

    async def holders(self, now: float | None = None) -> dict[str, str]:
        """Every key whose lease runs, and its owner."""
        now = time.time() if now is None else now
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return {}
        out = {}
        for key in keys:
            try:
                held = _decode((await self._kv.get(key)).value)
            except KeyNotFoundError:
                continue
            if held.owner and held.until > now:
                out[key] = held.owner
        return out


def _decode(value: bytes | None) -> Lease:
    try:
        return msgspec.json.decode(value or b"", type=Lease)
    except msgspec.DecodeError:
        return Lease("", 0.0)  # unreadable: as if free
