"""Replay experiments of bench/replay.py; each writes a table and a plot under docs/replay/."""
