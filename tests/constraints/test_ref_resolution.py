"""``$ref`` resolution as the 2020-12 spec says (issue 23): against the base URI of the nearest ``$id``
(through ``referencing``, as the validator resolves it), not always against the document root. Schemas
from the official JSON-Schema-Test-Suite (ref.json, dynamicRef.json, anchor.json), inlined."""
from __future__ import annotations

import json

import pytest

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.errors import SchemaError, UnsupportedKeywordError

S2020 = "https://json-schema.org/draft/2020-12/schema"
_INNER = {"$defs": {"inner": {"properties": {"bar": {"type": "string"}}}}, "$ref": "#/$defs/inner"}

CASES = [
    # "refs with relative uris and defs": #/$defs/inner is in the resource schema-relative-uri-defs2.json
    ({"$schema": S2020, "$id": "http://example.com/schema-relative-uri-defs1.json",
      "properties": {"foo": {"$id": "schema-relative-uri-defs2.json", **_INNER}},
      "$ref": "schema-relative-uri-defs2.json"},
     [({"foo": {"bar": "a"}, "bar": "a"}, True), ({"foo": {"bar": 1}, "bar": "a"}, False),
      ({"foo": {"bar": "a"}, "bar": 1}, False)]),
    # "URN ref with nested pointer ref"
    ({"$schema": S2020, "$ref": "urn:uuid:deadbeef-4321-ffff-ffff-1234feebdaed",
      "$defs": {"foo": {"$id": "urn:uuid:deadbeef-4321-ffff-ffff-1234feebdaed", "$defs": {"bar": {"type": "string"}},
                        "$ref": "#/$defs/bar"}}},
     [("bar", True), (12, False)]),
    # "$id must be resolved against nearest parent, not just immediate parent"
    ({"$schema": S2020, "$id": "http://example.com/a.json",
      "$defs": {"x": {"$id": "http://example.com/b/c.json",
                      "not": {"$defs": {"y": {"$id": "d.json", "type": "number"}}}}},
      "allOf": [{"$ref": "http://example.com/b/d.json"}]},
     [(1, True), ("a", False)]),
    # "Location-independent identifier with base URI change in subschema" (anchor.json)
    ({"$schema": S2020, "$id": "http://localhost:1234/draft2020-12/root",
      "$ref": "http://localhost:1234/draft2020-12/nested.json#foo",
      "$defs": {"A": {"$id": "nested.json", "$defs": {"B": {"$anchor": "foo", "type": "integer"}}}}},
     [(1, True), ("a", False)]),
    # "A $dynamicRef without anchor in fragment behaves identical to $ref": resolved in the "list" resource
    ({"$schema": S2020, "$id": "https://test.json-schema.org/dynamicRef-without-anchor/root", "$ref": "list",
      "$defs": {"foo": {"$dynamicAnchor": "items", "type": "string"},
                "list": {"$id": "list", "type": "array", "items": {"$dynamicRef": "#/$defs/items"},
                         "$defs": {"items": {"$dynamicAnchor": "items", "type": "number"}}}}},
     [([4, 5.5], True), (["foo", "bar"], False)]),
    # draft-04 "id": "#name" is a plain-name anchor (JSONSchemaBench Github_easy/o35906 shape)
    ({"$schema": "http://json-schema.org/draft-04/schema#",
      "definitions": {"sid": {"id": "#sid", "type": "integer"}}, "type": "array", "items": {"$ref": "#sid"}},
     [([1, 2], True), (["x"], False)]),
]


@pytest.mark.parametrize("schema, instances", CASES)
def test_refs_resolve_against_the_nearest_id(hf_tok, schema, instances):
    c = compile_constraint(schema, hf_tok, use_cache=False)  # was "dangling $ref" / "remote $ref"
    for value, ok in instances:
        assert c.matches(json.dumps(value, separators=(",", ":"))) is ok, value


def test_remote_and_dangling_refs_still_refused(hf_tok):
    with pytest.raises(UnsupportedKeywordError, match="remote"):
        compile_constraint({"$id": "http://example.com/root.json", "$ref": "other.json"}, hf_tok, use_cache=False)
    with pytest.raises(UnsupportedKeywordError, match="remote"):   # relative to the sub-resource: b/other.json
        compile_constraint({"$id": "http://example.com/root.json",
                            "$defs": {"a": {"$id": "b/x.json", "$ref": "y.json"}}, "$ref": "b/x.json"},
                           hf_tok, use_cache=False)
    with pytest.raises(SchemaError, match="dangling"):   # #/$defs/inner is not in the sub-resource
        compile_constraint({"$id": "http://example.com/r.json", "$defs": {"inner": {"type": "string"}},
                            "properties": {"foo": {"$id": "s.json", "$ref": "#/$defs/inner"}}}, hf_tok, use_cache=False)
    with pytest.raises(SchemaError, match="dangling"):
        compile_constraint({"properties": {"a": {"$ref": "#/$defs/nope"}}}, hf_tok, use_cache=False)


def test_id_with_empty_fragment_and_bad_uris(hf_tok):
    # draft-04 "id" ending in "#" (swagger-2.0's schema): "#/definitions/x" still resolves in the document
    c = compile_constraint({"$schema": "http://json-schema.org/draft-04/schema#",
                            "id": "http://swagger.io/v2/schema.json#",
                            "definitions": {"x": {"type": "integer"}},
                            "properties": {"a": {"patternProperties": {"^x-": {"$ref": "#/definitions/x"}}}}},
                           hf_tok, use_cache=False)
    assert c.matches('{"a":{"x-1":1}}') and not c.matches('{"a":{"x-1":"s"}}')
    for schema in ({"properties": {"a": {"$id": "http://[bad", "$ref": "#/$defs/a"}}},
                   {"properties": {"a": {"$id": "x.json", "$ref": "http://[bad"}}}):
        with pytest.raises(SchemaError, match=r"invalid \$(id|ref)"):   # typed, not a bare ValueError
            compile_constraint(schema, hf_tok, use_cache=False)
