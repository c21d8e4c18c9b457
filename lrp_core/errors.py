"""Errors raised by lrp_core, each naming what was wrong and what is accepted.

An :class:`InputError` is about the caller's input, so a public call raises it from its own frame: the
traceback a learner reads ends at the line they wrote and the message, not in the library's internals
(:func:`raised_at_the_call`). ``LRP_FULL_TRACEBACK=1`` keeps the whole traceback, for debugging the library.
"""

import functools
import os
from typing import Any, Callable, TypeVar


class LRPError(ValueError):
    """Base class of the library's input errors."""


class UnsupportedModelError(LRPError, TypeError):
    """The model is not one of the architectures the engine can explain."""


class UnknownNameError(LRPError, KeyError):
    """A name (a method, an image, an operation kind) that is not among those on offer."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownMethodError(UnknownNameError):
    """The method name is not in :data:`lrp_core.METHODS`."""


class InputError(LRPError):
    """The inputs (images, text, target, options) are not acceptable."""


class RuleSetError(LRPError, TypeError):
    """A rule set (composite) that cannot serve the pass it was handed to, or is built inconsistently: rules of
    both kinds of pass mixed, a rule of neither kind, a pass of the other kind (docs/ARCHITECTURE.md, Rules)."""


class InputTypeError(InputError, TypeError):
    """An input of a type the call does not take (a ``TypeError`` too, for callers that catch that)."""


class MissingFileError(LRPError, FileNotFoundError):
    """A file the library needs (weights, a data file) is not where it should be; the message says how to make it."""


class LRPWarning(UserWarning):
    """Base class of the library's warnings: the call ran, but something about it deserves a word."""


class UnreflectedHookWarning(LRPWarning):
    """The model carries forward hooks on modules the replay does not run, so the explained function is not
    the hooked model's. ``warnings.simplefilter("error", UnreflectedHookWarning)`` makes it an error."""


class MissingExtraError(LRPError, ImportError):
    """An optional dependency that a feature needs is not installed; the message names the ``pip install`` of the
    package extra that brings it (an ``ImportError`` too, for callers that catch that)."""


F = TypeVar("F", bound=Callable[..., Any])


def raised_at_the_call(fn: F) -> F:
    """``fn`` whose :class:`InputError` is raised from the public call itself, without the frames below it
    (``LRP_FULL_TRACEBACK=1``: the whole traceback). Nested public calls strip once, at the outermost."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as err:
            if os.environ.get("LRP_FULL_TRACEBACK", "") not in ("", "0"):
                raise
            raise err.with_traceback(None) from err.__cause__

    return call  # type: ignore[return-value]
