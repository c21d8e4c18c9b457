"""The methods: each a class of :mod:`.objects` (its options its fields) whose ``run`` is a function
``Call -> MethodResult``; :mod:`.registry` maps the names to the classes.

- :mod:`.call` — what a method receives and returns
- :mod:`.attention` — the attention-product family (transformer attribution, generic attention, rollout, …)
- :mod:`.lrp` — the LRP family (LRP, partial LRP, AttnLRP, CP-LRP, PA-LRP)
- :mod:`.perturbation` — token ablation
- :mod:`.baselines` — the Captum baselines (input × gradient, integrated gradients, SmoothGrad, occlusion,
  KernelSHAP)
- :mod:`.products` — the layer product ``Π (I + Ā_b)`` the attention family reads its maps from
- :mod:`.objects`, :mod:`.options` — the method classes, their base and the options every call shares
- :mod:`.registry`, :mod:`.targets` — name → class (the string shorthand), what ``target`` may be
- :mod:`.generation` — ``explain_generation``: one map per generated token
"""
