"""What each fault scenario measured: one line on stdout, and, when ``NOTIFYQ_FAULTS_JSON``
names a file, an entry of it by scenario (the figures of the failure-mode table in
docs/concepts/guarantees.md come from there)::

    NOTIFYQ_FAULTS_JSON=faults.json pytest tests/faults -p no:randomly -s

The file is read, merged and written under an exclusive lock: the scenarios run in two
processes at once."""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV = "NOTIFYQ_FAULTS_JSON"


@dataclass
class Figures:
    """A scenario's outcome. ``lost``: acknowledged jobs that never completed; ``stuck``: jobs
    left unfinished (queued, processing, waiting) once everything should have ended; ``run_twice``:
    jobs whose handler ran more than once; ``recovery_s``: seconds until each part worked again,
    by part; ``runtime_s``: the scenario's wall time; ``notes``: what else it counted."""

    scenario: str
    lost: int = 0
    stuck: int = 0
    run_twice: int = 0
    recovery_s: dict[str, float] = field(default_factory=dict)
    runtime_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    began: float = field(default_factory=time.monotonic, repr=False)

    def line(self) -> str:
        recovery = ", ".join(f"{part} {s:.2f} s" for part, s in self.recovery_s.items())
        notes = ", ".join(f"{k} {v}" for k, v in self.notes.items())
        return (
            f"[faults] {self.scenario}: lost {self.lost}, stuck {self.stuck}, run twice "
            f"{self.run_twice}; back: {recovery or '-'}; {notes}; took {self.runtime_s:.1f} s"
        )

    def report(self) -> None:
        """Prints the line and adds the figures to the file ``NOTIFYQ_FAULTS_JSON`` names."""
        self.runtime_s = round(time.monotonic() - self.began, 1)
        self.recovery_s = {part: round(s, 2) for part, s in self.recovery_s.items()}
        print(self.line())
        target = os.environ.get(ENV)
        if not target:
            return
        path = Path(target)
        with path.open("a+", encoding="utf-8") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            file.seek(0)
            text = file.read()
            found: dict[str, Any] = json.loads(text) if text.strip() else {}
            entry = asdict(self)
            del entry["began"]
            found[self.scenario] = entry
            file.seek(0)
            file.truncate()
            file.write(json.dumps(found, indent=2, sort_keys=True) + "\n")
