"""The estimator's learning loop: run records, progress, retraining, learned models, the
retention gate, the profiler."""
