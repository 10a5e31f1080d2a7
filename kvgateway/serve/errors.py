"""The one shape of every error answer under /v1/: ``{"error": "<one line>"}`` with its status."""

from __future__ import annotations

from starlette.responses import JSONResponse


def json_error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)
