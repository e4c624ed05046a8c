"""Deploy: containers from the inventory onto hosts (spec, pre-flight, delivery, apply, access)."""
