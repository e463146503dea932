"""The DRA driver's decisions: ResourceClaims as leases (Prepare, binding answers, reconcile,
CDI specs, slices)."""
