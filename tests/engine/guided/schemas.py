"""Real-shaped JSON schemas for the guided-decoding tests: API payloads, configs, records.

Strings carry `maxLength` and arrays `maxItems`, as production schemas for LLM extraction do, so
a 135M model's outputs finish within the tests' token budget.
"""

from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SHORT = {"type": "string", "maxLength": 16}

SCHEMAS: dict[str, dict] = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    "person_optional_email": {
        "type": "object",
        "properties": {
            "name": NAME,
            "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": NAME,
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "temperature": {"type": "number", "minimum": -60, "maximum": 60},
        },
        "required": ["city", "unit", "temperature"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "exact_pair": {
        "type": "array",
        "items": {"type": "integer", "minimum": 1, "maximum": 9},
        "minItems": 2,
        "maxItems": 2,
    },
    "address": {
        "type": "object",
        "properties": {
            "street": NAME,
            "city": NAME,
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "country": {"type": "string", "enum": ["US", "FR", "DE", "CN"]},
        },
        "required": ["street", "city", "zip", "country"],
        "additionalProperties": False,
    },
    "nested_user": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 99999},
                    "profile": {
                        "type": "object",
                        "properties": {"display_name": NAME, "verified": {"type": "boolean"}},
                        "required": ["display_name", "verified"],
                        "additionalProperties": False,
                    },
                },
                "required": ["id", "profile"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
                    },
                    "required": ["sku", "quantity"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["order_id", "items"],
        "additionalProperties": False,
    },
    "contact_any_of": {
        "type": "object",
        "properties": {
            "contact": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}},
                        "required": ["phone"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.org$"}
                        },
                        "required": ["email"],
                        "additionalProperties": False,
                    },
                ]
            }
        },
        "required": ["contact"],
        "additionalProperties": False,
    },
    "id_any_of_types": {
        "type": "object",
        "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 1000}, SHORT]}},
        "required": ["id"],
        "additionalProperties": False,
    },
    "sentiment": {
        "type": "object",
        "properties": {
            "label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["label", "score"],
        "additionalProperties": False,
    },
    "boolean_flags": {
        "type": "object",
        "properties": {
            "enabled": {"type": "boolean"},
            "beta": {"type": "boolean"},
            "retries": {"type": "integer", "minimum": 0, "maximum": 5},
        },
        "required": ["enabled", "beta", "retries"],
        "additionalProperties": False,
    },
    "nullable_middle_name": {
        "type": "object",
        "properties": {"first": NAME, "middle": {"anyOf": [SHORT, {"type": "null"}]}, "last": NAME},
        "required": ["first", "middle", "last"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "title": NAME,
            "date": {"type": "string", "pattern": "^2[0-9]{3}-[01][0-9]-[0-3][0-9]$"},
            "attendees": {"type": "array", "items": NAME, "maxItems": 3},
        },
        "required": ["title", "date", "attendees"],
        "additionalProperties": False,
    },
    "matrix": {
        "type": "array",
        "minItems": 2,
        "maxItems": 2,
        "items": {
            "type": "array",
            "minItems": 2,
            "maxItems": 2,
            "items": {"type": "integer", "minimum": -9, "maximum": 9},
        },
    },
    "product": {
        "type": "object",
        "properties": {
            "name": NAME,
            "price": {"type": "number", "minimum": 0, "exclusiveMaximum": 10000},
            "currency": {"type": "string", "enum": ["USD", "EUR", "CNY"]},
            "in_stock": {"type": "boolean"},
        },
        "required": ["name", "price", "currency", "in_stock"],
        "additionalProperties": False,
    },
    "color_rgb": {
        "type": "object",
        "properties": {
            "r": {"type": "integer", "minimum": 0, "maximum": 255},
            "g": {"type": "integer", "minimum": 0, "maximum": 255},
            "b": {"type": "integer", "minimum": 0, "maximum": 255},
        },
        "required": ["r", "g", "b"],
        "additionalProperties": False,
    },
    "book_with_ref": {
        "type": "object",
        "$defs": {"author": {"type": "object", "properties": {"name": NAME}, "required": ["name"]}},
        "properties": {
            "title": NAME,
            "authors": {"type": "array", "items": {"$ref": "#/$defs/author"}, "minItems": 1, "maxItems": 2},
        },
        "required": ["title", "authors"],
        "additionalProperties": False,
    },
    "const_version": {
        "type": "object",
        "properties": {"version": {"const": "v1"}, "name": NAME},
        "required": ["version", "name"],
        "additionalProperties": False,
    },
    "http_request": {
        "type": "object",
        "properties": {
            "method": {"type": "string", "enum": ["GET", "POST", "PUT", "DELETE"]},
            "path": {"type": "string", "pattern": "^/[a-z]{1,12}(/[a-z]{1,12})?$"},
            "status": {"type": "integer", "minimum": 100, "maximum": 599},
        },
        "required": ["method", "path", "status"],
        "additionalProperties": False,
    },
    "recipe": {
        "type": "object",
        "properties": {
            "dish": NAME,
            "ingredients": {"type": "array", "items": SHORT, "minItems": 2, "maxItems": 4},
            "minutes": {"type": "integer", "minimum": 1, "maximum": 240},
        },
        "required": ["dish", "ingredients", "minutes"],
        "additionalProperties": False,
    },
    "coordinates": {
        "type": "object",
        "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180},
        },
        "required": ["lat", "lon"],
        "additionalProperties": False,
    },
    "priority_task": {
        "type": "object",
        "properties": {
            "task": NAME,
            "priority": {"type": "integer", "enum": [1, 2, 3]},
            "done": {"type": "boolean"},
        },
        "required": ["task", "priority"],
        "additionalProperties": False,
    },
    "key_value_list": {
        "type": "array",
        "maxItems": 3,
        "items": {
            "type": "object",
            "properties": {
                "key": SHORT,
                "value": {"anyOf": [SHORT, {"type": "integer", "minimum": 0, "maximum": 99}]},
            },
            "required": ["key", "value"],
            "additionalProperties": False,
        },
    },
    "employee": {
        "type": "object",
        "properties": {
            "name": NAME,
            "department": {"type": "string", "enum": ["engineering", "sales", "support"]},
            "manager": {
                "type": "object",
                "properties": {"name": NAME, "level": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["name"],
                "additionalProperties": False,
            },
            "skills": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 3},
        },
        "required": ["name", "department", "skills"],
        "additionalProperties": False,
    },
    "top_level_enum": {"type": "string", "enum": ["red", "green", "blue"]},
    "bounded_integer": {"type": "integer", "minimum": 10, "maximum": 20},
    "invoice": {
        "type": "object",
        "properties": {
            "number": {"type": "string", "pattern": "^INV[0-9]{3}$"},
            "lines": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "description": SHORT,
                        "amount": {"type": "number", "minimum": 0, "maximum": 999},
                    },
                    "required": ["description", "amount"],
                    "additionalProperties": False,
                },
            },
            "paid": {"type": "boolean"},
        },
        "required": ["number", "lines", "paid"],
        "additionalProperties": False,
    },
}
