"""Operational tools behind the CLI: recover, verify, inspect, stats, get, query, demo."""
