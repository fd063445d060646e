"""A conservative secrets scanner for compiled pipeline YAML, reports and logs.

``scan_for_secrets(text)`` returns one human-readable finding per hit (kind, line number and a
redacted excerpt), an empty list when clean. It looks for:

* AWS access key ids (``AKIA``/``ASIA`` + 16 upper-case alphanumerics) and ``aws_secret_access_key``
  assignments with a 40-char value;
* PEM private key blocks (``-----BEGIN ... PRIVATE KEY-----``);
* GCP service-account key JSON (``"private_key"`` / ``"private_key_id"`` fields,
  ``"type": "service_account"``);
* ``"token":`` / ``token: <value>`` fields with a non-empty literal value, and ``Bearer <token>``
  strings; placeholders such as ``{{$.inputs...}}``, ``$(VAR)``, ``${VAR}`` or ``<redacted>`` are
  ignored so pipeline templates do not trip it;
* GitHub/Slack style tokens (``ghp_...``, ``xox[bp]-...``).
"""

from __future__ import annotations

import re

_PLACEHOLDER = re.compile(r"^(\{\{|\$\(|\$\{|<|\*+$|x+$|\.\.\.$|null$|none$|$)", re.I)

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("AWS secret access key",
     re.compile(r"aws_secret_access_key\s*[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+=]{40})", re.I)),
    ("private key block", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("GCP service-account key", re.compile(r"[\"']private_key(?:_id)?[\"']\s*:\s*[\"'][^\"']+")),
    ("GCP service-account key", re.compile(r"[\"']type[\"']\s*:\s*[\"']service_account[\"']")),
    ("bearer token", re.compile(r"\bBearer\s+([A-Za-z0-9\-._~+/]{16,}=*)")),
    ("GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b")),
    ("Slack token", re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}\b")),
]
_TOKEN_FIELD = re.compile(
    r"""["']?(?:[A-Za-z_]*_)?(token|access_token|id_token|refresh_token|api_key|apikey|password|secret)["']?"""
    r"""\s*:\s*["']?([^"',\s}]*)""",
    re.I,
)


def _redact(s: str) -> str:
    s = s.strip()
    return s[:6] + "\u2026" if len(s) > 6 else "\u2026"


def scan_for_secrets(text: str) -> list[str]:
    """Findings like ``line 12: AWS access key id (AKIAIO…)``; ``[]`` when nothing looks secret.

    Raises:
        Nothing; non-string input is converted with ``str()``.
    """
    findings: list[str] = []
    for lineno, line in enumerate(str(text).splitlines(), start=1):
        for kind, pat in _PATTERNS:
            for m in pat.finditer(line):
                findings.append(f"line {lineno}: {kind} ({_redact(m.group(0))})")
        for m in _TOKEN_FIELD.finditer(line):
            value = m.group(2)
            if _PLACEHOLDER.match(value) or len(value) < 8:
                continue
            findings.append(f"line {lineno}: {m.group(1).lower()} field with a literal value ({_redact(value)})")
    return findings
