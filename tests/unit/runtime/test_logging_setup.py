"""kvgateway.runtime.logging_setup: tokens never reach a log line (query parameters, even
percent-encoded names, bearer headers, the configured secret in its encoded forms), uvicorn's loggers
take the gateway's names, and the JSON format's fields."""

from __future__ import annotations

import json
import logging

import pytest

from kvgateway.runtime.logging_setup import JsonFormatter, RedactingFilter, RenamingFilter, redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET /v1/events?token=s3cret&source=a", "GET /v1/events?token=[redacted]&source=a"),
        ("GET /v1/events?source=a&access_token=s3cret", "GET /v1/events?source=a&access_token=[redacted]"),
        ("GET /v1/events?%74oken=s3cret", "GET /v1/events?%74oken=[redacted]"),
        ("GET /v1/events?TOKEN=s3cret", "GET /v1/events?TOKEN=[redacted]"),
        ("Authorization: Bearer abc.def-123", "Authorization: Bearer [redacted]"),
        ("GET /v1/events?tokens=kept&source=a", "GET /v1/events?tokens=kept&source=a"),
    ],
)
def test_query_tokens_and_bearer_headers_are_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_the_configured_secret_is_redacted_as_written_and_percent_encoded() -> None:
    secret = "tk/with space"
    line = f"bad client sent {secret} or tk%2Fwith%20space or tk/with%20space"
    assert redact(line, (secret,)) == "bad client sent [redacted] or [redacted] or [redacted]"
    assert redact("nothing to hide", ("",)) == "nothing to hide"


def record(name: str, message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, args, None)


def test_the_filters_clean_the_record_and_rename_uvicorns_loggers() -> None:
    rec = record("uvicorn.access", "%s GET /?token=%s", "1.2.3.4", "s3cret")
    assert RedactingFilter(("s3cret",)).filter(rec) and RenamingFilter().filter(rec)
    assert (rec.getMessage(), rec.name) == ("1.2.3.4 GET /?token=[redacted]", "kvgateway.http.access")
    own = record("kvgateway.ingest", "stream up")
    assert RenamingFilter().filter(own) and own.name == "kvgateway.ingest"


def test_a_json_line_has_its_fields_and_an_errors_last_line() -> None:
    try:
        raise ValueError("bad frame")
    except ValueError as exc:
        rec = logging.LogRecord(
            "kvgateway.ingest", logging.ERROR, __file__, 1, "stream %s", ("a/0",), (type(exc), exc, None)
        )
    entry = json.loads(JsonFormatter().format(rec))
    assert list(entry) == ["ts", "time", "level", "logger", "message", "error"]
    assert (entry["level"], entry["logger"], entry["message"]) == ("error", "kvgateway.ingest", "stream a/0")
    assert entry["error"] == "ValueError: bad frame" and entry["time"].endswith("Z")
