"""Schemathesis hooks for Pinion's API (loaded through SCHEMATHESIS_HOOKS).

- `field_named`: issue 12 asks that every 4xx caused by a field name it. A 400,
  and a 422 `Invalid`, must carry `details` with a non-empty `field` each
  (the body's path, a query or path parameter, or `(body)`).
- `anonymous_refused`: in the anonymous pass (run.sh without a client
  certificate) every route but /healthz, /version and the join answers 401.
  That pass sends no body over 16 KiB, the most an anonymous caller may send
  (`filter_body`): the server answers an anonymous caller 401 without
  reading its body and closes, and a client still writing it may see the
  connection reset before the 401 (`SSLEOFError`), which Schemathesis
  reports as a network error, not an answer.
- Watches and log follows never end on their own, so `before_call` turns
  `watch` and `follow` off (the attach stream is excluded on the command line).
- `after_call` counts requests and status codes into $PINION_SCHEMATHESIS_STATS
  (JSON), for the figure in RELIABILITY.md.
"""

import atexit
import json
import os
from collections import Counter

import schemathesis

STREAM_FLAGS = ("watch", "follow")
_codes = Counter()


@schemathesis.check
def field_named(ctx, response, case):
    if response.status_code not in (400, 422):
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} without a JSON ApiError body")
    if response.status_code == 422 and body.get("reason") != "Invalid":
        # 422 Unschedulable: the pod as a whole fits no node; no one field is at fault.
        return None
    details = body.get("details") or []
    if not details or not all(isinstance(d, dict) and d.get("field") for d in details):
        raise AssertionError(
            f"{response.status_code} {body.get('reason')} names no field: {body.get('message')!r}"
        )
    return None


# What a caller without a certificate may reach (the join carries its token).
PUBLIC = {"/healthz", "/version", "/api/v1/join"}


@schemathesis.check
def anonymous_refused(ctx, response, case):
    """In the anonymous pass every other route answers 401, before its body is read."""
    if os.environ.get("PINION_SCHEMATHESIS_ANONYMOUS") != "1":
        return None
    if case.path in PUBLIC:
        return None
    # 404/405 come from the router before the door; nothing was read either.
    if response.status_code not in (401, 404, 405):
        raise AssertionError(f"{case.method} {case.path} without a certificate answered {response.status_code}, not 401")
    return None


# Within the kernel's socket buffers, so an unread body never resets the connection.
ANONYMOUS_BODY_MAX = 16 * 1024


@schemathesis.hook
def filter_body(ctx, body):
    if os.environ.get("PINION_SCHEMATHESIS_ANONYMOUS") != "1":
        return True
    try:
        size = len(json.dumps(body))
    except (TypeError, ValueError):
        size = len(body) if isinstance(body, (bytes, str)) else 0
    return size <= ANONYMOUS_BODY_MAX


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    query = case.query
    if not isinstance(query, dict):
        return None
    for flag in STREAM_FLAGS:
        if flag in query:
            value = query[flag]
            # The server reads true, 1 and an empty value as "on".
            if value is True or str(value).lower() in ("true", "1", ""):
                query[flag] = "false"
    return None


@schemathesis.hook
def after_call(ctx, case, response):
    _codes[str(response.status_code)] += 1


def _write_stats():
    path = os.environ.get("PINION_SCHEMATHESIS_STATS")
    if path:
        with open(path, "w") as f:
            json.dump({"requests": sum(_codes.values()), "status": dict(sorted(_codes.items()))}, f)


atexit.register(_write_stats)
