"""How an edge knows an ingest process is alive: its status records, sent on a beat."""

from __future__ import annotations

HEARTBEAT_SECONDS = 5.0
"""An ingest process reports every stream it reads this often, changed or not (a ``status`` record):
a late edge learns each stream's status within this time, and every edge that the ingest is alive."""

INGEST_SILENCE_SECONDS = 15.0
"""An edge that has heard no status of a stream for this long shows it down, reason ``ingest
unreachable`` (three heartbeats missed: the ingest process reading it is gone or cut off)."""
