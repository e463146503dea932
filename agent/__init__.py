"""gpushare: a node-local GPU sharing agent."""

__version__ = "0.1.0"
