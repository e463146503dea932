"""Settings: grouped dataclasses, read from a versioned YAML file < environment < flags."""

from agent.config.loading import load_settings, settings_as_dict
from agent.config.settings import CONFIG_VERSION, Settings

__all__ = ["CONFIG_VERSION", "Settings", "load_settings", "settings_as_dict"]
