"""The Python package on the CPU backend with the repository's tiny models, checked against the C CLI."""
import gc
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dllm  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LLADA = os.path.join(REPO, "models", "tiny-llada")
BLOCK_DIFFUSION = os.path.join(REPO, "models", "tiny-fast-dllm-v2")
# Short generations keep the suite fast on a small CPU; 16 tokens in blocks of 8 still cross a block boundary.
SHORT = dict(gen_length=16, steps=16, block_length=8)


def find_cli():
    """dllm-generate: $DLLM_GENERATE, beside the loaded library, or the repository's build/."""
    candidates = [os.environ.get("DLLM_GENERATE"), os.path.join(os.path.dirname(dllm.library_path()), "dllm-generate"),
                  os.path.join(REPO, "build", "dllm-generate")]
    return next((path for path in candidates if path and os.access(path, os.X_OK)), None)


def run_cli(*args):
    """dllm-generate --json on the CPU backend: (ids, text)."""
    cli = find_cli()
    if cli is None:
        raise unittest.SkipTest("no dllm-generate (set DLLM_GENERATE) to compare with")
    done = subprocess.run([cli, "--backend", "cpu", "--json", *args], capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout)
    return answer["ids"], answer["text"]


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class LladaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = dllm.Model(LLADA)
        cls.ctx = dllm.Context(cls.model, backend="cpu")
        cls.question = "What is two plus two?"
        cls.prompt = cls.model.tokenizer.apply_chat_template([{"role": "user", "content": cls.question}],
                                                             tokenize=True)
        cls.solo = cls.ctx.generate(cls.prompt, **SHORT)

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_model_and_context_properties(self):
        self.assertEqual(self.model.family, dllm.Family.LLADA)
        self.assertEqual(self.model.mask_id, self.model.tokenizer.token_id("<|mdm_mask|>"))
        self.assertFalse(self.model.is_block_diffusion)
        self.assertEqual(self.model.tokenizer.chat_template, dllm.ChatTemplate.LLADA)
        self.assertEqual(self.ctx.backend, dllm.Backend.CPU)
        self.assertEqual(dllm.gen_defaults()["gen_length"], 128)
        self.assertEqual(dllm.Context.default_params()["backend"], dllm.Backend.AUTO)
        draw = dllm.rng_uniform(1, 2, 3, 4, 16)
        self.assertTrue(0 < draw < 1 and draw == dllm.rng_uniform(1, 2, 3, 4, 16) != dllm.rng_uniform(1, 2, 3, 4, 17))

    def test_tokenizer_round_trip(self):
        tok = self.model.tokenizer
        self.assertEqual(tok.decode(tok.encode("Hello world, 2 + 2 = 4.")), "Hello world, 2 + 2 = 4.")
        # special tokens are longer than decode's first buffer guess: the library's BUFFER_TOO_SMALL retry path
        rendered = tok.apply_chat_template([{"role": "user", "content": self.question}])
        self.assertEqual(tok.decode(self.prompt, skip_special=False), rendered)
        self.assertEqual(tok.encode("<|eot_id|>"), [self.model.info.eot_id])
        self.assertNotEqual(tok.encode("<|eot_id|>", parse_special=False), [self.model.info.eot_id])

    def test_generate_equals_cli(self):
        ids, text = run_cli("-m", LLADA, "--ids", " ".join(map(str, self.prompt)), "-n", "16", "--steps", "16",
                            "--block", "8", "--no-early-stop")
        self.assertEqual(self.solo.ids, ids)
        self.assertEqual(self.solo.text, text)
        self.assertEqual(self.solo.stats.n_prompt, len(self.prompt))

    def test_text_prompt_equals_cli(self):
        # dllm-generate -p applies the chat template; its early stop is on by default
        ids, text = run_cli("-m", LLADA, "-p", self.question, "-n", "8", "--seed", "7", "--temp", "0.5")
        mine = self.ctx.generate(self.prompt, gen_length=8, steps=8, block_length=8, early_stop=1, seed=7,
                                 temperature=0.5)
        self.assertEqual((mine.ids, mine.text), (ids, text))

    def test_steps_follow_a_short_gen_length(self):
        # steps left at the default (128) become gen_length: the library refuses steps that commit nothing
        mine = self.ctx.generate(self.prompt, gen_length=16, block_length=8)
        self.assertEqual(mine.ids, self.ctx.generate(self.prompt, gen_length=16, steps=16, block_length=8).ids)

    def test_stream_ends_on_generate_result(self):
        with self.ctx.stream(self.prompt, **SHORT) as stream:
            steps = list(stream)
        self.assertEqual(len(steps), self.solo.stats.steps)
        self.assertEqual(stream.result.ids, self.solo.ids)
        last = steps[-1]
        self.assertEqual(last.n_masked, 0)
        self.assertEqual(last.canvas[:last.prompt_len], self.prompt)
        self.assertEqual(last.generated[:len(self.solo.ids)], self.solo.ids)
        committed = sorted(pos for step in steps for pos in step.committed)
        self.assertEqual(committed, list(range(len(self.prompt), len(self.prompt) + SHORT["gen_length"])))

    def test_breaking_a_stream_cancels(self):
        with self.ctx.stream(self.prompt, **SHORT) as stream:
            for step in stream:
                with self.assertRaises(RuntimeError):  # one generation at a time on a context
                    self.ctx.generate(self.prompt, **SHORT)
                with self.assertRaises(RuntimeError):
                    self.ctx.stream(self.prompt, **SHORT)
                if step.global_step == 3:
                    break
        self.assertEqual(stream.result.status, dllm.Status.ERR_CANCELLED)
        self.assertEqual(stream.result.stats.steps, 3)
        self.assertEqual(stream.result.ids, step.generated[:len(stream.result.ids)])
        for step in self.ctx.stream(self.prompt, **SHORT):
            break  # no close(): dropping the stream cancels it
        self.assertEqual(self.ctx.generate(self.prompt, **SHORT).ids, self.solo.ids)

    def test_batch_equals_solo(self):
        other = self.model.tokenizer.apply_chat_template([{"role": "user", "content": "Name a color."}],
                                                         tokenize=True)
        seeded = dict(gen_length=8, steps=8, block_length=8, temperature=0.8, seed=3)
        batch = self.ctx.generate_batch([self.prompt, other], per_prompt=[{}, seeded], **SHORT)
        self.assertEqual(batch[0].ids, self.solo.ids)
        self.assertEqual(batch[1].ids, self.ctx.generate(other, **seeded).ids)
        self.assertEqual(batch.stats.n_prompt, len(self.prompt) + len(other))

    def test_batch_item_failure(self):
        with self.assertRaises(dllm.DllmError) as caught:
            self.ctx.generate_batch([self.prompt, self.prompt], per_prompt=[{}, {"steps": 3}], **SHORT)
        results = caught.exception.results
        self.assertEqual(results[0].ids, self.solo.ids)
        self.assertEqual(results[1].status, dllm.Status.ERR_INVALID_ARGUMENT)
        self.assertIn("steps (--steps) 3", results[1].message)

    def test_numpy_prompt(self):
        try:
            import numpy
        except ImportError:
            self.skipTest("NumPy is not installed (optional)")
        self.assertEqual(self.ctx.generate(numpy.array(self.prompt, dtype=numpy.int64), **SHORT).ids, self.solo.ids)
        self.assertIsInstance(self.ctx.logits(self.prompt, 0, 1), numpy.ndarray)

    def test_logits(self):
        full, rows = self.ctx.logits(self.prompt), self.ctx.logits(self.prompt, 2, 5)
        self.assertEqual(len(full), len(self.prompt))
        self.assertEqual(len(full[0]), self.model.n_vocab)
        for r in range(3):
            self.assertEqual(list(rows[r]), list(full[r + 2]))

    def test_log_handler(self):
        messages = []
        dllm.set_log_handler(lambda level, text: messages.append((level, text)), "info")
        try:
            dllm.Context(self.model, backend="cpu", n_threads=1).close()
        finally:
            dllm.set_log_handler(None)
        self.assertIn((dllm.LogLevel.INFO, "CPU reference backend, 1 thread(s)"), messages)

    def test_bad_inputs_raise_the_library_message(self):
        with self.assertRaises(dllm.DllmError) as caught:
            dllm.Model(os.path.join(REPO, "models", "no-such-model"))
        self.assertEqual(caught.exception.status, dllm.Status.ERR_IO)
        self.assertIn("no-such-model", caught.exception.message)
        with self.assertRaises(dllm.DllmError) as caught:
            dllm.Context(self.model, backend=7)
        self.assertEqual(str(caught.exception), "DLLM_ERR_INVALID_ARGUMENT: dllm_ctx_create: unknown backend 7")
        with self.assertRaises(dllm.DllmError) as caught:
            self.ctx.generate(self.prompt, gen_length=16)  # the default block of 32 does not divide it
        self.assertEqual(caught.exception.status, dllm.Status.ERR_INVALID_ARGUMENT)
        self.assertIn("block_length", caught.exception.message)
        with self.assertRaises(dllm.DllmError):
            self.ctx.generate(self.prompt, unmask="threshold", threshold=1.5, **SHORT)
        with self.assertRaises(ValueError):
            dllm.Context(self.model, backend="tpu")
        with self.assertRaises(TypeError):
            self.ctx.generate(self.prompt, gen_lenght=16)

    def test_close_frees_everything(self):
        before = dllm.live_handles()
        with dllm.Model(LLADA) as model:
            ctx = dllm.Context(model, backend="cpu")
            stream = ctx.stream(self.prompt, **SHORT)
            next(stream)
        self.assertTrue(ctx.closed and model.tokenizer.closed)  # the model closed its context and stream first
        self.assertEqual(stream.result.status, dllm.Status.ERR_CANCELLED)
        self.assertEqual(dllm.live_handles(), before)
        with self.assertRaises(ValueError):
            ctx.generate(self.prompt, **SHORT)
        ctx.close()  # twice is harmless
        dllm.Context(dllm.Model(LLADA), backend="cpu")  # dropped unclosed: garbage collection frees both
        gc.collect()
        self.assertEqual(dllm.live_handles(), before)

    def test_no_memory_growth(self):
        def cycle():
            with dllm.Model(LLADA) as model, dllm.Context(model, backend="cpu") as ctx:
                ctx.generate(self.prompt, gen_length=4, steps=4, block_length=4)
        cycle()
        start = rss_bytes()
        for _ in range(10):
            cycle()
        # one leaked model or context is tens of MB (fp32 weights, canvas buffers)
        self.assertLess(rss_bytes() - start, 8 << 20)

    def test_quantize(self):
        calls = []
        with tempfile.TemporaryDirectory() as out:
            self.model.quantize(out, "soloq_i", progress=lambda done, total: calls.append((done, total)),
                                overwrite=1)
            with dllm.Model(out) as quantized:
                self.assertEqual(quantized.info.precision, dllm.Precision.SOLOQ_I)
        self.assertEqual(calls[-1], (self.model.info.n_layer, self.model.info.n_layer))

    def test_context_quantising_reports_progress(self):
        calls = []
        dllm.Context(self.model, backend="cpu", precision="soloq_i",
                     progress=lambda done, total: calls.append((done, total))).close()
        n = self.model.info.n_layer
        self.assertEqual(calls, [(i, n) for i in range(1, n + 1)])


class StepperTest(unittest.TestCase):
    """Continuous batching: prompts joining a running stepper at different steps get generate()'s answers."""

    @classmethod
    def setUpClass(cls):
        cls.model = dllm.Model(LLADA)
        cls.ctx = dllm.Context(cls.model, backend="cpu")
        tok = cls.model.tokenizer
        cls.prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True)
                       for q in ("What is two plus two?", "Name a color.", "Say hi.")]
        cls.options = [SHORT, dict(SHORT, temperature=0.8, seed=5), dict(SHORT, kv_cache="dual")]

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_sequences_joining_later_equal_generate(self):
        want = [self.ctx.generate(p, **o).ids for p, o in zip(self.prompts, self.options)]
        got, seen, ids = {}, {}, []

        def step(stepper):
            stepper.step()
            for event in stepper.events():
                if event.stepped:
                    seen.setdefault(event.seq_id, []).extend(event.step.committed)
                    self.assertEqual(event.step.canvas[:event.step.prompt_len], self.prompts[ids.index(event.seq_id)])
                if event.finished:
                    got[event.seq_id] = event.result.ids
                    stepper.remove(event.seq_id)

        with dllm.Stepper(self.ctx, max_sequences=2) as stepper:
            ids.append(stepper.add(self.prompts[0], **self.options[0]))
            step(stepper)
            ids.append(stepper.add(self.prompts[1], **self.options[1]))  # joins at the second step
            with self.assertRaises(dllm.DllmError) as full:
                stepper.add(self.prompts[2], **self.options[2])
            self.assertEqual(full.exception.status, dllm.Status.ERR_FULL)
            self.assertEqual(self.ctx.generate(self.prompts[0], **SHORT).ids, want[0])  # a solo run between steps
            while stepper.n_active or len(ids) < 3:
                if len(ids) < 3 and stepper.n_active < 2:
                    ids.append(stepper.add(self.prompts[2], **self.options[2]))
                step(stepper)
        self.assertEqual([got[i] for i in ids], want)
        for i, seq_id in enumerate(ids):  # every generated position committed once, in some step
            n = len(self.prompts[i])
            self.assertEqual(sorted(seen[seq_id]), list(range(n, n + SHORT["gen_length"])))

    def test_stepper_fill_bound_is_checked(self):
        with self.assertRaises(dllm.DllmError) as bad:
            dllm.Stepper(self.ctx, max_fill_rows=-1)
        self.assertEqual(bad.exception.status, dllm.Status.ERR_INVALID_ARGUMENT)
        self.assertIn("max_fill_rows", str(bad.exception))
        with dllm.Stepper(self.ctx, max_fill_rows=1) as stepper:
            seq_id = stepper.add(self.prompts[0], **self.options[0])
            while stepper.n_active:
                stepper.step()
                if stepper.poll(seq_id).finished:
                    stepper.remove(seq_id)

    def test_cancel_remove_and_close(self):
        before = dllm.live_handles()
        stepper = dllm.Stepper(self.ctx)
        with self.assertRaises(dllm.DllmError) as second:
            dllm.Stepper(self.ctx)
        self.assertIn("has a stepper", second.exception.message)
        with self.assertRaises(dllm.DllmError):  # dllm_generate_batch would use the stepper's caches
            self.ctx.generate_batch([self.prompts[0]], **SHORT)
        with self.assertRaises(dllm.DllmError) as bad:
            stepper.add(self.prompts[0], gen_length=16, steps=3, block_length=8)
        self.assertIn("steps (--steps) 3", bad.exception.message)
        first, second_id = stepper.add(self.prompts[0], **SHORT), stepper.add(self.prompts[1], **SHORT)
        stepper.step()
        stepper.step()
        stepper.cancel(first)
        event = stepper.poll(first)
        self.assertTrue(event.finished)
        self.assertEqual(event.result.status, dllm.Status.ERR_CANCELLED)
        self.assertEqual(event.result.stats.steps, 2)
        stepper.remove(second_id)  # still decoding: cancelled and forgotten
        with self.assertRaises(dllm.DllmError):
            stepper.poll(second_id)
        self.assertEqual(stepper.n_active, 0)
        stepper.close()
        stepper.close()  # twice is harmless
        self.assertEqual(dllm.live_handles(), before)
        dllm.Stepper(self.ctx)  # dropped unclosed: garbage collection frees it
        gc.collect()
        self.assertEqual(dllm.live_handles(), before)


class BlockDiffusionTest(unittest.TestCase):
    def test_generate_equals_cli(self):
        with dllm.Model(BLOCK_DIFFUSION) as model, dllm.Context(model, backend="cpu") as ctx:
            self.assertTrue(model.is_block_diffusion)
            prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": "Count to five."}],
                                                         tokenize=True)
            mine = ctx.generate(prompt, gen_length=32, block_length=model.block_size, threshold=0.9,
                                unmask="threshold")
            with ctx.stream(prompt, gen_length=32, block_length=model.block_size) as stream:
                last = list(stream)[-1]
            self.assertEqual(stream.result.ids, ctx.generate(prompt, gen_length=32, block_length=32).ids)
            self.assertEqual(last.canvas[:len(prompt)], prompt)
            info = model.info
            self.assertEqual(model.kv_bytes_per_token(), 4 * info.n_layer * info.n_head_kv * info.head_dim)
        ids, text = run_cli("-m", BLOCK_DIFFUSION, "--ids", " ".join(map(str, prompt)), "-n", "32",
                            "--threshold", "0.9")
        self.assertEqual((mine.ids, mine.text), (ids, text))


if __name__ == "__main__":
    unittest.main()
