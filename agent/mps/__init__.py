"""MPS domain: one control daemon per shared device, its limits and its health."""
