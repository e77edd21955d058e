"""rlbox's stand-in for vLLM's OpenAI server in a simulated cluster (`rlbox serve --sim`).

SIMULATED: no model is loaded and nothing is generated. It takes the same arguments
`python -m vllm.entrypoints.openai.api_server` takes (the ones it does not use are accepted and
ignored), refuses a MODEL folder without config.json as vLLM does, and answers the routes
AISBench and verl use: GET /health, GET /v1/models, POST /v1/completions and
POST /v1/chat/completions. Answers are deterministic: if MODEL holds ``rlbox-stub-answers.json``
(a list of {"match": TEXT, "answer": TEXT}) the first entry whose TEXT occurs in the prompt
gives the answer, written as vLLM's models are asked to (``... \\boxed{ANSWER}``); otherwise the
answer is 0. That file is how a test makes a "before" and an "after" model score differently.

Standard library only: it runs in any image with python3 (the simulation image has no vLLM).
rlbox passes this file's source as ``python3 -c SOURCE ARGS...``.
"""

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse(argv):
    p = argparse.ArgumentParser(prog="rlbox-stub-openai-server")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", "--served_model_name", nargs="+", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", "--max_model_len", type=int, default=None)
    args, _ignored = p.parse_known_args(argv)  # vLLM's other flags (TP, DP, memory, ...) mean nothing here
    return args


def answers(model):
    path = os.path.join(model, "rlbox-stub-answers.json")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def reply(table, prompt):
    for entry in table:
        if entry["match"] in prompt:
            return f"Working through it step by step (rlbox stub).\nThe answer is \\boxed{{{entry['answer']}}}."
    return "The rlbox stub knows no answer to this one. \\boxed{0}"


def main(argv):
    args = parse(argv)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        print(f"rlbox-stub: starting for model {args.model}", flush=True)
        print(f"ValueError: {args.model} has no config.json: not a Hugging Face model directory", flush=True)
        return 1
    name = (args.served_model_name or [args.model])[0]
    table = answers(args.model)
    max_len = args.max_model_len or 4096
    created = int(time.time())

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # one line per request, like uvicorn's access log
            print(f"INFO:     {self.client_address[0]} - \"{self.command} {self.path}\" {a[1] if len(a) > 1 else ''}", flush=True)

        def send(self, code, body):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self.send(200, None)
            if self.path == "/v1/models":
                return self.send(200, {"object": "list", "data": [{
                    "id": name, "object": "model", "created": created, "owned_by": "rlbox-stub",
                    "root": args.model, "parent": None, "max_model_len": max_len}]})
            return self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self.send(400, {"object": "error", "message": "body is not JSON", "code": 400})
            if body.get("model") not in (None, name):
                return self.send(404, {"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                                       "type": "NotFoundError", "code": 404})
            if self.path == "/v1/completions":
                prompt = body.get("prompt", "")
                prompt = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
                text = reply(table, prompt)
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
                kind = "text_completion"
            elif self.path == "/v1/chat/completions":
                prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
                text = reply(table, prompt)
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                kind = "chat.completion"
            else:
                return self.send(404, {"detail": "Not Found"})
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return self.send(200, {"id": f"cmpl-rlbox-{abs(hash(prompt)) % 10**12}", "object": kind,
                                   "created": int(time.time()), "model": name, "choices": [choice], "usage": usage})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"rlbox-stub: SIMULATED OpenAI server (no vLLM, no model loaded) for {args.model} as '{name}'", flush=True)
    print(f"INFO:     Uvicorn-style stand-in running on http://{args.host}:{args.port}", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
