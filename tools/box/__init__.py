"""Box coordinator: one memory ledger for every family (reserve before work, refuse or queue with reasons, pin,
reconcile with what the device shows) and the box_plan tool."""
