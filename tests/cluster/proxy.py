"""The project's tests take the fault-injecting proxy from dlm.testing, where users get it too."""

from dlm.testing.proxy import BOTH, DOWN, UP, Proxy

__all__ = ["BOTH", "DOWN", "UP", "Proxy"]
