"""Which stage files stay in the page cache once their stages are unloaded
(`KeptFiles`): the executor's rule, plain data, no I/O.

Where the stage files a workload reads do not all fit in the page cache, every
job reads them in the same order, and the kernel evicts the least recently used
pages first, which are exactly the ones the next job reads first: each job
reads every file again from storage (LRU's worst case, a loop larger than the
cache). Measured on the emulated Pi 4 (docs/scheduling.md, "Keeping stage
files cached"): after its cold first job, mixed at 512 MiB read 573 of its
637 MiB of stage files again for every job. Keeping the files unloaded first
and dropping the ones unloaded after the kept bytes are full (most recently
used first) turns that loop into hits on the kept part: the next job finds
its first files cached and reads only the rest.
"""

from __future__ import annotations


class KeptFiles:
    """Stage files to keep cached, at most `keep_bytes` of them, first unloaded first.

    `unloaded(path, size_bytes)` is told each time a stage is unloaded and says
    whether to drop the file's pages now. A file already kept stays kept; a new
    one is kept while the kept bytes allow it; any other is dropped, so that the
    kernel, when it needs room, finds these pages gone rather than evicting the
    kept ones. The kept set never changes once full: a rule for workloads that
    repeat (the same networks job after job), not for ones whose networks drift.
    """

    def __init__(self, keep_bytes: int) -> None:
        if keep_bytes < 0:
            raise ValueError(f"keep_bytes: expected >= 0, got {keep_bytes}")
        self.keep_bytes = keep_bytes
        self.kept_bytes_by_path: dict[str, int] = {}
        self.kept_bytes = 0
        self.dropped_bytes = 0  # summed over drops: what the rule gave back

    def unloaded(self, path: str, size_bytes: int) -> bool:
        """Whether to drop `path`'s pages from the page cache now."""
        if path in self.kept_bytes_by_path:
            return False
        if self.kept_bytes + size_bytes <= self.keep_bytes:
            self.kept_bytes_by_path[path] = size_bytes
            self.kept_bytes += size_bytes
            return False
        self.dropped_bytes += size_bytes
        return True
