"""Input checks that run before any work proportional to the input: JSON-schema cost budgets,
meta-schema validation, ``$ref`` cycles, nesting depth, and strings the tokenizer cannot take.

A response-format or tool schema is small on the wire but may ask for a huge canvas
(``minLength: 100000000``), fan out through ``$ref``/``anyOf`` into thousands of alternatives, or
list tens of thousands of enum values; compiling or decoding it would freeze the server. ``check_schema``
measures it first — iteratively, stopping as soon as a budget is exceeded, so its own cost is
bounded by the budgets — and answers 400 naming the limit. Every check here raises ``APIError(400)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.validators import validator_for

from ...sampling.structured.grammar import Machine
from ..protocol.errors import bad_request

MAX_JSON_DEPTH = 64  # nesting of any JSON a request carries (schemas, tool-call arguments)


@dataclass(frozen=True)
class SchemaLimits:
    """What one schema may cost (after ``$ref`` inlining); each is named in the 400 it causes."""

    max_depth: int = 8  # nested subschemas (the compiler's own bound)
    max_nodes: int = 1024  # subschemas after $ref inlining
    max_alternatives: int = 128  # anyOf/oneOf branches and type-list entries after inlining
    max_enum_values: int = 256  # values of one enum
    max_enum_bytes: int = 16384  # JSON bytes of every enum and const value after inlining
    max_states: int = 4096  # start states of one value slot's automaton


@dataclass
class SchemaCost:
    nodes: int = 0
    alternatives: int = 0
    enum_bytes: int = 0
    canvas: int = 0  # the canvas positions the compiled layout reserves at least


def _children(node: object) -> Iterator[object]:
    if isinstance(node, dict):
        yield from node.values()
    elif isinstance(node, list):
        yield from node


def check_depth(obj: object, param: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Iteratively bound how deep ``obj`` nests (a recursive walk could overflow the stack)."""
    stack = [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if d > limit:
            raise bad_request(f"{param} nests deeper than {limit} levels", param)
        stack.extend((c, d + 1) for c in _children(node) if isinstance(c, dict | list))


def parse_json_bounded(text: str, param: str, limit: int = MAX_JSON_DEPTH) -> object:
    """``json.loads`` whose nesting is bounded (a 5,000-deep document is a 400, not a RecursionError)."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise bad_request(f"{param} nests deeper than {limit} levels", param) from None
    check_depth(obj, param, limit)
    return obj


def _surrogate_path(obj: object, path: str) -> str | None:
    stack = [(obj, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(node, dict):
            for k, v in node.items():
                stack.append((k, where))
                stack.append((v, f"{where}.{k}" if where else str(k)))
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
    return None


def check_strings(obj: object, path: str = "") -> None:
    """Every string must be encodable as UTF-8: JSON's ``\\ud800`` escapes can smuggle in lone UTF-16
    surrogates, which no tokenizer takes."""
    where = _surrogate_path(obj, path)
    if where is not None:
        raise bad_request(
            f"{where or 'the request'} contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
            "escape); send valid Unicode",
            where or None,
        )


def meta_validate(schema: object, param: str) -> None:
    """The schema itself must be a valid JSON Schema (the keywords' own types: ``minLength: "x"``,
    ``enum: 5`` or ``properties: [1]`` are 400s here, not crashes in the compiler)."""
    if not isinstance(schema, dict | bool):
        raise bad_request(f"{param} must be a JSON Schema object", param)
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    err = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path)
        raise bad_request(
            f"{param} is not a valid JSON Schema{f' at {where}' if where else ''}: "
            f"{err.message[:200]}",
            param,
        )


def _resolve_ref(root: object, ref: object) -> object:
    parts = ref.split("/") if isinstance(ref, str) else []
    if len(parts) != 3 or parts[0] != "#" or not isinstance(root, dict):
        return None  # not a local $defs ref: the compiler refuses it with its own message
    defs = root.get(parts[1])
    return defs.get(parts[2]) if isinstance(defs, dict) else None


class _Meter:
    """One walk over the schema with ``$ref`` inlined; raises as soon as a budget is exceeded."""

    def __init__(self, root: object, limits: SchemaLimits, max_canvas: int, param: str) -> None:
        self.root, self.lim, self.max_canvas, self.param = root, limits, max_canvas, param
        self.cost = SchemaCost()

    def over(self, what: str, value: int, limit: int, flag: str) -> None:
        if value > limit:
            raise bad_request(
                f"{self.param}: {what} ({value}) exceeds this server's limit of {limit} ({flag})",
                self.param,
                "schema_too_complex",
            )

    def walk(self, node: object, depth: int, refs: tuple[str, ...]) -> int:
        """The canvas positions ``node`` reserves at least (saturating just above the limit)."""
        c, lim = self.cost, self.lim
        c.nodes += 1
        self.over("subschemas after $ref expansion", c.nodes, lim.max_nodes, "max_nodes")
        self.over("nesting depth", depth, lim.max_depth, "max_depth")
        if not isinstance(node, dict):
            return 1
        ref = node.get("$ref")
        if ref is not None:
            if ref in refs:
                cycle = " -> ".join((*refs[refs.index(ref) :], ref))
                raise bad_request(
                    f"{self.param}: $ref cycle {cycle} (recursive schemas are not supported)",
                    self.param,
                )
            target = _resolve_ref(self.root, ref)
            return 1 if target is None else self.walk(target, depth, (*refs, ref))
        for key in ("enum", "const"):
            if key in node:
                values = node[key] if key == "enum" else [node[key]]
                if key == "enum":
                    self.over("enum values", len(values), lim.max_enum_values, "max_enum_values")
                c.enum_bytes += sum(len(json.dumps(v, ensure_ascii=False)) for v in values)
                self.over("enum/const bytes", c.enum_bytes, lim.max_enum_bytes, "max_enum_bytes")
                return 1
        alts = node.get("anyOf") or node.get("oneOf")
        types = node.get("type")
        types = types if isinstance(types, list) else []
        if isinstance(alts, list) or len(types) > 1:
            branches = alts if isinstance(alts, list) else [{**node, "type": t} for t in types]
            c.alternatives += len(branches)
            self.over(
                "alternatives after anyOf/oneOf/$ref expansion",
                c.alternatives,
                lim.max_alternatives,
                "max_alternatives",
            )
            return max(self.walk(b, depth + 1, refs) for b in branches)
        return self._shape(node, depth, refs)

    def _shape(self, node: dict[str, Any], depth: int, refs: tuple[str, ...]) -> int:
        cap = self.max_canvas + 1
        t = node.get("type")
        t = t[0] if isinstance(t, list) and t else t
        props = node.get("properties")
        if isinstance(props, dict) and props:
            total = 2
            for v in props.values():
                total = min(cap, total + 4 + self.walk(v, depth + 1, refs))
            return total
        if "items" in node or t == "array":
            item = self.walk(node.get("items", {}), depth + 1, refs)
            n = node.get("maxItems", node.get("minItems", 0))
            return min(cap, 2 + int(n) * (item + 1))
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            self.walk(extra, depth + 1, refs)
        if t == "string" or "minLength" in node:
            return min(cap, int(node.get("minLength", 0)) + 2)
        return 1


def check_schema(
    schema: object,
    param: str,
    max_canvas: int,
    canvas_param: str | None = None,
    limits: SchemaLimits | None = None,
) -> SchemaCost:
    """Validate ``schema`` and measure it against ``limits`` and a canvas of at most ``max_canvas``
    positions (the field that sets it: ``canvas_param``), before anything is compiled or allocated
    (raises a 400 ``APIError``)."""
    check_depth(schema, param)
    check_strings(schema, param)
    meta_validate(schema, param)
    meter = _Meter(schema, limits or SchemaLimits(), max_canvas, param)
    canvas = meter.walk(schema, 0, ())
    if canvas > max_canvas:
        raise bad_request(
            f"{param}: the structured output needs a canvas of at least {canvas} tokens; at most "
            f"{max_canvas} fit (lower minLength/minItems/maxItems, or leave more of the context)",
            canvas_param or param,
            "context_length_exceeded",
        )
    meter.cost.canvas = canvas
    return meter.cost


def check_states(machines: list[Machine], param: str, limits: SchemaLimits | None = None) -> None:
    """After compiling: each value slot's automaton must start in a bounded number of states (the
    engine thread walks every one of them at every step)."""
    lim = (limits or SchemaLimits()).max_states
    for m in machines:
        n = len(m.starts())
        if n > lim:
            raise bad_request(
                f"{param}: a value's automaton has {n} start states; this server's limit is {lim} "
                "(max_states)",
                param,
                "schema_too_complex",
            )
