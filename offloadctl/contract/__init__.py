"""The plan document: the JSON contract between stages.

`document` reads, writes and validates plans against ``schemas/plan.schema.json`` on every read
and write (`columns` checks their long lists, column by column); `check` decides whether a plan
describes a given model (apply and simulate share it); `order_pins` says where the order pins of a
plan's copies go and why none makes a cycle. The plan's types live below every stage that reads
them, in `offloadctl.core.plantypes`.
"""
