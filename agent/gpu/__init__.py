"""GPU domain: device inventory and counter telemetry behind narrow ports."""
