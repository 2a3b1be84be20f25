"""The fault suite: each scenario against PostgreSQL clusters of its own (see cluster.py),
reporting what it measured (report.py)."""
