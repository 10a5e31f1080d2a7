"""The engines' side: the wire format, endpoints, medium names, per-stream ordering and the
ZeroMQ sockets. Imports nothing else of the package."""
