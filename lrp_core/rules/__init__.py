"""The rules and the rule sets.

- :mod:`.functional` — every rule as a plain-tensor function (the course calls them directly)
- :mod:`.ops` — the operation kinds of a pass and the two rule contracts (explicit, modified-gradient)
- :mod:`.explicit`, :mod:`.gradient` — the rule objects of each kind of pass
- :mod:`.composites` — the rule sets: the one place a rule is chosen for an operation
"""
