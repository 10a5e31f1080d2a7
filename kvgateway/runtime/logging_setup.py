"""Logging: one line per event worth knowing, as text or JSON, with secrets redacted."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any
from urllib.parse import quote, unquote_plus

from kvgateway.config.settings import Settings

_QUERY_PAIR = re.compile(r"([?&])([^=&\s\"'?]*)=([^&\s\"']*)")
_SECRET_NAMES = frozenset({"token", "access_token"})
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=%-]+")


def _redact_pair(match: re.Match[str]) -> str:
    # Judge the name as the server will (percent-decoded): ?%74oken= authenticates like ?token=.
    if unquote_plus(match[2]).strip().lower() in _SECRET_NAMES:
        return f"{match[1]}{match[2]}=[redacted]"
    return match[0]


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Remove tokens from a log text: query parameters, bearer headers and known secrets."""
    text = _QUERY_PAIR.sub(_redact_pair, text)
    text = _BEARER.sub(r"\1[redacted]", text)
    for secret in secrets:
        if secret:
            for form in {secret, quote(secret, safe=""), quote(secret)}:
                text = text.replace(form, "[redacted]")
    return text


class RedactingFilter(logging.Filter):
    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_RENAMED = {"uvicorn": "kvgateway.http", "uvicorn.error": "kvgateway.http", "uvicorn.access": "kvgateway.http.access"}
"""uvicorn's loggers under the gateway's names: one naming scheme for every line the process writes."""


class RenamingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.name = _RENAMED.get(record.name, record.name)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(entry, ensure_ascii=False)


def setup_for(settings: Settings) -> None:
    """A process's logging as its settings say (every command's, the supervisor's too): level,
    format, and the token redacted from every line."""
    setup(settings.log_level, settings.log_format, secrets=(settings.token,) if settings.token else ())


def setup(level: str = "info", fmt: str = "text", secrets: tuple[str, ...] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter(secrets))
    handler.addFilter(RenamingFilter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # uvicorn's start-up chatter ("Uvicorn running on ...", "Application startup complete") repeats
    # the gateway's own "serving on" line: shown at debug only. Its warnings and errors always show.
    logging.getLogger("uvicorn.error").setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)
