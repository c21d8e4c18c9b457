"""Solutions for notebook 10 (explore)."""


def ex10_1():
    qs = ["Does the method depend on the target class (notebook 6)?",
          "Which block carries the evidence (block slider, notebook 5)?",
          "Do heads disagree in sign (head slider, notebook 4)?"]
    for q in qs:
        print("-", q)
    return qs
