"""Tool parameter schemas in the JSON Schema dialect an endpoint accepts.

Tools describe their arguments in JSON Schema draft 2020-12 (``planner.tools``), and the
arguments are always validated locally against that full schema. What is *sent* in
``tools[].function.parameters`` can be narrowed for endpoints that refuse parts of it:

* ``json-schema`` (default): the schema as written.
* ``gemini``: only the keywords of the Schema object documented for Gemini function
  declarations (``GEMINI_KEYWORDS``, https://ai.google.dev/api/caching#Schema); others, such as
  ``additionalProperties`` or ``$schema``, which some Gemini-compatible proxies answer with
  400, are left out.

On top of either, an operator can name keywords to strip (``strip``). Keywords are removed
wherever a schema can appear (``properties`` values, ``items``, ``anyOf`` …), never from
property names or from values such as ``enum`` lists.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

__all__ = ["GEMINI_KEYWORDS", "SCHEMA_DIALECTS", "SchemaDialect", "adapt_schema"]

SchemaDialect = Literal["json-schema", "gemini"]
SCHEMA_DIALECTS: tuple[SchemaDialect, ...] = ("json-schema", "gemini")

GEMINI_KEYWORDS = frozenset(
    {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    }
)

_ONE_SCHEMA = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "additionalItems",
    }
)
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def adapt_schema(
    schema: Any, *, dialect: SchemaDialect = "json-schema", strip: Collection[str] = ()
) -> Any:
    """``schema`` as sent in ``dialect``, without the keywords in ``strip``; a new object.

    Raises:
        ValueError: ``dialect`` is not one of ``SCHEMA_DIALECTS``.
    """
    if dialect not in SCHEMA_DIALECTS:
        raise ValueError(f"unknown schema dialect {dialect!r}; use one of {SCHEMA_DIALECTS}")
    if not isinstance(schema, dict):
        return schema  # a boolean schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in strip or (dialect == "gemini" and key not in GEMINI_KEYWORDS):
            continue
        if key in _ONE_SCHEMA:
            if isinstance(value, list):  # draft-4 tuple form of "items"
                value = [adapt_schema(v, dialect=dialect, strip=strip) for v in value]
            else:
                value = adapt_schema(value, dialect=dialect, strip=strip)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            value = [adapt_schema(v, dialect=dialect, strip=strip) for v in value]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            value = {k: adapt_schema(v, dialect=dialect, strip=strip) for k, v in value.items()}
        out[key] = value
    return out
