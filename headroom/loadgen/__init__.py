"""`headroom bench`: an open-loop load generator (arrivals, clients, scenarios, measurement, reports)."""
