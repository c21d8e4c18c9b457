"""Is the Hugging Face hub reachable? A fast check before any download, and the address downloads go to.

Offline mode (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) counts as unreachable without touching the network;
otherwise one HEAD request, through the environment's proxy as a download would go, bounded by a timeout.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from urllib.parse import urlparse

__all__ = ["hub_endpoint", "hub_reachable"]


_TRUE = ("1", "true", "yes", "on")
_DEFAULT_ENDPOINT = "https://huggingface.co"


def _offline_flag() -> bool:
    """Whether offline mode is on: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` now, or when huggingface_hub
    was imported (it reads the flag once, at import)."""
    if any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:  # huggingface_hub missing or broken: the environment decides
        return False


def hub_endpoint() -> str:
    """The hub address downloads go to: huggingface_hub's ``ENDPOINT``, i.e. ``HF_ENDPOINT`` as it was when
    huggingface_hub was first imported (later changes of the variable do not redirect its downloads)."""
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT)
    except Exception:
        return os.environ.get("HF_ENDPOINT", _DEFAULT_ENDPOINT).rstrip("/")


#: statuses a proxy (or a hub that is down) answers with: the hub itself did not serve the request
_NOT_THE_HUB = (403, 407, 502, 503, 504)


def _hub_answers(endpoint: str, timeout: float) -> bool:
    """Whether a HEAD request for the endpoint's home page gets an HTTP answer from the hub. It travels as a
    download does: through the proxy ``HTTPS_PROXY`` / ``HTTP_PROXY`` name unless ``NO_PROXY`` exempts the
    host, so a proxy that refuses the hub (403, a failed tunnel) means unreachable."""
    try:
        if not urlparse(endpoint).hostname:
            return False
        request = urllib.request.Request(
            endpoint.rstrip("/") + "/", method="HEAD", headers={"User-Agent": "lrp_core.hub_reachable"}
        )
        # a fresh opener: urlopen's shared one keeps the proxies of its first use
        opener = urllib.request.build_opener(urllib.request.ProxyHandler())
        with opener.open(request, timeout=timeout):
            return True
    except urllib.error.HTTPError as err:  # an HTTP answer: the hub's own, unless a proxy's refusal
        err.close()
        return err.code not in _NOT_THE_HUB
    except Exception:  # refused, timed out, name unknown, tunnel refused, TLS failed, malformed URL
        return False


def hub_reachable(timeout: float = 1.5) -> bool:
    """Whether the Hugging Face hub (``HF_ENDPOINT``, default huggingface.co) answers an HTTP request.

    Offline mode (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``) counts as unreachable without any
    network access. The request takes the path downloads take (:func:`hub_endpoint`, via the environment's
    proxy).

    Parameters
    ----------
    timeout : float, optional
        Upper bound, in seconds, on the whole check, name lookup included (about).

    Returns
    -------
    bool
        ``True`` when the hub answered. The check never raises: a malformed endpoint, a failed lookup, a
        refused connection or a proxy's refusal all give ``False``.
    """
    try:
        if _offline_flag():
            return False
        endpoint = hub_endpoint()
    except Exception:
        return False
    answered: list[bool] = []
    # a daemon thread, because the name lookup inside urlopen ignores the timeout
    probe = threading.Thread(
        target=lambda: answered.append(_hub_answers(endpoint, timeout)), name="hub_reachable", daemon=True
    )
    probe.start()
    probe.join(timeout)
    return bool(answered) and answered[0]
