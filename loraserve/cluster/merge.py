"""One answer from the replicas' answers to a broadcast call: the same answer from all
(global writes, `GET /lora-adapters`), `/metrics` with a `replica` label on every sample,
and `/health` that is ok only when every wanted replica is up and healthy."""

from __future__ import annotations

import json
import re

from starlette.responses import Response

from loraserve.cluster.asgi_host import HttpAnswer
from loraserve.server.errors import ApiError, unavailable

REPLICA_HEADER = "X-Loraserve-Replica"
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?( .*)")


def response(answer: HttpAnswer, replicas: str) -> Response:
    """A Starlette response carrying ``answer`` as it is, plus `REPLICA_HEADER`."""
    out = Response(answer.body, status_code=answer.status)
    out.raw_headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in answer.headers
        if k.lower() not in ("content-length", REPLICA_HEADER.lower())
    ]
    out.raw_headers += [
        (b"content-length", str(len(answer.body)).encode()),
        (REPLICA_HEADER.lower().encode(), replicas.encode("latin-1")),
    ]
    return out


def error(err: ApiError, replicas: str) -> Response:
    """An error body of the contract, with `REPLICA_HEADER`."""
    body = json.dumps(err.body()).encode()
    return response(HttpAnswer(err.status, [("content-type", "application/json")], body), replicas)


def names(answers: dict[str, HttpAnswer]) -> str:
    """The header value naming every replica that answered."""
    return ",".join(sorted(answers))


def same(answers: dict[str, HttpAnswer]) -> Response:
    """The answer every replica gave (they hold the same state); a 500 naming who answered
    what if they differ, a 503 if none answered."""
    if not answers:
        return error(unavailable("no replica is ready"), "")
    first = answers[min(answers)]
    if all(a.status == first.status and a.body == first.body for a in answers.values()):
        return response(first, names(answers))
    told = "; ".join(
        f"{r}: {a.status} {a.body[:200].decode(errors='replace')}"
        for r, a in sorted(answers.items())
    )
    return error(
        ApiError(500, "server_error", f"the replicas answered differently: {told}"), names(answers)
    )


def health(answers: dict[str, HttpAnswer], wanted: int) -> Response:
    """`{"status": "ok"}` only when ``wanted`` replicas answered 200; else the 503 says how
    many are ready (and a replica's own 503, such as "Loading model", when there is one)."""
    ok = [r for r, a in answers.items() if a.status == 200]
    if len(ok) >= wanted:
        return response(answers[min(ok)], names(answers))
    bad = next((a for a in answers.values() if a.status != 200), None)
    detail = f": {json.loads(bad.body)['error']['message']}" if bad is not None else ""
    msg = f"{len(ok)} of {wanted} replicas are ready{detail}"
    return error(unavailable(msg), names(answers))


def label_metrics(text: str, replica: str) -> list[str]:
    """Prometheus text lines with ``replica="..."`` added to every sample."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.fullmatch(line)
        if line.startswith("#") or m is None:
            out.append(line)
            continue
        labels = f'replica="{replica}"' + (f",{m[3]}" if m[3] else "")
        out.append(f"{m[1]}{{{labels}}}{m[4]}")
    return out


def metrics(answers: dict[str, HttpAnswer]) -> Response:
    """Every replica's `/metrics` in one exposition: each family's HELP and TYPE once,
    then its samples from every replica, labelled by replica. A replica's error answer
    (501 without `--metrics`) is passed on as it is."""
    if not answers:
        return error(unavailable("no replica is ready"), "")
    bad = next((a for _, a in sorted(answers.items()) if a.status != 200), None)
    if bad is not None:
        return response(bad, names(answers))
    families: dict[str, list[str]] = {}  # family -> HELP/TYPE lines then samples
    current = ""
    for rid, answer in sorted(answers.items()):
        for line in label_metrics(answer.body.decode(), rid):
            if line.startswith("# "):
                parts = line.split(" ", 3)
                current = parts[2] if len(parts) > 2 else current
                fam = families.setdefault(current, [])
                if line not in fam:
                    fam.insert(sum(1 for x in fam if x.startswith("#")), line)
            elif line:
                families.setdefault(current, []).append(line)
    text = "\n".join(line for fam in families.values() for line in fam) + "\n"
    first = answers[min(answers)]
    headers = [(k, v) for k, v in first.headers if k.lower() == "content-type"]
    return response(HttpAnswer(200, headers, text.encode()), names(answers))
