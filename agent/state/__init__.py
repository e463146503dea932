"""State domain: the durable store of leases, reservations and events."""
