"""The normative AMP/ampkit specification: JSON Schema, OpenAPI, conformance vectors and runner."""
