"""The audit's console report: one row per attack class, then each finding."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gym_bridge.audit.run import AuditReport

__all__ = ["print_report"]


def print_report(report: AuditReport, console: Console) -> None:
    table = Table(title=f"audit of {report.url} (--env {report.env})", title_justify="left")
    table.add_column("attack class")
    table.add_column("attacks", justify="right")
    table.add_column("findings", justify="right")
    for name, (attacks, findings) in report.by_class().items():
        table.add_row(name, str(attacks), f"[red]{findings}[/red]" if findings else "0")
    console.print(table)
    for finding in report.findings:
        console.print(
            f"FINDING {finding.attack_class}: {finding.attack} ({finding.what}): {finding.observed}",
            markup=False,
            highlight=False,
        )
    skipped = [o for o in report.outcomes if o.skipped]
    for outcome in skipped:
        console.print(f"not checked: {outcome.attack}: {outcome.skipped}", markup=False, highlight=False)
    total = len(report.findings)
    console.print(f"{total} finding{'s' * (total != 1)}" if total else "no findings", highlight=False)
