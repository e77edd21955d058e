"""Network answers are input (issue 37): what a package index, a mirror or a registry sends back
is read like a file rlbox did not write. Every answer is

- size-bounded: at most ``limit`` bytes once decoded (a ``Content-Length`` over it is refused
  before the body is read; a body that grows past it is cut off);
- read under an overall deadline: connect within ``min(CONNECT, deadline)`` seconds and the whole
  answer (status, headers, body) within ``deadline`` seconds, however slowly the server drips it
  (a per-read timeout alone never ends a server that sends a byte every few seconds);
- depth-bounded and typed when it is JSON (``json_of``: the bounds of rlbox.core.config.load_json,
  then the caller's own types at its boundary).

A failure is one line naming the URL (credentials redacted) and what was wrong; the caller adds
what it was doing. Exceptions of requests itself (refused, unknown host, TLS) reach the caller
unchanged, so that it can say what to do about each.
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING, Any

from rlbox.core.config import load_json, redact_url
from rlbox.core.errors import RlboxError

if TYPE_CHECKING:
    import requests

MAX_ANSWER_BYTES = 64 * 1024 * 1024  # PyPI's largest JSON simple-API pages (torch) are a few MB
CONNECT = 10.0  # seconds to open the connection, at most
DEADLINE = 60.0  # seconds for the whole answer, unless the caller or RLBOX_NET_DEADLINE says otherwise
DEADLINE_ENV = "RLBOX_NET_DEADLINE"
CHUNK = 64 * 1024


class Unanswered(RlboxError):
    """An answer that did not come whole: past the deadline or past the size bound."""


def deadline_from_env(default: float = DEADLINE) -> float:
    """``RLBOX_NET_DEADLINE`` (seconds, a positive number) or ``default``; anything else is one line."""
    text = os.environ.get(DEADLINE_ENV)
    if text is None or text == "":
        return default
    try:
        value = float(text) if len(text) <= 20 else float("nan")
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:  # nan fails too
        raise RlboxError(f"{DEADLINE_ENV}={text[:40]!r}: give the seconds an answer may take (0 < s <= 86400)")
    return value


def fetch(url: str, *, session: "requests.Session | None" = None, method: str = "GET", deadline: float | None = None,
          limit: int = MAX_ANSWER_BYTES, **kw: Any) -> "requests.Response":
    """``session.request(method, url, **kw)`` with its body read whole (``resp.content``) within
    ``limit`` bytes and ``deadline`` seconds; else Unanswered naming the URL. requests' own
    exceptions are raised as they are."""
    import requests

    session = session or requests.Session()
    deadline = deadline_from_env() if deadline is None else deadline
    shown = redact_url(url)
    done = threading.Event()
    stop = threading.Event()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            resp = session.request(method, url, stream=True, timeout=(min(CONNECT, deadline), deadline), **kw)
            try:
                length = resp.headers.get("Content-Length", "")
                if re.fullmatch(r"[0-9]{1,18}", length) and int(length) > limit:
                    raise Unanswered(f"{shown}: the answer is {int(length)} bytes, over the {limit} rlbox reads")
                body, size = [], 0
                if method != "HEAD":
                    for chunk in resp.iter_content(CHUNK):
                        if stop.is_set():
                            return
                        size += len(chunk)
                        if size > limit:
                            raise Unanswered(f"{shown}: the answer is over the {limit} bytes rlbox reads; "
                                             "cut off there")
                        body.append(chunk)
                resp._content = b"".join(body)  # requests' own slots: resp.content, .json(), .text read it
                resp._content_consumed = True
            finally:
                resp.close()
            result["response"] = resp
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            result["error"] = err
        finally:
            done.set()

    threading.Thread(target=work, name=f"answer {shown[:60]}", daemon=True).start()
    if not done.wait(deadline):  # the reads' own timeouts end a stall; this ends a drip
        stop.set()
        raise Unanswered(f"{shown}: no whole answer within {deadline:g} s (a server that stalls or drips); "
                         f"nothing of it is used (more time: {DEADLINE_ENV}=SECONDS)")
    if "error" in result:
        raise result["error"]
    return result["response"]


def json_of(resp: "requests.Response", where: str | None = None) -> Any:
    """The JSON of an answer ``fetch`` read, within load_json's depth bound and this size bound;
    else RlboxError naming ``where`` (default: the answer's URL)."""
    where = where or redact_url(resp.url or "")
    try:
        text = resp.content.decode("utf-8")
    except UnicodeDecodeError:
        raise RlboxError(f"{where}: the answer is not UTF-8 JSON") from None
    return load_json(text, where, limit=MAX_ANSWER_BYTES)
