"""The version of notifyq, in a module of its own so that every other module can name it
without importing the package root (which imports, lazily, nearly everything else). Keep it
equal to ``version`` in pyproject.toml."""

__version__ = "0.1.0"
