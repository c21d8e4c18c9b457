"""Command-line tools: ``python -m lrp_core.tools.bench`` (time and memory) and ``python -m lrp_core.tools.doctor``."""
