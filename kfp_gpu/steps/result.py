"""What every step returns: a JSON output for the next step, metrics, and a report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepResult:
    output_json: str
    metrics: dict[str, float] = field(default_factory=dict)
    markdown: str = ""  # terminal/markdown report
    html: str = ""  # full self-contained HTML page; built from markdown when empty
