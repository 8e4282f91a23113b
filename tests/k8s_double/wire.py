"""Records passed between the HTTP layer and the API handlers."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Request:
    """One request as received; iterates as ``(method, path, body)``."""
    method: str
    path: str
    body: Any
    query: dict = dataclasses.field(default_factory=dict)
    headers: dict = dataclasses.field(default_factory=dict)
    raw: bytes = dataclasses.field(default=b"", repr=False)

    def __iter__(self):
        return iter((self.method, self.path, self.body))


@dataclasses.dataclass
class Response:
    code: int
    body: Any                       # dict (JSON), str, or an iterator of bytes
    content_type: str = "application/json"
    headers: dict = dataclasses.field(default_factory=dict)


def is_true(value) -> bool:
    return str(value).lower() in ("true", "1")
