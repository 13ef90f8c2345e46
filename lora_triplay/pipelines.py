"""Serve a game's multi-agent protocol as one model name (`serve` for games
with `pipelines`, e.g. WaltzRL's answer -> feedback -> revision).

A small proxy in front of vLLM's OpenAI-compatible server: a chat request
whose `model` is one of the game's pipelines is run by the game, which
calls vLLM once per agent turn (each agent a LoRA module there); anything
else is passed through unchanged. The reply is an OpenAI chat completion
whose message is the protocol's final answer, with the turns under the
pipeline's name. Pipelines answer without streaming.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

Chat = Callable[..., str]  # chat(model, messages, max_tokens=..., temperature=..., prefix="") -> text


def upstream_chat(base_url: str, timeout: float = 600.0) -> Chat:
    """One chat turn against the upstream server; `prefix`: the answer's
    forced start (vLLM's continue_final_message), returned without it."""

    def chat(model: str, messages: list[dict], max_tokens: int = 256, temperature: float = 0.0, prefix: str = "") -> str:
        body: dict = {"model": model, "messages": list(messages), "max_tokens": max_tokens, "temperature": temperature}
        if prefix:
            body["messages"] = body["messages"] + [{"role": "assistant", "content": prefix}]
            body.update(continue_final_message=True, add_generation_prompt=False)
        req = urllib.request.Request(f"{base_url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = json.loads(resp.read())["choices"][0]["message"]["content"] or ""
        return text[len(prefix):] if prefix and text.startswith(prefix) else text

    return chat


def make_proxy(host: str, port: int, upstream: str, pipelines: dict[str, Callable[[Chat, dict], dict]]) -> ThreadingHTTPServer:
    """The proxy server (not started): `pipelines[name](chat, request body)`
    returns {"content": final answer, "turns": {...}}."""
    chat = upstream_chat(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # vLLM logs the requests
            pass

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self, body: bytes | None) -> None:
            req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                         headers={k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")})
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    data, code, ctype = resp.read(), resp.status, resp.headers.get("Content-Type", "application/json")
            except urllib.error.HTTPError as err:
                data, code, ctype = err.read(), err.code, err.headers.get("Content-Type", "application/json")
            except urllib.error.URLError as err:
                data, code, ctype = json.dumps({"error": f"upstream vLLM not reachable: {err.reason}"}).encode(), 502, "application/json"
            if self.path.rstrip("/") == "/v1/models" and code == 200:
                listed = json.loads(data)
                listed["data"] += [{"id": name, "object": "model", "owned_by": "lora-triplay"} for name in pipelines]
                data = json.dumps(listed).encode()
            self._send(code, data, ctype)

        def do_GET(self):
            self._forward(None)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                request = json.loads(body or b"{}")
            except json.JSONDecodeError:
                request = {}
            name = request.get("model") if self.path.rstrip("/") == "/v1/chat/completions" else None
            if name not in pipelines:
                self._forward(body)
                return
            try:
                out = pipelines[name](chat, request)
            except (urllib.error.URLError, KeyError, ValueError) as err:
                self._send(502, json.dumps({"error": f"pipeline {name}: {err}"}).encode())
                return
            reply = {"id": f"chatcmpl-{name}-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()), "model": name,
                     "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": out["content"]}}],
                     name: out["turns"]}
            self._send(200, json.dumps(reply).encode())

    return ThreadingHTTPServer((host, port), Handler)


def start_proxy(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread
