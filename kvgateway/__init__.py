"""kvgateway: an observable gateway from LLM engines' KV-cache events to web clients."""

__version__ = "0.1.0"
