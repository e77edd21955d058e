"""A local HTTP server laid out like Hugging Face's resolve/main URLs (so `--endpoint URL` is the
real switch of `rlbox data prepare`), serving parquet files made from rows."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


class Hub:
    """Files under ROOT/datasets/{repo}/resolve/main/{path}; counts the GETs."""

    def __init__(self, root: Path):
        self.root, self.gets = root, []
        hub = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(root), **kw)

            def do_GET(self):
                hub.gets.append(self.path)
                super().do_GET()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put(self, repo: str, path: str, rows: list[dict]):
        dest = self.root / "datasets" / repo / "resolve" / "main" / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), dest)
