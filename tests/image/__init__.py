"""Checks of the agent's container image (pytest marker ``image``) and of the chart's
package."""
