"""The control loops after admission: readiness, the janitor, degradation; process attribution."""
