"""A scripted OpenAI-compatible chat server, run as a separate process by the tests.

It is a real HTTP server speaking the ``/v1/chat/completions`` protocol, but its answers come from a
script instead of a model, so the pre-pass's retry, validation, fallback and caching paths can be
tested deterministically (the real-model path is tested against vLLM's own server). Behaviour by
the task id found in the user message:

- a task id ending in ``-task_1``: first answer references an unknown operation, the retry answer
  is valid;
- ending in ``-task_2``: always truncated JSON;
- otherwise: a valid answer at once.

Playing a simulated user (``actors.user_sim``) when the request's model starts with
``scripted-user``: the script is chosen by the first key of the user-script file (argument 2, a
JSON object: key -> lines) found in the system prompt (which holds the user's instruction), and
the answer is line ``n`` for a request holding ``n`` earlier lines of the user (its
``assistant`` messages), then ``###STOP###``. Model ``scripted-user-flaky`` answers the first of
each distinct request (messages and seed) with HTTP 503 (the client's retry sends it again); ``scripted-user-refused``
answers HTTP 400 (a permanent refusal).

``GET /stats`` returns ``{"requests": N, "response_formats": [...], "user_requests": N,
"user_seeds": [...], "user_failed": N}``.

Usage: python scripted_openai_server.py PORT [USER_SCRIPT.json]
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VALID = {"operations": [{"op_id": "op1", "type": "lookup", "tool": "find", "entity": "record"},
                        {"op_id": "op2", "type": "update", "depends_on": ["op1"]}],
         "gates": [{"gate_id": "g1", "kind": "identifier_resolution",
                    "provenance": "unique_lookup", "requires": "record id", "blocks": ["op2"]}],
         "dependencies": [{"source": "op1", "target": "op2"}], "reward_groups": [],
         "conflicts": []}
BROKEN_REF = {**VALID, "dependencies": [{"source": "op9", "target": "op2"}]}
STATS = {"requests": 0, "response_formats": [], "user_requests": 0, "user_seeds": [],
         "user_failed": 0}
SEEN: dict = {}
USER_SCRIPTS: dict = {}
FAILED_ONCE: set = set()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, payload):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/stats"):
            self._send(200, STATS)
        else:
            self._send(200, {"object": "list", "data": [{"id": "scripted"}]})

    def _reply(self, req, content):
        self._send(200, {"id": "x", "object": "chat.completion", "model": req["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": len(content.split()),
                                   "total_tokens": 1 + len(content.split())}})

    def _user(self, req):
        STATS["user_requests"] += 1
        if req["model"].endswith("-refused"):
            self._send(400, {"error": {"message": f"model {req['model']} does not exist"}})
            return
        key = json.dumps([req["messages"], req.get("seed")])
        if req["model"].endswith("-flaky") and key not in FAILED_ONCE:
            FAILED_ONCE.add(key)
            STATS["user_failed"] += 1
            self._send(503, {"error": {"message": "overloaded, try again"}})
            return
        STATS["user_seeds"].append(req.get("seed"))
        system = req["messages"][0]["content"]
        script = next((lines for key, lines in USER_SCRIPTS.items() if key in system), [])
        n = sum(m["role"] == "assistant" for m in req["messages"])
        self._reply(req, script[n] if n < len(script) else "###STOP###")

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        STATS["requests"] += 1
        if req["model"].startswith("scripted-user"):
            self._user(req)
            return
        STATS["response_formats"].append(req.get("response_format", {}).get("type"))
        task_id = json.loads(req["messages"][1]["content"])["task"]["task_id"]
        n = SEEN[task_id] = SEEN.get(task_id, 0) + 1
        if task_id.endswith("-task_1"):
            content = json.dumps(BROKEN_REF if n == 1 else VALID)
        elif task_id.endswith("-task_2"):
            content = json.dumps(VALID)[:40]
        else:
            content = json.dumps(VALID)
        self._reply(req, content)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        with open(sys.argv[2], encoding="utf-8") as f:
            USER_SCRIPTS.update(json.load(f))
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
