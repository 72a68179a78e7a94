#!/usr/bin/env python3
"""tools/server_overhead.py - what dllm-server adds to a request over the library call it wraps (CPU backend).

    python3 tools/server_overhead.py [-m models/tiny-llada] [-t 1] [--requests 20] [--max-tokens 32]

The same text prompt, one request at a time through the server (POST /v1/completions, not streamed): the client's wall
time less the decoding's own (the response's dllm.wall_ms, the library's account of the generation), the server's
share of each request (issue target: at most 5 ms), as a median. Then the same prompt through the Python package in
this process (tokenize, then Context.generate) with the same model, threads and settings: its wall time beside the
server's, and the same text, or a failure. Needs build/dllm-server (./build.sh server) and build/libdllm.so.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import dllm  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the windowsill"


def start_server(args, log):
    cmd = [args.server, "-m", args.model, "--backend", "cpu", "-t", str(args.threads), "--host", "127.0.0.1", "--port",
           "0", "--max-batch", "1"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("dllm-server exited at start: see " + log.name)
        with open(log.name) as f:
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/", f.read())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("dllm-server did not start: see " + log.name)


def server_model(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port, timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def server_request(port, settings):
    body = dict(settings, prompt=PROMPT, stream=False)
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t0, out["dllm"]["wall_ms"] / 1e3, out["choices"][0]["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "tiny-llada"))
    ap.add_argument("-t", "--threads", type=int, default=1, help="CPU backend threads of both (default 1)")
    ap.add_argument("--requests", type=int, default=20, help="timed requests a side, after 2 untimed (default 20)")
    ap.add_argument("--max-tokens", type=int, default=32, help="gen_length, steps and block_length (default 32)")
    ap.add_argument("--server", default=os.path.join(ROOT, "build", "dllm-server"))
    args = ap.parse_args()
    n = args.max_tokens
    settings = {"max_tokens": n, "steps": n, "block_length": n, "temperature": 0}  # the model id added once known

    log = tempfile.NamedTemporaryFile("w+", prefix="server_overhead.", suffix=".log", delete=False)
    proc, port = start_server(args, log)
    try:
        settings["model"] = server_model(port)
        server_times, overheads, server_text = [], [], None
        for i in range(args.requests + 2):
            dt, decode, server_text = server_request(port, settings)
            if i >= 2:
                server_times.append(dt), overheads.append(dt - decode)
    finally:
        proc.terminate()
        proc.wait(60)

    with dllm.Model(args.model) as model, dllm.Context(model, backend="cpu", n_threads=args.threads) as ctx:
        ids = model.tokenizer.encode(PROMPT)
        lib_times, lib_text = [], None
        for i in range(args.requests + 2):
            t0 = time.perf_counter()
            out = ctx.generate(ids, gen_length=n, steps=n, block_length=n)
            dt = time.perf_counter() - t0
            lib_text = out.text
            if i >= 2:
                lib_times.append(dt)

    s, l = statistics.median(server_times), statistics.median(lib_times)
    print("model %s, %d thread(s), %d tokens, %d requests a side" % (args.model, args.threads, n, args.requests))
    print("server  request median %.2f ms (min %.2f)" % (1e3 * s, 1e3 * min(server_times)))
    print("library call    median %.2f ms (min %.2f)" % (1e3 * l, 1e3 * min(lib_times)))
    print("server's share of a request (wall less dllm.wall_ms) median %.2f ms, max %.2f (target <= 5 ms)" %
          (1e3 * statistics.median(overheads), 1e3 * max(overheads)))
    if server_text != lib_text:
        print("the two answers differ:\n  server:  %r\n  library: %r" % (server_text, lib_text))
        return 1
    os.unlink(log.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
