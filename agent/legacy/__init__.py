"""The legacy path (device plugin, NRI, extender), fenced: nothing outside it imports it but
the app's wiring (an import-linter contract holds it so)."""
