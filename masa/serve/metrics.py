"""The daemon's Prometheus metrics, through the official client library.

Owns the metric names and labels (docs/serve.md lists them). Each service has
its own registry (two daemons in one test process do not mix), with the
client's process collector for resident memory and CPU. Counters and
histograms are updated from the scheduler and journal threads (the client
library is thread-safe); `render` gives the text format for `GET /metrics`.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

# Response times of a device: tens of milliseconds to a minute.
_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_resident_memory_bytes and CPU
        self.jobs_accepted = Counter("masa_jobs_accepted", "Jobs accepted (journaled, 202)",
                                     ["graph"], registry=registry)
        self.jobs_resumed = Counter("masa_jobs_resumed", "Unfinished jobs resumed at start",
                                    registry=registry)
        self.jobs_finished = Counter(
            "masa_jobs_finished", "Jobs ended, by final state (done, failed, cancelled)",
            ["graph", "state"], registry=registry)
        self.jobs_rejected = Counter(
            "masa_jobs_rejected", "Job submissions refused, by reason (queue_full, too_large, "
            "bad_input, unknown_graph, unauthorized, shutting_down)", ["reason"],
            registry=registry)
        self.networks_finished = Counter(
            "masa_networks_finished", "Network instances ended, by status (done, failed, "
            "skipped, aborted, cancelled)", ["network", "status"], registry=registry)
        self.job_response = Histogram(
            "masa_job_response_seconds", "From acceptance to the job's end", ["graph"],
            buckets=_BUCKETS_S, registry=registry)
        self.network_response = Histogram(
            "masa_network_response_seconds", "From the job's submission to the scheduler to "
            "the network's end", ["network"], buckets=_BUCKETS_S, registry=registry)
        self.task_seconds = Counter(
            "masa_task_seconds", "Time spent in LOAD and EXEC tasks", ["network", "kind"],
            registry=registry)
        self.over_commits = Counter(
            "masa_over_commits", "Dispatches that took reserved memory over the budget",
            ["reason"], registry=registry)
        self.queue_jobs = Gauge("masa_queue_jobs", "Accepted jobs not yet ended",
                                registry=registry)
        self.reserved_bytes = Gauge("masa_ledger_reserved_bytes",
                                    "Memory reserved by the scheduler's ledger",
                                    registry=registry)
        self.kept_loaded_bytes = Gauge(
            "masa_ledger_kept_loaded_bytes", "Of the reserved memory, loaded stages kept "
            "between jobs (keep_loaded)", registry=registry)
        self.budget_bytes = Gauge("masa_memory_budget_bytes", "The scheduler's memory budget",
                                  registry=registry)
        self.state_entries = Gauge(
            "masa_scheduler_state_entries", "Tasks, groups and locks held by the scheduler "
            "(flat over time: ended jobs are forgotten)", registry=registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
