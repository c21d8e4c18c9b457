"""The methods: each a function ``Call -> MethodResult``, declared in :mod:`.registry`.

- :mod:`.call` — what a method receives and returns
- :mod:`.attention` — the attention-product family (transformer attribution, generic attention, rollout, …)
- :mod:`.lrp` — the LRP family (LRP, partial LRP, AttnLRP, CP-LRP, PA-LRP)
- :mod:`.perturbation` — token ablation
- :mod:`.baselines` — the Captum baselines (input × gradient, integrated gradients, SmoothGrad, occlusion,
  KernelSHAP)
- :mod:`.products` — the layer product ``Π (I + Ā_b)`` the attention family reads its maps from
- :mod:`.registry`, :mod:`.options`, :mod:`.targets` — the method table, the options, what ``target`` may be
- :mod:`.generation` — ``explain_generation``: one map per generated token
"""
