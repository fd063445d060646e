"""The four AWS wire protocols the stand-in speaks, as botocore sends and parses them.

* EKS: REST-JSON (path + JSON body; errors: HTTP status, ``x-amzn-ErrorType`` header, ``{"message"}``).
* EC2: query (form body ``Action=...&Version=2016-11-15``; XML answers, lower-camel names, ``item`` lists;
  errors ``<Response><Errors><Error><Code>``).
* Auto Scaling: query (``Version=2011-01-01``; ``<XResponse><XResult>``, ``member`` lists; errors
  ``<ErrorResponse><Error><Type>Sender</Type><Code>``).
* Service Quotas: JSON 1.1 (``X-Amz-Target: ServiceQuotasV20190624.Op``; errors ``{"__type", "message"}``).

The service is read from the SigV4 ``Authorization`` credential scope (``.../<region>/<service>/aws4_request``),
so one port serves every client whose ``endpoint_url`` points here.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
ASG_NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/([^/]+)/aws4_request")

Answer = tuple[int, dict[str, str], bytes]


def scope(headers: Any) -> tuple[str, str]:
    """(region, service) of a SigV4-signed request; ("", "") when unsigned."""
    m = _SCOPE.search(headers.get("Authorization", "") or "")
    return (m.group(1), m.group(2)) if m else ("", "")


def form(body: bytes) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}


def flat_list(q: dict[str, str], prefix: str) -> list[str]:
    """``Prefix.1``, ``Prefix.2``... (EC2) or ``Prefix.member.1``... (query) values, in order."""
    out: list[tuple[int, str]] = []
    for k, v in q.items():
        m = re.fullmatch(re.escape(prefix) + r"(?:\.member)?\.(\d+)", k)
        if m:
            out.append((int(m.group(1)), v))
    return [v for _, v in sorted(out)]


def ec2_filters(q: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in q.items():
        m = re.fullmatch(r"Filter\.(\d+)\.Name", k)
        if m:
            out[v] = flat_list(q, f"Filter.{m.group(1)}.Value")
    return out


def xml(value: Any, item: str) -> str:
    """Render dicts/lists/scalars as AWS query XML (``item`` = the list element name)."""
    if isinstance(value, dict):
        return "".join(f"<{k}>{xml(v, item)}</{k}>" for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return "".join(f"<{item}>{xml(v, item)}</{item}>" for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return escape(str(value))


def ec2_ok(action: str, body: dict[str, Any]) -> Answer:
    doc = (f'<?xml version="1.0" encoding="UTF-8"?><{action}Response xmlns="{EC2_NS}"><requestId>{uuid.uuid4()}'
           f"</requestId>{xml(body, 'item')}</{action}Response>")
    return 200, {"Content-Type": "text/xml;charset=UTF-8"}, doc.encode()


def ec2_error(code: str, message: str, status: int = 400) -> Answer:
    doc = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{escape(code)}</Code><Message>'
           f"{escape(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>")
    return status, {"Content-Type": "text/xml;charset=UTF-8"}, doc.encode()


def asg_ok(action: str, body: dict[str, Any]) -> Answer:
    doc = (f'<{action}Response xmlns="{ASG_NS}"><{action}Result>{xml(body, "member")}</{action}Result>'
           f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata></{action}Response>")
    return 200, {"Content-Type": "text/xml"}, doc.encode()


def asg_error(code: str, message: str, status: int = 400) -> Answer:
    doc = (f'<ErrorResponse xmlns="{ASG_NS}"><Error><Type>Sender</Type><Code>{escape(code)}</Code><Message>'
           f"{escape(message)}</Message></Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>")
    return status, {"Content-Type": "text/xml"}, doc.encode()


def rest_ok(body: dict[str, Any]) -> Answer:
    return 200, {"Content-Type": "application/json", "x-amzn-RequestId": str(uuid.uuid4())}, json.dumps(body).encode()


def rest_error(code: str, message: str, status: int, **extra: Any) -> Answer:
    return status, {"Content-Type": "application/json", "x-amzn-ErrorType": code,
                    "x-amzn-RequestId": str(uuid.uuid4())}, json.dumps({"message": message, **extra}).encode()


def json11_ok(body: dict[str, Any]) -> Answer:
    return 200, {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": str(uuid.uuid4())}, \
        json.dumps(body).encode()


def json11_error(code: str, message: str, status: int = 400) -> Answer:
    return status, {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": str(uuid.uuid4())}, \
        json.dumps({"__type": code, "message": message}).encode()


ERROR_RENDER = {"ec2": ec2_error, "autoscaling": asg_error, "servicequotas": json11_error}


def error(service: str, code: str, message: str, status: int) -> Answer:
    if service == "eks":
        return rest_error(code, message, status)
    return ERROR_RENDER.get(service, json11_error)(code, message, status)
