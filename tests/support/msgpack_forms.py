"""msgpack written byte by byte, for the compiled parser's differential tests: an int in every
sized format that holds it, an array's header in each of its forms, and block hashes written as
engines write them (uint 64, int 64, bin 8)."""

from __future__ import annotations

import struct
from typing import Any

INT_FORMATS = (  # (first byte, struct format, lowest, highest)
    (0xCC, ">B", 0, 2**8 - 1),
    (0xCD, ">H", 0, 2**16 - 1),
    (0xCE, ">I", 0, 2**32 - 1),
    (0xCF, ">Q", 0, 2**64 - 1),
    (0xD0, ">b", -(2**7), 2**7 - 1),
    (0xD1, ">h", -(2**15), 2**15 - 1),
    (0xD2, ">i", -(2**31), 2**31 - 1),
    (0xD3, ">q", -(2**63), 2**63 - 1),
)


def int_forms(value: int) -> list[bytes]:
    """``value`` in each sized int format that can hold it (the fixints left to the caller)."""
    return [bytes([first]) + struct.pack(fmt, value) for first, fmt, low, high in INT_FORMATS if low <= value <= high]


def array_head(count: int, form: str = "fix") -> bytes:
    """An array's header: ``fix`` where ``count`` fits one (else as ``16``), ``16`` where it fits
    that (else as ``32``), ``32``."""
    if form == "fix" and count <= 15:
        return bytes([0x90 | count])
    if form in ("fix", "16") and count <= 0xFFFF:
        return b"\xdc" + struct.pack(">H", count)
    return b"\xdd" + struct.pack(">I", count)


def wide_array(hashes: list[Any]) -> bytes | None:
    """``hashes`` as a msgpack array the way engines send them (every int as a uint 64 or an int
    64, bytes as a bin 8), or None where one cannot be written so (a wider int, longer bytes, more
    than 65,535 of them)."""
    if len(hashes) > 0xFFFF:
        return None
    out = [array_head(len(hashes))]
    for h in hashes:
        if type(h) is int and 0 <= h < 2**64:
            out.append(b"\xcf" + struct.pack(">Q", h))
        elif type(h) is int and -(2**63) <= h < 0:
            out.append(b"\xd3" + struct.pack(">q", h))
        elif type(h) is bytes and len(h) <= 0xFF:
            out.append(b"\xc4" + bytes([len(h)]) + h)
        else:
            return None
    return b"".join(out)
