"""The staged build context (rlbox.image.context): what it holds, an exact mirror of the checkout's
inputs, hard-linked (or copied with its mtime), its lock; and the content mtime of fetched files."""

from __future__ import annotations

import hashlib
import os

from rlbox.image import sources


def test_a_fetched_file_gets_its_contents_mtime(tmp_path, monkeypatch):
    import requests

    body = {"x": b"one file", "y": b"another file"}

    class Answer:
        def __init__(self, url, **kw):
            self.data = body[url.rsplit("/", 1)[1]]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def raise_for_status(self):
            pass

        def iter_content(self, size):
            yield self.data

    monkeypatch.setattr(requests, "get", Answer)
    sha = {k: hashlib.sha256(v).hexdigest() for k, v in body.items()}
    a = sources.download("https://example.invalid/x", sha["x"], tmp_path / "a" / "x.whl")
    b = sources.download("https://example.invalid/x", sha["x"], tmp_path / "b" / "x.whl")  # another checkout
    assert a.stat().st_mtime_ns == b.stat().st_mtime_ns == sources.content_mtime(sha["x"])
    y = sources.download("https://example.invalid/y", sha["y"], tmp_path / "c" / "x.whl")
    assert y.stat().st_mtime_ns != a.stat().st_mtime_ns  # other content, another mtime
    os.utime(a, ns=(5, 5))  # a file already present (fetched before mtimes were made so) gets it too
    assert sources.download("https://example.invalid/x", sha["x"], a).stat().st_mtime_ns == sources.content_mtime(sha["x"])
    assert 0 <= sources.content_mtime(sha["x"]) < (1 << 31) * 10**9
