"""kvgateway.serve.errors: every /v1/ error answer is ``{"error": "<one line>"}`` with its status."""

from __future__ import annotations

import json

from kvgateway.serve.errors import json_error


def test_the_error_body_status_and_headers() -> None:
    response = json_error(429, "too many lookups", **{"Retry-After": "1"})
    assert response.status_code == 429
    assert json.loads(response.body) == {"error": "too many lookups"}
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    plain = json_error(400, "source: unknown 'x'")
    assert "retry-after" not in plain.headers and json.loads(plain.body) == {"error": "source: unknown 'x'"}
