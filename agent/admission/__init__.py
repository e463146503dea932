"""Admission domain: the pure decision rules (memory space, compute rate, trust, placement)."""
