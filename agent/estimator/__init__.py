"""Estimator domain: the Random Forest retention estimator and its features."""
