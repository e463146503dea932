"""The composition root (``app.py``) and the task supervisor (``tasks.py``)."""
