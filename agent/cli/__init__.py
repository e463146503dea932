"""The ``gpushare`` command: ``serve`` and the on-call commands."""
