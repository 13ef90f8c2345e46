"""A scripted OpenAI-compatible chat endpoint on loopback, for the tests
of everything that talks to one (fixed judges, model defenders): every
POST is recorded and answered with the same canned reply."""
from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer


class ChatEndpoint:
    def __init__(self, reply: str, status: int = 200):
        self.reply, self.status = reply, status
        self.seen: list[dict] = []  # {"path", "auth", "body"} per request

    @contextlib.contextmanager
    def serving(self):
        """The endpoint's base URL (`http://127.0.0.1:PORT/v1`) while it runs."""
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                if endpoint.status != 200:
                    self.send_response(endpoint.status)
                    self.end_headers()
                    return
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": endpoint.reply}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        finally:
            server.shutdown()
            server.server_close()

    @property
    def bodies(self) -> list[dict]:
        return [s["body"] for s in self.seen]


# the endpoint judge the tests share (conftest's `endpoint` fixture serves it)
CANNED = ChatEndpoint("Label: negative")
