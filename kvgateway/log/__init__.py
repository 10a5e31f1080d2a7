"""The ordered log, the seam between the two halves: its records, the messages clients get, the resume ring."""
