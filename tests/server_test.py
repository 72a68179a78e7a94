#!/usr/bin/env python3
"""tests/server_test.py - dllm-server end to end, on the CPU backend with models/tiny-llada.

    python3 tests/server_test.py              (after ./build.sh and examples/server/build.sh)
    DLLM_SERVER_BIN=build/dllm-server-asan python3 tests/server_test.py     (the same under ASan)

Starts the server on a free loopback port and talks to it through urllib, http.client and (when importable) the
official `openai` package: plain and streaming chat and completions, /v1/models, /health, the canvas page and its
per-step events, OpenAI-style errors (bad JSON, wrong types, unknown model, oversized body, bad key, limits), a
bounded concurrent load with clients that leave early, and a clean SIGTERM. Every answer is compared with what
`dllm-generate` prints for the same prompt and settings. Stdlib only (plus openai when present). The last line is
"N passed, N failed, N skipped"; the exit status is non-zero on any failure.

Environment: DLLM_SERVER_BIN (default build/dllm-server), DLLM_GENERATE_BIN (default build/dllm-generate),
DLLM_TEST_MODEL (default models/tiny-llada).
"""
import base64
import http.client
import json
import shutil
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_BIN = os.environ.get("DLLM_SERVER_BIN", os.path.join(ROOT, "build", "dllm-server"))
GENERATE_BIN = os.environ.get("DLLM_GENERATE_BIN", os.path.join(ROOT, "build", "dllm-generate"))
MODEL = os.environ.get("DLLM_TEST_MODEL", os.path.join(ROOT, "models", "tiny-llada"))
MODEL_ID = os.path.basename(os.path.normpath(MODEL))
API_KEY = "test-key-123"

try:
    import openai  # noqa: F401
    HAVE_OPENAI = True
except ImportError:
    HAVE_OPENAI = False


class Server:
    """One dllm-server process on a port the OS picked (--port 0; the port is read from its first line)."""

    def __init__(self, *extra):
        self.log_path = os.path.join("/tmp", "dllm-server-test-%d-%d.log" % (os.getpid(), random.randrange(1 << 30)))
        self.log = open(self.log_path, "w+")
        cmd = [SERVER_BIN, "-m", MODEL, "--backend", "cpu", "--host", "127.0.0.1", "--port", "0"] + list(extra)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("dllm-server exited at start:\n" + self.output())
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/", self.output())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("dllm-server did not start:\n" + self.output())

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout=60):
        """SIGTERM, then the exit status (killed after timeout: a hang is a failure of its own)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode

    def close(self):
        """Stops the server; an exit status other than 0 or a sanitizer report is a failure of the run."""
        rc = self.stop()
        out = self.output()
        if rc != 0 or "Sanitizer" in out or "runtime error:" in out:
            SERVER_PROBLEMS.append("dllm-server exited with %s:\n%s" % (rc, out[-4000:]))
        self.log.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    # ---- requests ----

    def request(self, method, path, body=None, key=API_KEY, raw=None, timeout=120):
        """(status, parsed JSON or text) of one request; raw sends bytes as they are."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, payload, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, payload, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
        return status, (json.loads(payload) if "json" in ctype else payload.decode())

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, path, body, key=API_KEY, timeout=120):
        """(status, [events]) of a streaming request: each event the parsed JSON of a data line, "[DONE]" as is."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", "Authorization": "Bearer " + key})
            r = conn.getresponse()
            if r.status != 200:
                return r.status, [json.loads(r.read())]
            assert r.getheader("Content-Type").startswith("text/event-stream"), r.getheader("Content-Type")
            events = []
            for line in r:
                line = line.decode().rstrip("\r\n")
                if line.startswith("data: "):
                    events.append("[DONE]" if line[6:] == "[DONE]" else json.loads(line[6:]))
                else:
                    assert line == "", "not an SSE data line: %r" % line
            return r.status, events
        finally:
            conn.close()


SERVER_PROBLEMS = []  # servers that did not stop cleanly (counted as failures at the end)
_cli_cache = {}
_cli_lock = threading.Lock()


def cli_answer(prompt, n, raw=False, extra=()):
    """dllm-generate's answer text (and its JSON) for a prompt: the reference every server answer must equal."""
    key = (prompt, n, raw, tuple(extra))
    with _cli_lock:
        if key in _cli_cache:
            return _cli_cache[key]
    cmd = [GENERATE_BIN, "-m", MODEL, "--backend", "cpu", "-n", str(n), "--json"] + (["--raw"] if raw else []) + list(extra) + ["-p", prompt]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("dllm-generate failed: %s\n%s" % (" ".join(cmd), out.stderr))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    with _cli_lock:
        _cli_cache[key] = result
    return result


def chat_body(prompt, max_tokens, **kw):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    body.update(kw)
    return body


def stream_text(events, chat=True):
    """The answer a stream carries, checked to be well formed: one choice 0, content deltas, a finish chunk, [DONE]."""
    assert events and events[-1] == "[DONE]", "the stream does not end with [DONE]"
    text, finish = "", None
    for e in events[:-1]:
        if "error" in e:
            raise AssertionError("error event in the stream: %r" % e)
        if e.get("object") == "dllm.canvas":
            continue
        assert e["object"] == ("chat.completion.chunk" if chat else "text_completion"), e
        for c in e["choices"]:
            assert c["index"] == 0
            assert finish is None, "a chunk after the finish chunk"
            text += (c["delta"].get("content") or "") if chat else c["text"]
            finish = c["finish_reason"]
    assert finish in ("stop", "length"), "no finish_reason"
    return text


def check_error(test, status, body, want_status, param=None):
    test.assertEqual(status, want_status, body)
    test.assertIsInstance(body, dict, body)
    err = body.get("error")
    test.assertIsInstance(err, dict, body)
    for k in ("message", "type", "param", "code"):
        test.assertIn(k, err)
    test.assertTrue(err["message"])
    if param is not None:
        test.assertEqual(err["param"], param, body)


class ServerTest(unittest.TestCase):
    """One server for the functional tests, the errors and the load."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("--api-key", API_KEY, "--max-batch", "4", "--max-queue", "32", "--max-body", "65536", "--max-tokens", "64")

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    # ---- the endpoints ----

    def test_health(self):
        status, body = self.srv.request("GET", "/health", key=None)
        self.assertEqual(status, 200)
        self.assertEqual(body["status"], "ok")
        self.assertEqual(body["model"], MODEL_ID)

    def test_models(self):
        status, body = self.srv.request("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(body["object"], "list")
        self.assertEqual([m["id"] for m in body["data"]], [MODEL_ID])
        status, body = self.srv.request("GET", "/v1/models/" + MODEL_ID)
        self.assertEqual((status, body["id"]), (200, MODEL_ID))
        status, body = self.srv.request("GET", "/v1/models/no-such-model")
        check_error(self, status, body, 404)

    def test_chat(self):
        status, body = self.srv.post("/v1/chat/completions", chat_body("Tell me a story.", 16))
        self.assertEqual(status, 200, body)
        ref = cli_answer("Tell me a story.", 16)
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(body["model"], MODEL_ID)
        self.assertEqual(body["choices"][0]["message"], {"role": "assistant", "content": ref["text"]})
        self.assertIn(body["choices"][0]["finish_reason"], ("stop", "length"))
        usage = body["usage"]
        self.assertEqual(usage["prompt_tokens"], ref["stats"]["n_prompt"])
        self.assertEqual(usage["completion_tokens"], ref["stats"]["n_generated"])
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])

    def test_chat_stream(self):
        status, events = self.srv.stream("/v1/chat/completions", chat_body("Tell me a story.", 16, stream=True, stream_options={"include_usage": True}))
        self.assertEqual(status, 200)
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        usage = events[-2]["usage"]
        self.assertEqual(events[-2]["choices"], [])
        self.assertEqual(stream_text(events[:-2] + ["[DONE]"]), cli_answer("Tell me a story.", 16)["text"])
        self.assertEqual(usage["completion_tokens"], cli_answer("Tell me a story.", 16)["stats"]["n_generated"])
        self.assertGreater(len(events), 4, "the answer came in one piece: nothing streamed per step")

    def test_completions(self):
        status, body = self.srv.post("/v1/completions", {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 12})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "text_completion")
        ref = cli_answer("Once upon a time", 12, raw=True)
        self.assertEqual(body["choices"][0]["text"], ref["text"])
        self.assertEqual(body["usage"]["prompt_tokens"], ref["stats"]["n_prompt"])
        status, events = self.srv.stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12, "stream": True})
        self.assertEqual(status, 200)
        self.assertEqual(stream_text(events, chat=False), ref["text"])

    def test_completions_token_ids(self):
        ids = cli_answer("Once upon a time", 12, raw=True)  # the same prompt as ids: the same answer
        status, body = self.srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["usage"]["prompt_tokens"], ids["stats"]["n_prompt"])
        status, body2 = self.srv.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4})
        self.assertEqual(status, 200, body2)
        self.assertEqual(body2["usage"]["prompt_tokens"], 3)

    def test_dllm_settings(self):
        """dllm's own fields under the CLI's names: the answer equals the CLI's with the same flags."""
        body = chat_body("Why is the sky blue?", 16, steps=8, block_length=8, stop=["\n"])
        status, got = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, got)
        ref = cli_answer("Why is the sky blue?", 16, extra=("--steps", "8", "--block", "8", "--stop", "\n"))
        self.assertEqual(got["choices"][0]["message"]["content"], ref["text"])
        body = chat_body("Why is the sky blue?", 16, threshold=0.5, cache="dual")
        status, got = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, got)
        ref = cli_answer("Why is the sky blue?", 16, extra=("--threshold", "0.5", "--cache", "dual"))
        self.assertEqual(got["choices"][0]["message"]["content"], ref["text"])
        body = chat_body("Why is the sky blue?", 8, temperature=0.8, seed=7)
        status, got = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, got)
        ref = cli_answer("Why is the sky blue?", 8, extra=("--temp", "0.8", "--seed", "7"))
        self.assertEqual(got["choices"][0]["message"]["content"], ref["text"])

    def test_stop_string(self):
        ref_full = cli_answer("Once upon a time", 24, raw=True)["text"]
        stop = ref_full[4:7] if len(ref_full) >= 7 else ref_full[-2:]
        ref = cli_answer("Once upon a time", 24, raw=True, extra=("--stop", stop))
        status, body = self.srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "stop": stop})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["choices"][0]["text"], ref["text"])
        self.assertEqual(body["choices"][0]["finish_reason"], "stop")
        status, events = self.srv.stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "stop": [stop], "stream": True})
        self.assertEqual(stream_text(events, chat=False), ref["text"])

    def test_n_choices(self):
        status, body = self.srv.post("/v1/chat/completions", chat_body("Hello", 8, n=2))
        self.assertEqual(status, 200, body)
        ref = cli_answer("Hello", 8)["text"]
        self.assertEqual([c["index"] for c in body["choices"]], [0, 1])
        self.assertEqual([c["message"]["content"] for c in body["choices"]], [ref, ref])

    def test_canvas(self):
        status, page = self.srv.request("GET", "/", key=None)
        self.assertEqual(status, 200)
        self.assertIn("<html", page.lower())
        self.assertIn("dllm_canvas", page)
        status, events = self.srv.stream("/v1/chat/completions", chat_body("Hello", 16, stream=True, dllm_canvas=True, steps=8))
        self.assertEqual(status, 200)
        canvas = [e for e in events if e != "[DONE]" and e.get("object") == "dllm.canvas"]
        self.assertEqual(len(canvas), 8, "one canvas event a step")
        for e in canvas:
            self.assertEqual(len(e["tokens"]), 16)
            self.assertEqual(e["n_masked"], sum(t is None for t in e["tokens"]))
            for p in e["committed"]:
                self.assertIsNotNone(e["tokens"][p])
        self.assertEqual(canvas[0]["n_masked"], 14)  # 2 tokens a step
        self.assertEqual(canvas[-1]["n_masked"], 0)
        self.assertEqual(stream_text(events), cli_answer("Hello", 16, extra=("--steps", "8"))["text"])

    def test_join_mid_run(self):
        """A request that arrives while a long one is mid-run joins the running batch at the next step (it does not
        wait for the long one to end): the short one finishes first, and both answers equal dllm-generate's."""
        long_ref = cli_answer("Tell me a story.", 64, extra=("--no-early-stop",))["text"]
        short_ref = cli_answer("Hello", 8)["text"]
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=120)
        short = {}

        def run_short():
            status, events = self.srv.stream("/v1/chat/completions", chat_body("Hello", 8, stream=True))
            short["done"], short["status"], short["events"] = time.monotonic(), status, events

        try:  # 64 steps, one token each: the long one is still decoding when the short one arrives after its third
            conn.request("POST", "/v1/chat/completions", json.dumps(chat_body("Tell me a story.", 64, stream=True, early_stop=False, dllm_canvas=True)),
                         {"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            events, steps, steps_at_join, last_step, thread = [], 0, None, None, None
            for line in r:
                line = line.decode().rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                event = "[DONE]" if line[6:] == "[DONE]" else json.loads(line[6:])
                events.append(event)
                if event != "[DONE]" and event.get("object") == "dllm.canvas":
                    steps += 1
                    last_step = time.monotonic()
                    if steps == 3:
                        steps_at_join = steps
                        thread = threading.Thread(target=run_short)
                        thread.start()
        finally:
            conn.close()
        self.assertIsNotNone(thread, "the long request ended before its third step")
        thread.join(120)
        self.assertEqual(steps, 64, "one canvas event a step")
        self.assertEqual(steps_at_join, 3)
        self.assertEqual(short.get("status"), 200, short)
        self.assertEqual(stream_text(short["events"]), short_ref)
        self.assertEqual(stream_text(events), long_ref)
        self.assertLess(short["done"], last_step, "the short request waited for the long one to end instead of joining it")

    # ---- the official client ----

    @unittest.skipUnless(HAVE_OPENAI, "the openai package is not installed (pip install openai)")
    def test_openai_client(self):
        client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % self.srv.port, api_key=API_KEY, max_retries=0)
        self.assertEqual([m.id for m in client.models.list()], [MODEL_ID])
        ref = cli_answer("Tell me a story.", 16)["text"]
        r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16)
        self.assertEqual(r.choices[0].message.content, ref)
        self.assertEqual(r.usage.completion_tokens, cli_answer("Tell me a story.", 16)["stats"]["n_generated"])
        chunks = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16,
                                                stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), ref)
        ref = cli_answer("Once upon a time", 12, raw=True)["text"]
        r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12)
        self.assertEqual(r.choices[0].text, ref)
        r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, stream=True)
        self.assertEqual("".join(c.choices[0].text for c in r), ref)
        # dllm's own fields through extra_body
        r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hello"}], max_tokens=16,
                                           extra_body={"steps": 8})
        self.assertEqual(r.choices[0].message.content, cli_answer("Hello", 16, extra=("--steps", "8"))["text"])
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % self.srv.port, api_key="wrong", max_retries=0).models.list()
        with self.assertRaises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        with self.assertRaises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=1000)

    # ---- errors ----

    def test_bad_json(self):
        for raw in (b"{", b"not json", b"", b"[1, 2", b"\xff\xfe"):
            status, body = self.srv.request("POST", "/v1/chat/completions", raw=raw)
            check_error(self, status, body, 400)
        status, body = self.srv.request("POST", "/v1/completions", raw=b"[]")
        check_error(self, status, body, 400)

    def test_wrong_types(self):
        cases = [
            ({"messages": "hi"}, "messages"), ({"messages": []}, "messages"), ({"messages": [{"role": 1, "content": "x"}]}, "messages"),
            ({"messages": [{"role": "robot", "content": "x"}]}, "messages"), ({"messages": [{"role": "user", "content": 5}]}, "messages"),
            (chat_body("x", "8"), "max_tokens"), (chat_body("x", 8.5), "max_tokens"), (chat_body("x", 0), "max_tokens"),
            (chat_body("x", 8, temperature="hot"), "temperature"), (chat_body("x", 8, stream="yes"), "stream"),
            (chat_body("x", 8, stop=[1]), "stop"), (chat_body("x", 8, seed="s"), "seed"), (chat_body("x", 8, n=0), "n"),
            (chat_body("x", 8, top_p=2), "top_p"), (chat_body("x", 8, cache="sometimes"), "cache"), (chat_body("x", 8, remasking="best"), "remasking"),
            (chat_body("x", 8, steps=-1), "steps"), (chat_body("x", 8, block_length=3), "block_length"), (chat_body("x", 8, block_length=4, steps=3), "steps"),
            (chat_body("x", 8, threshold=1.5), "threshold"), (chat_body("x", 8, presence_penalty=1), "presence_penalty"),
            (chat_body("x", 8, logprobs=True), "logprobs"), (chat_body("x", 8, dllm_canvas=True), "dllm_canvas"),
            (chat_body("x", 1000), "max_tokens"), (chat_body("x", 8, n=100), "n"), (chat_body("x", 8, model=5), "model"),
        ]
        for body, param in cases:
            status, got = self.srv.post("/v1/chat/completions", body)
            check_error(self, status, got, 400, param)
        status, got = self.srv.post("/v1/completions", {"prompt": {"a": 1}})
        check_error(self, status, got, 400, "prompt")
        status, got = self.srv.post("/v1/completions", {"prompt": [1, -2]})
        check_error(self, status, got, 400, "prompt")
        status, got = self.srv.post("/v1/completions", {"max_tokens": 4})
        check_error(self, status, got, 400, "prompt")

    def test_unknown_model(self):
        status, body = self.srv.post("/v1/chat/completions", chat_body("x", 8, model="gpt-4"))
        check_error(self, status, body, 404, "model")
        self.assertEqual(body["error"]["code"], "model_not_found")

    def test_oversized_body(self):
        big = json.dumps(chat_body("x" * 200000, 8)).encode()
        status, body = self.srv.request("POST", "/v1/chat/completions", raw=big)
        check_error(self, status, body, 413)
        status, body = self.srv.post("/v1/chat/completions", chat_body("word " * 400, 8))  # fits the body, not the context
        check_error(self, status, body, 400, "max_tokens")
        self.assertEqual(body["error"]["code"], "context_length_exceeded")

    def test_api_key(self):
        for key in (None, "wrong", API_KEY + "x", API_KEY[:-1]):
            status, body = self.srv.post("/v1/chat/completions", chat_body("x", 8), key=key)
            check_error(self, status, body, 401)
            self.assertEqual(body["error"]["code"], "invalid_api_key")
            status, body = self.srv.request("GET", "/v1/models", key=key)
            check_error(self, status, body, 401)

    def test_routes(self):
        status, body = self.srv.request("GET", "/v1/nothing")
        check_error(self, status, body, 404)
        status, body = self.srv.request("GET", "/v1/chat/completions")
        check_error(self, status, body, 405)
        status, body = self.srv.request("DELETE", "/health")
        check_error(self, status, body, 405)

    # ---- load ----

    def test_zz_concurrent_load(self):
        """4 clients x 5 requests of random short lengths, streaming or not, some leaving early; every finished answer
        complete, well formed and equal to dllm-generate's; the server healthy and idle afterwards."""
        prompts = ["Tell me a story.", "Hello", "Why is the sky blue?", "What is 2 + 2?", "Name a color."]
        rng = random.Random(42)
        plan = [[(rng.choice(prompts), rng.choice([4, 8, 12, 16]), rng.random() < 0.5, rng.random() < 0.2) for _ in range(5)] for _ in range(4)]
        for client in plan:  # the references first: the CLI competes for the CPU otherwise
            for prompt, n, _, _ in client:
                cli_answer(prompt, n)
        failures = []

        def run_client(index, requests):
            for prompt, n, streaming, leave_early in requests:
                try:
                    if leave_early:  # a streaming client that reads one event and hangs up
                        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=120)
                        conn.request("POST", "/v1/chat/completions", json.dumps(chat_body(prompt, 64, stream=True)),
                                     {"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
                        r = conn.getresponse()
                        r.fp.readline()
                        conn.sock.shutdown(socket.SHUT_RDWR)
                        conn.close()
                        continue
                    want = cli_answer(prompt, n)["text"]
                    if streaming:
                        status, events = self.srv.stream("/v1/chat/completions", chat_body(prompt, n, stream=True))
                        got = stream_text(events) if status == 200 else events
                    else:
                        status, body = self.srv.post("/v1/chat/completions", chat_body(prompt, n))
                        got = body["choices"][0]["message"]["content"] if status == 200 else body
                        if status == 200:
                            assert body["usage"]["completion_tokens"] == cli_answer(prompt, n)["stats"]["n_generated"]
                    if status != 200 or got != want:
                        failures.append("client %d %r n=%d stream=%s: %d %r != %r" % (index, prompt, n, streaming, status, got, want))
                except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the other clients
                    failures.append("client %d %r n=%d: %r" % (index, prompt, n, e))

        threads = [threading.Thread(target=run_client, args=(i, reqs)) for i, reqs in enumerate(plan)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        self.assertEqual(failures, [])
        deadline = time.time() + 30  # the early leavers' sequences are cancelled at their next step
        while True:
            status, health = self.srv.request("GET", "/health", key=None)
            self.assertEqual(status, 200)
            if (health["waiting"], health["running"], health["streams"]) == (0, 0, 0) or time.time() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual((health["waiting"], health["running"], health["streams"]), (0, 0, 0), health)


def find_chromium():
    """(chromedriver, chromium) paths, or None: the page test needs Debian's chromium and chromium-driver."""
    driver = shutil.which("chromedriver")
    browser = next((b for b in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if b), None)
    return (driver, browser) if driver and browser else None


class CanvasPageTest(unittest.TestCase):
    """The canvas page in a real headless Chromium, driven through chromedriver's WebDriver HTTP API (urllib only):
    the page loads, a prompt is sent, placeholders appear and are replaced, the final text equals the API's. Writes
    build/server-canvas.png."""

    def webdriver(self, method, path, body=None):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.driver_port, path), method=method,
                                     data=json.dumps(body).encode() if body is not None else None, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["value"]

    def script(self, code, *args):
        return self.webdriver("POST", "/session/%s/execute/sync" % self.session, {"script": code, "args": list(args)})

    @unittest.skipUnless(find_chromium(), "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    def test_canvas_in_chromium(self):
        driver, browser = find_chromium()
        srv = Server("--api-key", API_KEY)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.driver_port = s.getsockname()[1]
        chromedriver = subprocess.Popen([driver, "--port=%d" % self.driver_port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 30
            while True:
                try:
                    if self.webdriver("GET", "/status")["ready"]:
                        break
                except OSError:
                    pass
                if time.time() > deadline:
                    self.fail("chromedriver did not start")
                time.sleep(0.1)
            options = {"binary": browser, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,900"]}
            self.session = self.webdriver("POST", "/session", {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}})["sessionId"]
            try:
                self.webdriver("POST", "/session/%s/url" % self.session, {"url": "http://127.0.0.1:%d/" % srv.port})
                self.assertEqual(self.script("return document.title;"), "dllm canvas")
                # watch the canvas: the most placeholders seen at once, and whether a step showed tokens beside masks
                self.script("""
                    window.__maxMasks = 0; window.__mixed = false;
                    const canvas = document.getElementById('canvas');
                    new MutationObserver(() => {
                      const masks = canvas.querySelectorAll('.tok.mask').length, all = canvas.querySelectorAll('.tok').length;
                      window.__maxMasks = Math.max(window.__maxMasks, masks);
                      if (masks > 0 && masks < all) window.__mixed = true;
                    }).observe(canvas, {subtree: true, childList: true, attributes: true});
                    document.getElementById('prompt').value = arguments[0];
                    document.getElementById('max_tokens').value = '16';
                    document.getElementById('steps').value = '8';
                    document.getElementById('api_key').value = arguments[1];
                    document.getElementById('go').click();""", "Hello", API_KEY)
                deadline = time.time() + 120
                while not self.script("return document.body.dataset.done || '';"):
                    self.assertLess(time.time(), deadline, "the page did not finish")
                    time.sleep(0.2)
                state = self.script("""return {done: document.body.dataset.done, answer: document.getElementById('answer').textContent,
                    masks: document.querySelectorAll('#canvas .tok.mask').length, tokens: document.querySelectorAll('#canvas .tok').length,
                    maxMasks: window.__maxMasks, mixed: window.__mixed, status: document.getElementById('status').textContent};""")
                self.assertEqual(state["done"], "1", state)
                self.assertEqual(state["tokens"], 16, state)
                self.assertGreaterEqual(state["maxMasks"], 14, "no placeholders were drawn: %r" % state)
                self.assertTrue(state["mixed"], "no step showed tokens among placeholders: %r" % state)
                self.assertEqual(state["masks"], 0, "placeholders left at the end: %r" % state)
                status, body = srv.post("/v1/chat/completions", chat_body("Hello", 16, steps=8))
                self.assertEqual(state["answer"], body["choices"][0]["message"]["content"])
                png = base64.b64decode(self.webdriver("GET", "/session/%s/screenshot" % self.session))
                os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
                with open(os.path.join(ROOT, "build", "server-canvas.png"), "wb") as f:
                    f.write(png)
            finally:
                self.webdriver("DELETE", "/session/%s" % self.session)
        finally:
            chromedriver.terminate()
            chromedriver.wait(30)
            srv.close()


class LimitsAndShutdownTest(unittest.TestCase):
    """A server with tiny limits: queue and stream limits answer 429; SIGTERM drains the request in flight."""

    def test_option_values_are_checked(self):
        for option, value in (("--max-fill-rows", "-1"), ("--max-fill-rows", "many"), ("--max-batch", "0")):
            out = subprocess.run([SERVER_BIN, "-m", MODEL, "--backend", "cpu", "--port", "0", option, value],
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn(option + " must be in", out.stderr)

    def test_limits_and_sigterm(self):
        srv = Server("--max-batch", "1", "--max-queue", "1", "--max-streams", "1", "--drain-timeout", "60")
        try:
            results = {}

            def long_stream():
                results["stream"] = srv.stream("/v1/chat/completions", chat_body("Tell me a story.", 64, stream=True))

            t = threading.Thread(target=long_stream)
            t.start()
            deadline = time.time() + 30
            while srv.request("GET", "/health")[1]["running"] == 0 and time.time() < deadline:
                time.sleep(0.02)
            # a second stream while one is open: 429
            status, events = srv.stream("/v1/chat/completions", chat_body("Hello", 8, stream=True))
            check_error(self, status, events[0], 429)
            # one sequence may wait; the next is refused
            queued = threading.Thread(target=lambda: results.__setitem__("queued", srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 8})))
            queued.start()
            while srv.request("GET", "/health")[1]["waiting"] == 0 and time.time() < deadline:
                time.sleep(0.02)
            status, body = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 8})
            check_error(self, status, body, 429)
            self.assertEqual(body["error"]["code"], "queue_full")
            # SIGTERM with both in flight: each finishes whole, then the server exits 0
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            status, body = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 8})
            check_error(self, status, body, 503)
            t.join(120)
            queued.join(120)
            status, events = results["stream"]
            self.assertEqual(status, 200)
            self.assertEqual(stream_text(events), cli_answer("Tell me a story.", 64)["text"])
            status, body = results["queued"]
            self.assertEqual((status, body["choices"][0]["text"]), (200, cli_answer("Hi", 8, raw=True)["text"]))
            self.assertEqual(srv.stop(timeout=60), 0, srv.output())
            self.assertIn("stopped", srv.output())
        finally:
            srv.close()


class ServeBenchTest(unittest.TestCase):
    """tools/serve_bench.py (the serving benchmark for the GPU) end to end on the CPU with small sizes, and --random-weights with
    the stand-in tokenizer it writes: the programs take it, and run it where a GPU is (on the CPU they say it needs one)."""

    def test_serve_bench_runs_on_the_cpu(self):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "serve_bench.py"), "-m", MODEL, "--backend", "cpu", "--clients", "2",
                              "--prompt-tokens", "40", "--max-tokens", "16", "--solo-runs", "1", "--max-fill-rows", "1"],
                             capture_output=True, text=True, timeout=600)  # one fill a step: the others wait, same answers
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        for row in ("ratio server / CLI batch", "ratio late / (prefill + 2 steps)", "ratio alone / CLI solo"):
            self.assertRegex(out.stdout, r"\| +%s +\| [0-9.]+ " % re.escape(row))
        self.assertRegex(out.stdout, r"answers equal to dllm-generate's +\| 2 of 2 ")
        self.assertRegex(out.stdout, r"alone answer equal to dllm-generate's +\| yes ")

    def test_random_weights_with_a_stand_in_tokenizer(self):
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import serve_bench  # noqa: E402 - the tool is a script, imported for its stand-in writer
        work = tempfile.mkdtemp(prefix="dllm-random-")
        try:
            model_dir, _ = serve_bench.random_weights_dir(os.path.join(MODEL, "config.json"), work)
            out = subprocess.run([GENERATE_BIN, "--random-weights", model_dir, "-p", "hi", "-n", "8"], capture_output=True, text=True, timeout=300)
            if out.returncode != 0:  # no GPU: refused after the model and the tokenizer loaded, naming the flag
                self.assertEqual(out.returncode, 1, out.stderr)
                self.assertIn("--random-weights needs a GPU", out.stderr)
            out = subprocess.run([GENERATE_BIN, "-m", MODEL, "--random-weights", model_dir, "-p", "hi"], capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 1)
            self.assertIn("-m and --random-weights both name the model", out.stderr)
            server = subprocess.run([SERVER_BIN, "--random-weights", model_dir, "--backend", "cpu", "--port", "0"], capture_output=True, text=True, timeout=60)
            self.assertEqual(server.returncode, 1)
            self.assertIn("--random-weights needs a GPU", server.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def main():
    for path, what in ((SERVER_BIN, "examples/server/build.sh"), (GENERATE_BIN, "./build.sh")):
        if not os.access(path, os.X_OK):
            print("server_test: %s is missing: build it with %s" % (path, what))
            print("0 passed, 1 failed, 0 skipped")
            return 1
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    for problem in SERVER_PROBLEMS:
        print("FAIL: " + problem)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses) + len(SERVER_PROBLEMS)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped - len(result.expectedFailures)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
