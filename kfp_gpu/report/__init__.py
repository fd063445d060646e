"""Run reports: timeline SVG, cost-risk model, HTML page and terminal renderings. Pure rendering, no I/O
except the explicit ``write_html``."""

from kfp_gpu.report.bundle import write_run_report
from kfp_gpu.report.cost import CostReport, cost_report
from kfp_gpu.report.html import PreflightRow, render_html, rows_from_quota_checks, write_html
from kfp_gpu.report.secrets import scan_for_secrets
from kfp_gpu.report.terminal import gantt, progress_from_timeline, progress_line
from kfp_gpu.report.timeline_svg import render_timeline_svg

__all__ = [
    "CostReport",
    "PreflightRow",
    "cost_report",
    "gantt",
    "progress_from_timeline",
    "progress_line",
    "render_html",
    "render_timeline_svg",
    "rows_from_quota_checks",
    "scan_for_secrets",
    "write_html",
    "write_run_report",
]
