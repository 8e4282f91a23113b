"""Kubernetes ``Status`` error bodies, as the real API server writes them."""

from __future__ import annotations

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "AlreadyExists",
    410: "Expired",
    422: "Invalid",
}


class ApiError(Exception):
    """An error the handler turns into a ``Status`` response with ``code``."""

    def __init__(self, code: int, message: str, reason: str | None = None,
                 details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "InternalError")
        self.details = details

    def status(self) -> dict:
        """The ``v1.Status`` body."""
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": self.message,
                "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, f'{resource} "{name}" not found',
                    details={"name": name, "kind": resource})


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(409, f'{resource} "{name}" already exists',
                    details={"name": name, "kind": resource})


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def forbidden(user: str, verb: str, resource: str, namespace: str,
              name: str | None = None) -> ApiError:
    """403 worded like the RBAC authorizer's denial."""
    base = resource.split("/")[0]
    subject = f'{base} "{name}"' if name else base
    message = (f'{subject} is forbidden: User "{user}" cannot {verb} resource '
               f'"{resource}" in API group "" in the namespace "{namespace}"')
    details = {"kind": base}
    if name:
        details["name"] = name
    return ApiError(403, message, details=details)


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 from field errors ``(field, reason, message)``.

    ``reason`` is a ``CauseType`` such as ``FieldValueRequired``; ``message``
    is the text after the field, e.g. ``Required value``.
    """
    texts = [f"{field}: {msg}" for field, _, msg in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return ApiError(
        422, f'{kind} "{name}" is invalid: {joined}',
        details={"name": name, "kind": kind,
                 "causes": [{"reason": r, "message": m, "field": f}
                            for f, r, m in causes]})
