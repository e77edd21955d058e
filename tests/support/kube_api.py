"""A stand-in for a Kubernetes API server, only as far as kubectl's requests about one RayJob go:
it answers discovery (/api, /apis, ...) so that the real kubectl resolves ``rayjob`` to
ray.io/v1, and records every other request (method, path, query) for the test to assert. It
knows only what the test gives it: RayJobs by (namespace, name), pods with their labels and
logs. A RayJob it does not hold, or any other path, is kubectl's 404 NotFound Status. It runs no
controller: nothing happens to a RayJob but what the test does."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

DISCOVERY = {
    "/version": {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "ray.io", "versions": [{"groupVersion": "ray.io/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "ray.io/v1", "version": "v1"}}]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
         "verbs": ["get", "list"], "shortNames": ["ns"]},
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
         "verbs": ["get", "list", "delete", "watch"], "shortNames": ["po"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]}]},
    "/apis/ray.io/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "ray.io/v1", "resources": [
        {"name": "rayjobs", "singularName": "rayjob", "namespaced": True, "kind": "RayJob", "categories": ["all"],
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]},
}


def not_found(what: str, name: str, group: str = "") -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'{what}{"." + group if group else ""} "{name}" not found', "reason": "NotFound",
            "details": {"name": name, "group": group, "kind": what}, "code": 404}


@dataclass
class KubeApi:
    rayjobs: dict[tuple[str, str], dict] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict] = field(default_factory=dict)  # (ns, pod) -> {"labels": {...}, "log": "..."}
    namespaces: set[str] = field(default_factory=lambda: {"rl"})
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, query), discovery left out
    port: int = 0

    def kubeconfig(self, path: Path, context: str = "test") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "test", "user": {}}],
            "contexts": [{"name": context, "context": {"cluster": "test", "user": "test"}}]}))
        return path

    def answer(self, method: str, path: str, raw_query: str) -> tuple[int, object, str]:
        query = dict(parse_qsl(raw_query))
        parts = path.strip("/").split("/")
        if method == "GET" and path in DISCOVERY:
            return 200, DISCOVERY[path], "application/json"
        self.requests.append((method, path, raw_query))  # as kubectl sent it
        if parts[:4] == ["apis", "ray.io", "v1", "namespaces"] and len(parts) == 7 and parts[5] == "rayjobs":
            key = (parts[4], parts[6])
            if key not in self.rayjobs:
                return 404, not_found("rayjobs", parts[6], "ray.io"), "application/json"
            if method == "DELETE":
                return 200, self.rayjobs.pop(key), "application/json"
            return 200, self.rayjobs[key], "application/json"
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "pods" and method == "GET":
            want = dict(s.split("=", 1) for s in query.get("labelSelector", "").split(",") if "=" in s)
            items = [{"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": pod, "namespace": ns, "labels": spec["labels"]},
                      "spec": {"containers": [{"name": "ray-job-submitter", "image": "x"}]},
                      "status": {"phase": "Running"}}
                     for (ns, pod), spec in self.pods.items()
                     if ns == parts[3] and all(spec["labels"].get(k) == v for k, v in want.items())]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}, "application/json"
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 7 and parts[4] == "pods" and parts[6] == "log":
            pod = self.pods.get((parts[3], parts[5]))
            if pod is not None:
                return 200, pod["log"].encode(), "text/plain"
            return 404, not_found("pods", parts[5]), "application/json"
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4 and parts[3] in self.namespaces:
            return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": parts[3]},
                         "status": {"phase": "Active"}}, "application/json"
        return 404, not_found("namespaces" if parts[:3] == ["api", "v1", "namespaces"] else "things", parts[-1]), \
            "application/json"

    def __enter__(self) -> KubeApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _any(self):
                url = urlsplit(self.path)
                code, body, ctype = api.answer(self.command, url.path, url.query)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
