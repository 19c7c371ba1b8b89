"""The one codec for method parameters as rows store them (`params`, `effective_params`): a JSON
object of string values, keys sorted. Every reader decodes through here, so a damaged value is
one error, said one way."""

from __future__ import annotations

import json
from collections.abc import Mapping


class BadParams(ValueError):
    """Stored params that are not a JSON object."""


def encode_params(params: Mapping[str, object]) -> str:
    return json.dumps({str(k): str(v) for k, v in params.items()}, sort_keys=True)


def decode_params(value: object) -> dict[str, str]:
    """A stored params value (JSON text, a mapping, or empty/None for none) as a dict."""
    if value is None or value == "" or (isinstance(value, float) and value != value):
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        try:
            loaded = json.loads(value)
        except ValueError:
            raise BadParams(f"params {value[:60]!r} are not JSON") from None
        if isinstance(loaded, dict):
            return {str(k): str(v) for k, v in loaded.items()}
    raise BadParams(f"params {str(value)[:60]!r} are not a JSON object")


def decode_params_or_none(value: object) -> dict[str, str]:
    """A stored params value as a dict; a damaged one as none (the row's case id still says what
    it was): for readers that show or fit rows rather than judge them."""
    try:
        return decode_params(value)
    except BadParams:
        return {}
