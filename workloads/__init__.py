"""Workloads: job-graph YAML, arrival generators, scenarios and the model zoo."""
