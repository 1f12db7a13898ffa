"""The plan document: the JSON contract between stages.

`document` reads, writes and validates plans against ``schemas/plan.schema.json`` on every read
and write; `types` is the same document as typed dicts with the constructors of its entries;
`check` decides whether a plan describes a given model (apply and simulate share it).
"""
