"""Errors raised by lrp_core, each naming what was wrong and what is accepted."""


class LRPError(ValueError):
    """Base class of the library's input errors."""


class UnsupportedModelError(LRPError, TypeError):
    """The model is not one of the architectures the engine can explain."""


class UnknownMethodError(LRPError, KeyError):
    """The method name is not in :data:`lrp_core.METHODS`."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InputError(LRPError):
    """The inputs (images, text, target, options) are not acceptable."""


class LRPWarning(UserWarning):
    """Base class of the library's warnings: the call ran, but something about it deserves a word."""


class UnreflectedHookWarning(LRPWarning):
    """The model carries forward hooks on modules the replay does not run, so the explained function is not
    the hooked model's. ``warnings.simplefilter("error", UnreflectedHookWarning)`` makes it an error."""
