#!/usr/bin/env python3
"""tools/serve_bench.py - dllm-server under load beside dllm-generate on the same prompts, with the serving targets.

On a GPU, the LLaDA-8B shape with random weights (no checkpoint; the config is tracked in tests/data/real-configs):

    python3 tools/serve_bench.py --random-weights tests/data/real-configs/llada-8b-instruct.config.json

On the CPU, a real small checkpoint and small sizes (random weights live on the GPU only):

    python3 tools/serve_bench.py -m models/tiny-llada --backend cpu --clients 4 --prompt-tokens 48 --max-tokens 32

What it does, in order, with one dllm-server (--max-batch = --clients) and then the CLI:
  (d) one streaming chat request alone: its time to the first streamed step (its prefill and first step) and its
      generated tokens/s;
  (b) --clients concurrent streaming chat requests (prompt ~--prompt-tokens tokens through the chat template,
      max_tokens --max-tokens, --cache dual, dllm-generate's defaults otherwise), after one untimed round:
      aggregate generated tokens/s, from the first request sent to the last [DONE], and the batched step time each
      stream sees;
  (c) a request arriving while --clients - 1 others decode: its time to the first streamed step, beside its own
      prefill (the first step of (d)) plus two batched steps;
  (e) `dllm-generate --prompts FILE --batch --clients` on the same prompts and settings (the file holds the prompts
      twice: the first batch warms up, the second is timed) and the single-request `dllm-generate -f` on prompt 0
      (best of --solo-runs), their tokens/s from their own stats lines;
  (f) one table: each figure, the ratio each target names, and the target.
Every server answer of (b) is also compared with dllm-generate's for its prompt (the same bits are expected).

--random-weights takes config.json (a file, or a directory holding it and maybe tokenizer files). Without a
tokenizer there, a stand-in is written to a temporary directory: a byte-level BPE whose ids 0-255 are the bytes
(every prompt character one token), every other id a placeholder "<tN>" so that any id the random model draws
decodes, and the model's special tokens and chat template (from the directory's tokenizer_config.json when a
directory is given, else LLaDA-8B-Instruct's, with tools/chat_templates/llada-8b-instruct.jinja). Timing, not text,
is what it is for.

To carry the programs to a GPU machine without libmicrohttpd or cJSON (build here: ./build.sh && ./build.sh server):

    python3 tools/serve_bench.py --bundle .carry/serve          # dllm-server, dllm-generate, their libraries
    python3 tools/serve_bench.py --random-weights tests/data/real-configs/llada-8b-instruct.config.json \
        --server .carry/serve/dllm-server --generate .carry/serve/dllm-generate    # there

Python standard library only. Exit status 0 when every run completed (the targets are reported, not enforced).
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from tokenizer_oracle import bytes_to_unicode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# LLaDA-8B-Instruct's special tokens that its chat template and decoding name (its tokenizer_config.json).
LLADA_SPECIALS = {126080: "<|startoftext|>", 126081: "<|endoftext|>", 126336: "<|mdm_mask|>", 126346: "<|start_header_id|>",
                  126347: "<|end_header_id|>", 126348: "<|eot_id|>"}


def random_weights_dir(config_arg, work):
    """The directory --random-weights is given: config_arg's own when it holds tokenizer files, else a stand-in."""
    src = config_arg if os.path.isdir(config_arg) else os.path.dirname(os.path.abspath(config_arg))
    config_path = os.path.join(config_arg, "config.json") if os.path.isdir(config_arg) else config_arg
    if os.path.isdir(config_arg) and (os.path.exists(os.path.join(src, "tokenizer.json")) or os.path.exists(os.path.join(src, "vocab.json"))):
        return config_arg, "the directory's own"
    with open(config_path) as f:
        config = json.load(f)
    n_vocab = max(int(config.get(k) or 0) for k in ("embedding_size", "vocab_size"))
    out = os.path.join(work, os.path.basename(os.path.normpath(src)) if os.path.isdir(config_arg) else "random-" + os.path.basename(config_path).split(".")[0])
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(config_path, os.path.join(out, "config.json"))
    tok_config_path = os.path.join(src, "tokenizer_config.json") if os.path.isdir(config_arg) else ""
    if tok_config_path and os.path.exists(tok_config_path):
        with open(tok_config_path) as f:
            tok_config = json.load(f)
        specials = {int(k): v["content"] for k, v in tok_config.get("added_tokens_decoder", {}).items()}
        where = "a stand-in vocabulary with the special tokens and chat template of " + tok_config_path
    else:
        with open(os.path.join(ROOT, "tools", "chat_templates", "llada-8b-instruct.jinja")) as f:
            template = f.read()
        specials = dict(LLADA_SPECIALS)
        tok_config = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "chat_template": template,
                      "tokenizer_class": "PreTrainedTokenizerFast",
                      "added_tokens_decoder": {str(i): {"content": s, "special": True} for i, s in specials.items()}}
        where = "a stand-in vocabulary with LLaDA-8B-Instruct's special tokens and chat template"
    specials = {i: s for i, s in specials.items() if i < n_vocab}
    chars = bytes_to_unicode()
    vocab = {}
    for i in range(n_vocab):
        if i in specials:
            continue
        vocab[chars[i] if i < 256 else "<t%d>" % i] = i
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {"version": "1.0", "truncation": None, "padding": None,
                 "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
                                  for i, s in sorted(specials.items())],
                 "normalizer": None, "pre_tokenizer": level, "post_processor": level, "decoder": level,
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                           "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)
    return out, where


RUNTIME = ("linux-vdso", "libc.so", "libm.so", "libstdc++", "libgcc_s", "ld-linux", "libpthread", "libdl.so", "librt.so")


def make_bundle(args):
    """--bundle DIR: dllm-server, dllm-generate and the shared libraries the server needs beyond the C/C++ runtime
    (libdllm.so.0, libmicrohttpd, cJSON in DIR; what those need in turn, GnuTLS and its own, in DIR/extra), to carry
    to a machine that lacks them; run_env adds DIR/extra only where the machine itself has not got them."""
    os.makedirs(os.path.join(args.bundle, "extra"), exist_ok=True)
    for b in (args.server, args.generate):
        shutil.copy2(b, args.bundle)
    direct = set(subprocess.run(["readelf", "-d", args.server], capture_output=True, text=True).stdout.split("[")[1:])
    direct = {d.split("]")[0] for d in direct}
    for line in subprocess.run(["ldd", args.server], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] != "=>" or any(parts[0].startswith(r) for r in RUNTIME):
            continue
        if parts[2] == "not":
            raise RuntimeError("%s: %s is not found here either" % (args.server, parts[0]))
        shutil.copyfile(parts[2], os.path.join(args.bundle, parts[0] if parts[0] in direct else os.path.join("extra", parts[0])))
    print("bundled %s and %s with %s; on the GPU machine: --server %s --generate %s" % (
        args.server, args.generate, ", ".join(sorted(os.listdir(args.bundle))), os.path.join(args.bundle, "dllm-server"),
        os.path.join(args.bundle, "dllm-generate")))


def run_env(binary):
    """The environment that runs binary: its own directory on LD_LIBRARY_PATH (a --bundle), and its extra/ folder
    too where this machine lacks a library there."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(binary))
    env["LD_LIBRARY_PATH"] = here + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    if os.path.isdir(os.path.join(here, "extra")):
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, env=env).stdout
        if "not found" in out:
            env["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"] + ":" + os.path.join(here, "extra")
    return env


class Server:
    def __init__(self, args, model_flag, model_dir, log_path):
        self.log = open(log_path, "w+")
        self.log_path = log_path
        cmd = [args.server, model_flag, model_dir, "--host", "127.0.0.1", "--port", "0", "--max-batch", str(args.clients),
               "--max-queue", str(4 * args.clients), "--max-streams", str(4 * args.clients), "--max-tokens", str(args.max_tokens)]
        cmd += ["--backend", args.backend] + (["--precision", args.precision] if args.precision else []) + (["-t", str(args.threads)] if args.threads else [])
        cmd += ["--max-fill-rows", str(args.max_fill_rows)] if args.max_fill_rows is not None else []
        print("starting: " + " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=run_env(args.server))
        self.port = None
        deadline = time.time() + args.start_timeout
        while self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("dllm-server exited at start:\n" + self.output())
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("dllm-server did not start in %d s:\n%s" % (args.start_timeout, self.output()))
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/", self.output())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.1)
        self.model_id = json.loads(self.get("/health"))["model"]

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def get(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", path)
            return conn.getresponse().read()
        finally:
            conn.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def stream_chat(port, body, result, timeout):
    """One streaming chat request: result gets sent, first (the first event: the first step is done), done,
    text, completion_tokens, prompt_tokens, status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        result["sent"] = time.monotonic()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        result["status"] = r.status
        if r.status != 200:
            result["error"] = r.read().decode(errors="replace")
            return
        text = []
        for line in r:
            if not line.startswith(b"data: "):
                continue
            if "first" not in result:
                result["first"] = time.monotonic()
            data = line[6:].strip()
            if data == b"[DONE]":
                result["done"] = time.monotonic()
                break
            event = json.loads(data)
            if "error" in event:
                result["error"] = event["error"]
            for c in event.get("choices", []):
                text.append(c.get("delta", {}).get("content") or "")
            if event.get("usage"):
                result["completion_tokens"] = event["usage"]["completion_tokens"]
                result["prompt_tokens"] = event["usage"]["prompt_tokens"]
        result["text"] = "".join(text)
    except Exception as e:  # noqa: BLE001 - reported with the figures
        result["error"] = repr(e)
    finally:
        conn.close()


def run_clients(port, bodies, timeout, delays=None):
    results = [{} for _ in bodies]
    threads = []
    for i, body in enumerate(bodies):
        if delays and delays[i]:
            delays[i](results)
        t = threading.Thread(target=stream_chat, args=(port, body, results[i], timeout))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout)
    for i, r in enumerate(results):
        if r.get("status") != 200 or "done" not in r or "error" in r:
            raise RuntimeError("request %d failed: %r" % (i, {k: v for k, v in r.items() if k != "text"}))
    return results


def step_ms(r):
    """The time between a stream's steps after its first: one token a step (dllm-generate's default schedule)."""
    n = r.get("completion_tokens", 0)
    return 1e3 * (r["done"] - r["first"]) / (n - 1) if n > 1 else float("nan")


CLI_STATS = re.compile(r"generated (\d+) tokens? .*?, ([\d.]+) ms \(([\d.]+) tokens/s\)")


def run_cli(cmd, what):
    print("running: " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, env=run_env(cmd[0]))
    if out.returncode != 0:
        raise RuntimeError("%s failed (exit %d):\n%s" % (what, out.returncode, out.stderr[-3000:]))
    stats = [(int(m.group(1)), float(m.group(2)), float(m.group(3))) for m in map(CLI_STATS.search, out.stderr.splitlines()) if m]
    if not stats:
        raise RuntimeError("%s printed no stats line:\n%s" % (what, out.stderr[-3000:]))
    return out.stdout, stats


def make_prompts(n, n_chars, seed):
    """n prompts of about n_chars characters of words (different orders of one word list)."""
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near "
             "an old river bank where children learn to count stars and write long letters about distant cities").split()
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        out = "Question %d:" % i
        while len(out) < n_chars:
            out += " " + rng.choice(words)
        prompts.append(out[:n_chars].rstrip())
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    model = ap.add_mutually_exclusive_group(required="--bundle" not in sys.argv)
    model.add_argument("--random-weights", metavar="CONFIG", help="config.json (or a directory holding it): random weights on the GPU")
    model.add_argument("-m", "--model", metavar="DIR", help="a checkpoint directory (the CPU test)")
    ap.add_argument("--backend", default="gpu", choices=["auto", "cpu", "gpu"], help="default gpu")
    ap.add_argument("--precision", default="", help="passed to both programs (default: theirs)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="CPU backend threads (default: all)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent streaming clients and --batch (default 16)")
    ap.add_argument("--prompt-tokens", type=int, default=768, help="each prompt's tokens through the chat template (default 768)")
    ap.add_argument("--max-tokens", type=int, default=256, help="max_tokens and -n (default 256)")
    ap.add_argument("--cache", default="dual", help="Fast-dLLM cache of both (default dual)")
    ap.add_argument("--max-fill-rows", type=int, help="the server's --max-fill-rows (default: the server's)")
    ap.add_argument("--solo-runs", type=int, default=2, help="single-request dllm-generate runs, the best kept (default 2)")
    ap.add_argument("--join-after", type=float, default=0.25,
                    help="(c): the late request is sent when the others are this fraction of their way (default 0.25)")
    ap.add_argument("--server", default=os.path.join(ROOT, "build", "dllm-server"))
    ap.add_argument("--generate", default=os.path.join(ROOT, "build", "dllm-generate"))
    ap.add_argument("--start-timeout", type=int, default=900, help="seconds the server may take to start (JIT, weights)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds a request may take")
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    ap.add_argument("--bundle", metavar="DIR", help="copy --server, --generate and the libraries the server needs into DIR "
                    "(to carry to a GPU machine), then exit")
    args = ap.parse_args()
    if args.bundle:
        make_bundle(args)
        return 0

    work = tempfile.mkdtemp(prefix="serve_bench.")
    try:
        if args.random_weights:
            model_dir, tok_note = random_weights_dir(args.random_weights, work)
            model_flag = "--random-weights"
            print("random weights of %s; tokenizer: %s (%s)" % (args.random_weights, tok_note, model_dir), flush=True)
        else:
            model_dir, model_flag = args.model, "-m"
        common = ["--cache", args.cache] + (["--precision", args.precision] if args.precision else [])
        gen_flags = [model_flag, model_dir, "--backend", args.backend, "-n", str(args.max_tokens)] + common + (["-t", str(args.threads)] if args.threads else [])
        figures = {"clients": args.clients, "max_tokens": args.max_tokens, "cache": args.cache}

        def body(prompt, **kw):
            b = {"model": srv.model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens,
                 "cache": args.cache, "stream": True, "stream_options": {"include_usage": True}}
            b.update(kw)
            return b

        srv = Server(args, model_flag, model_dir, os.path.join(work, "server.log"))
        try:
            # the prompt length: one probe of the chat template's tokens, then every prompt as many characters
            probe = make_prompts(1, max(8, args.prompt_tokens // 2), 1)[0]
            r = run_clients(srv.port, [body(probe, max_tokens=1)], args.timeout)[0]
            chars = max(8, int(round(len(probe) * (args.prompt_tokens / r["prompt_tokens"])))) if r["prompt_tokens"] else len(probe)
            for _ in range(4):  # a BPE tokenizer merges: a few corrections
                prompts = make_prompts(args.clients, chars, 7)
                n = run_clients(srv.port, [body(prompts[0], max_tokens=1)], args.timeout)[0]["prompt_tokens"]
                if n == args.prompt_tokens:
                    break
                chars = max(8, chars + int(round((args.prompt_tokens - n) * chars / n)))
            print("prompts: %d of %d characters (prompt 0: %d tokens with the chat template)" % (args.clients, chars, n), flush=True)
            run_clients(srv.port, [body(prompts[0])], args.timeout)  # warm-up: the GEMM autotuning and first graphs

            # (d) one client alone
            alone = run_clients(srv.port, [body(prompts[0])], args.timeout)[0]
            figures["alone"] = {"first_step_ms": 1e3 * (alone["first"] - alone["sent"]), "step_ms": step_ms(alone),
                                "tokens": alone["completion_tokens"], "wall_ms": 1e3 * (alone["done"] - alone["sent"]),
                                "tokens_per_s": alone["completion_tokens"] / (alone["done"] - alone["sent"])}
            print("(d) alone: %r" % figures["alone"], flush=True)

            # (b) every client at once, after one untimed round (the GEMMs tune for each new row count once)
            run_clients(srv.port, [body(p) for p in prompts], args.timeout)
            many = run_clients(srv.port, [body(p) for p in prompts], args.timeout)
            wall = max(r["done"] for r in many) - min(r["sent"] for r in many)
            tokens = sum(r["completion_tokens"] for r in many)
            figures["concurrent"] = {"tokens": tokens, "wall_ms": 1e3 * wall, "tokens_per_s": tokens / wall,
                                     "step_ms": statistics.median(step_ms(r) for r in many),
                                     "first_step_ms_max": 1e3 * max(r["first"] - r["sent"] for r in many),
                                     "prompt_tokens": [r["prompt_tokens"] for r in many]}
            print("(b) concurrent: %r" % {k: v for k, v in figures["concurrent"].items() if k != "prompt_tokens"}, flush=True)

            # (c) one more while clients - 1 decode: sent once they are --join-after of their way
            others = prompts[1:] if args.clients > 1 else prompts
            expected_s = figures["concurrent"]["wall_ms"] / 1e3
            late = {}
            background = [{} for _ in others]
            threads = [threading.Thread(target=stream_chat, args=(srv.port, body(p), background[i], args.timeout)) for i, p in enumerate(others)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + args.timeout
            while not all("first" in r for r in background) and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(max(0.0, args.join_after * expected_s - (time.monotonic() - min(r["sent"] for r in background))))
            stream_chat(srv.port, body(prompts[0]), late, args.timeout)
            for t in threads:
                t.join(args.timeout)
            for r in background + [late]:
                if r.get("status") != 200 or "done" not in r or "error" in r:
                    raise RuntimeError("(c) a request failed: %r" % {k: v for k, v in r.items() if k != "text"})
            still = sum(1 for r in background if r["done"] > late["first"])
            step_batched = statistics.median(step_ms(r) for r in background)
            bound = figures["alone"]["first_step_ms"] + 2 * step_batched
            figures["join"] = {"first_step_ms": 1e3 * (late["first"] - late["sent"]), "others_decoding_at_its_first_step": still,
                               "batched_step_ms": step_batched, "alone_first_step_ms": figures["alone"]["first_step_ms"], "bound_ms": bound,
                               "equal_to_alone": late["text"] == alone["text"]}
            print("(c) join: %r" % figures["join"], flush=True)
        finally:
            rc = srv.stop()
            if rc != 0:
                print("dllm-server exited with %s:\n%s" % (rc, srv.output()[-3000:]))

        # (e) the CLI on the same prompts and settings
        prompts_file = os.path.join(work, "prompts.txt")
        with open(prompts_file, "w") as f:
            f.write("\n".join(prompts + prompts) + "\n")
        out, stats = run_cli([args.generate] + gen_flags + ["--prompts", prompts_file, "--batch", str(args.clients), "--json"], "dllm-generate --prompts")
        figures["cli_batch"] = {"tokens": stats[-1][0], "wall_ms": stats[-1][1], "tokens_per_s": stats[-1][2]}
        cli_texts = {}
        for line in out.splitlines():
            o = json.loads(line)
            cli_texts.setdefault(o["index"] % len(prompts), o.get("text"))
        figures["answers_equal_cli"] = sum(1 for i, r in enumerate(many) if r["text"] == cli_texts.get(i))
        prompt0 = os.path.join(work, "prompt0.txt")
        with open(prompt0, "w") as f:
            f.write(prompts[0] + "\n")
        solo = []
        for _ in range(max(1, args.solo_runs)):
            out, stats = run_cli([args.generate] + gen_flags + ["-f", prompt0, "--json"], "dllm-generate -f")
            solo.append({"tokens": stats[-1][0], "wall_ms": stats[-1][1], "tokens_per_s": stats[-1][2], "text": json.loads(out.strip().splitlines()[-1])["text"]})
        best = max(solo, key=lambda s: s["tokens_per_s"])
        figures["cli_solo"] = {k: v for k, v in best.items() if k != "text"}
        figures["alone_equal_cli"] = alone["text"] == best["text"]
        print("(e) dllm-generate: batch %r, solo %r" % (figures["cli_batch"], figures["cli_solo"]), flush=True)

        # (f) the table
        c, a, j, b, s = figures["concurrent"], figures["alone"], figures["join"], figures["cli_batch"], figures["cli_solo"]
        rows = [
            ("(b) %d streaming clients: aggregate generated tokens/s" % args.clients, "%.1f" % c["tokens_per_s"], "", ""),
            ("(e) dllm-generate --prompts --batch %d: tokens/s" % args.clients, "%.1f" % b["tokens_per_s"], "", ""),
            ("    ratio server / CLI batch", "%.3f" % (c["tokens_per_s"] / b["tokens_per_s"]), ">= 0.85",
             "yes" if c["tokens_per_s"] >= 0.85 * b["tokens_per_s"] else "NO"),
            ("(c) late request: time to its first streamed step, ms", "%.1f" % j["first_step_ms"], "", ""),
            ("    its own prefill (alone, first step) + 2 batched steps, ms",
             "%.1f = %.1f + 2 x %.1f" % (j["bound_ms"], j["alone_first_step_ms"], j["batched_step_ms"]), "", ""),
            ("    ratio late / (prefill + 2 steps)", "%.3f" % (j["first_step_ms"] / j["bound_ms"]), "<= 1",
             "yes" if j["first_step_ms"] <= j["bound_ms"] else "NO"),
            ("    others still decoding at its first step", "%d of %d" % (j["others_decoding_at_its_first_step"], len(others)), "", ""),
            ("(d) one streaming client alone: tokens/s", "%.1f" % a["tokens_per_s"], "", ""),
            ("(e) dllm-generate, one request: tokens/s", "%.1f" % s["tokens_per_s"], "", ""),
            ("    ratio alone / CLI solo", "%.3f" % (a["tokens_per_s"] / s["tokens_per_s"]), ">= 0.9",
             "yes" if a["tokens_per_s"] >= 0.9 * s["tokens_per_s"] else "NO"),
            ("    server wall - CLI wall for that request, ms", "%.1f" % (a["wall_ms"] - s["wall_ms"]), "<= 5 (CPU, tiny)", ""),
            ("(b) answers equal to dllm-generate's", "%d of %d" % (figures["answers_equal_cli"], len(prompts)), "all", ""),
            # the stepper at batch 1 against dllm_generate: the same bits on the CPU; on the GPU near-ties may differ
            ("(d) alone answer equal to dllm-generate's", "yes" if figures["alone_equal_cli"] else "no", "yes (CPU)", ""),
        ]
        width = max(len(r[0]) for r in rows)
        print("\nserve_bench: %s, %s backend, prompt %d tokens (chat template included), max_tokens %d, --cache %s%s" %
              (args.random_weights and "random weights of " + args.random_weights or args.model, args.backend, n, args.max_tokens, args.cache,
               ", --precision " + args.precision if args.precision else ""))
        print("| %-*s | %-24s | %-16s | %-4s |" % (width, "figure", "value", "target", "met"))
        print("|-%s-|-%s-|-%s-|-%s-|" % ("-" * width, "-" * 24, "-" * 16, "-" * 4))
        for r in rows:
            print("| %-*s | %-24s | %-16s | %-4s |" % (width, r[0], r[1], r[2], r[3]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
