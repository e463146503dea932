"""The composition root: the app and its wiring (``app.py``, ``wiring.py``), the node's view
for the API, start-up checks, shutdown, signals and the one-agent-per-node lock. The
capabilities it wires live in their own folders: :mod:`agent.node`, :mod:`agent.control`,
:mod:`agent.learning`, :mod:`agent.claims`, :mod:`agent.legacy`."""
