"""Request bodies into the official client's models, strictly.

Every body goes through ``kubernetes.client.ApiClient().deserialize`` (the
same code that turns server replies into models), so a wrongly typed field is
rejected.  On top of that, unknown fields are found by walking the models'
``attribute_map``/``openapi_types``, as ``fieldValidation=Strict`` does on a
real server (a typo or a snake_case key in a hand-built dict is otherwise
dropped without a word).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from kubernetes import client

from .errors import bad_request

_CLIENT = client.ApiClient()
_QUANTITY = re.compile(
    r"^[+-]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {"": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6,
           "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Ki": 2**10,
           "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def decode(raw: bytes, model: str, kind: str, field_validation: str | None
           ) -> tuple[dict, list[str]]:
    """Parse ``raw`` as a ``model`` (e.g. ``V1Pod``) body.

    Returns the JSON dict and the warnings to send (``fieldValidation=Warn``).
    Raises a 400 ``ApiError`` the way the real decoder does.
    """
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise bad_request(f"couldn't get version/kind; json parse error: {exc}")
    if not isinstance(data, dict):
        raise bad_request(f'{kind} in version "v1" cannot be handled as a {kind}: '
                          f"json: cannot unmarshal {type(data).__name__} "
                          "into Go value of type struct")
    if data.get("kind") not in (None, "", kind):
        raise bad_request(f'{kind} in version "v1" cannot be handled as a {kind}: '
                          f'kind {data["kind"]!r} does not match')
    if data.get("apiVersion") not in (None, "", "v1"):
        raise bad_request(f'the API version in the data ({data["apiVersion"]}) '
                          f'does not match the expected API version (v1)')
    try:
        _CLIENT.deserialize(json.dumps(data), model, "application/json")
    except Exception as exc:  # pydantic.ValidationError and friends
        first = str(exc).splitlines()
        raise bad_request(f'{kind} in version "v1" cannot be handled as a {kind}: '
                          + " ".join(line.strip() for line in first[:3]))
    _check_quantities(data, kind)
    unknown = unknown_fields(data, model)
    mode = (field_validation or "Strict")
    if mode not in ("Strict", "Warn", "Ignore"):
        raise bad_request(f"fieldValidation {mode!r} is invalid")
    if unknown and mode == "Strict":
        raise bad_request("strict decoding error: "
                          + ", ".join(f'unknown field "{u}"' for u in unknown))
    warnings = [f'unknown field "{u}"' for u in unknown] if mode == "Warn" else []
    return data, warnings


@lru_cache(maxsize=None)
def _fields(model: str) -> dict[str, str]:
    cls = getattr(client.models, model)
    return {cls.attribute_map[k]: t for k, t in cls.openapi_types.items()}


def unknown_fields(data, type_name: str, path: str = "") -> list[str]:
    """Dotted paths of keys in ``data`` that ``type_name`` does not declare."""
    if data is None:
        return []
    inner = re.match(r"^(List|Dict)\[(?:str, )?(.*)\]$", type_name)
    if inner:
        items = (enumerate(data) if isinstance(data, list) else data.items()
                 if isinstance(data, dict) else ())
        return [u for k, v in items
                for u in unknown_fields(v, inner.group(2), f"{path}[{k}]")]
    if not hasattr(client.models, type_name) or not isinstance(data, dict):
        return []
    fields = _fields(type_name)
    found = []
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        if key not in fields:
            found.append(sub)
        else:
            found += unknown_fields(value, fields[key], sub)
    return found


def quantity(text: str) -> float:
    """The numeric value of a resource quantity such as ``500m`` or ``8Gi``."""
    m = _QUANTITY.match(str(text))
    if not m:
        raise ValueError(text)
    suffix = m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return float(m.group(0))
    return float(m.group(0)[:len(m.group(0)) - len(suffix)]) * _SUFFIX[suffix]


def _check_quantities(data: dict, kind: str) -> None:
    for c in (data.get("spec") or {}).get("containers") or []:
        for section in ("limits", "requests"):
            for value in ((c.get("resources") or {}).get(section) or {}).values():
                try:
                    quantity(value)
                except ValueError:
                    raise bad_request(
                        f'{kind} in version "v1" cannot be handled as a {kind}: '
                        "quantities must match the regular expression "
                        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
