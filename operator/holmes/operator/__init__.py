"""The kopf operator that plans, launches and tracks HolmesJobs."""
