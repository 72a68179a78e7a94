/* dllm-eval: quality numbers for a model and a decoding configuration, through the public API only.
 *
 *   build/dllm-eval -m models/tiny-llada --nll tests/data/heldout.txt
 *   build/dllm-eval -m models/tiny-add --add tests/data/add_test.txt
 *   build/dllm-eval -m models/tiny-llada --agree tests/data/prompts.txt --lacache on --ref-lacache off
 *   build/dllm-eval -m models/tiny-llada --agree tests/data/prompts.txt --precision fp8 --ref-precision bf16
 *   build/dllm-eval -m models/tiny-llada --agree tests/data/prompts.txt --cache dual --threshold 0.9
 *
 * --nll FILE    masked-token NLL at mask ratios 0.15 / 0.5 / 0.9, dllm protocol 1 (tools/train_tiny.py,
 *               NLL_PROTOCOL): the file tokenized as one string, 64 windows of 128 ids, position i of window
 *               w masked iff dllm_rng_uniform(1234, i, w, k, 3) < r_k, one forward per window, float64.
 * --add FILE    exact match on lines "a+b=sum": prompt "a+b=", gen = steps = block = 8, greedy; --batch N decodes N
 *               problems together (dllm_generate_batch, each exactly as a batch of one).
 * --agree FILE  one raw text prompt per line, decoded twice: with the configuration under test and with the
 *               reference (--ref-*); prints per-token and per-sequence agreement of the generated ids, the
 *               forwards (NFE) each took and the pseudo-log-likelihood of each one's output: the mean over
 *               generated tokens of -log p(token) with that token alone masked, one forward a token (a
 *               quality measure of a masked model's own; lower is more likely). The scheduler options
 *               (--cache, --threshold, --factor, --dpad, --alg, --timesteps) apply to the configuration under
 *               test only: the reference is LLaDA's vanilla decoding.
 * --precision bf16|fp8|fp8-all|soloq-n|soloq-i|soloq-c|rtn-w4a4 (or a -w4a16 form) sets dllm_ctx_params.precision
 * for every mode (--ref-precision: the reference's).
 * --add FILE must hold "a+b=sum" lines (empty lines are skipped); another line is an error with its number.
 * While it runs, a terminal on stderr shows the progress.
 * Each result is also printed as a "key value" line for scripts. Exit 0 on success, 1 with one line on
 * stderr for bad usage or a bad model.
 */
#include "../dllm.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *model_dir, *nll_file, *add_file, *agree_file;
    int limit, windows, n, steps, block, batch;
    dllm_backend backend, ref_backend;
    dllm_lacache lacache, ref_lacache;
    dllm_precision precision, ref_precision;
    dllm_soloq_rotation soloq_rotation;  /* both contexts' (SoloQ precisions only) */
    int soloq_bias_correction;
    dllm_gen_params sched;  /* the scheduler fields of the configuration under test */
} options;

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "dllm-eval: %s%s\n", what, detail ? detail : "");
    return 1;
}

static void usage(void) {
    printf("usage: dllm-eval -m DIR [--nll FILE] [--add FILE] [--agree FILE] [options]\n"
           "  -m, --model DIR         model directory (config, safetensors, tokenizer)\n"
           "  --nll FILE              masked-token NLL at ratios 0.15/0.5/0.9 (dllm protocol 1)\n"
           "  --windows N             NLL windows of 128 ids (default 64, the protocol's)\n"
           "  --add FILE              exact match on 'a+b=sum' lines\n"
           "  --limit N               use the first N problems / prompts only (N >= 1; default: all)\n"
           "  --batch N               --add: decode N problems together (dllm_generate_batch; default 1: one at a time)\n"
           "  --agree FILE            generation agreement against the reference configuration\n"
           "  -n N, --steps N, --block N   decoding for --agree (default 32, 32, 8)\n"
           "  --backend B, --ref-backend B   auto (default), cpu or gpu\n"
           "  --lacache M, --ref-lacache M   on (default), truncate or off\n"
           "  --precision P, --ref-precision P   bf16 (default; a dllm-quantize directory: its own), fp8 (FFN of\n"
           "                          layers >= 1), fp8-all, or SoloQ W4A4: soloq-n, soloq-i, soloq-c, rtn-w4a4, and\n"
           "                          each -w4a16 (weight-only), on both backends\n"
           "  --soloq-rotation R, --soloq-bias-correction 0|1   SoloQ's ablations, both contexts (krpbh and 1 by default)\n"
           "  scheduler under test (--agree; the reference decodes vanilla):\n"
           "  --cache none|prefix|dual  Fast-dLLM K/V cache (approximate)\n"
           "  --threshold T, --factor F  Fast-dLLM parallel decoding\n"
           "  --dpad W                DPad Gaussian suffix dropout over a window of W (k 4, scale 2)\n"
           "  --alg A                 low_confidence (default), topk_margin, entropy, origin or random\n"
           "  --timesteps             Dream's per-step count (eps 1e-3); --alg origin needs it\n"
           "  --version               print the version\n"
           "Progress goes to stderr when it is a terminal.\n");
}

static int parse_backend(const char *s, dllm_backend *b) {
    if (!strcmp(s, "auto")) *b = DLLM_BACKEND_AUTO;
    else if (!strcmp(s, "cpu")) *b = DLLM_BACKEND_CPU;
    else if (!strcmp(s, "gpu")) *b = DLLM_BACKEND_GPU;
    else return 0;
    return 1;
}

static int parse_lacache(const char *s, dllm_lacache *m) {
    if (!strcmp(s, "on")) *m = DLLM_LACACHE_ON;
    else if (!strcmp(s, "truncate")) *m = DLLM_LACACHE_TRUNCATE;
    else if (!strcmp(s, "off")) *m = DLLM_LACACHE_OFF;
    else return 0;
    return 1;
}

static int parse_precision(const char *s, dllm_precision *p) {
    static const char *const names[] = {"bf16", "fp8", "fp8-all", "soloq-n", "soloq-i", "soloq-c", "rtn-w4a4",
                                        "soloq-n-w4a16", "soloq-i-w4a16", "soloq-c-w4a16", "rtn-w4a16"}; /* dllm_precision order */
    int i;
    for (i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(s, names[i])) { *p = (dllm_precision)i; return 1; }
    return 0;
}

/* The scheduler options of the configuration under test; 0 if a is not one or v is bad (the library checks
 * ranges and combinations when it decodes). */
static int parse_sched(const char *a, const char *v, dllm_gen_params *g) {
    char *end = NULL;
    if (!strcmp(a, "--cache")) {
        if (!strcmp(v, "none")) g->kv_cache = DLLM_KV_CACHE_NONE;
        else if (!strcmp(v, "prefix")) g->kv_cache = DLLM_KV_CACHE_PREFIX;
        else if (!strcmp(v, "dual")) g->kv_cache = DLLM_KV_CACHE_DUAL;
        else return 0;
    } else if (!strcmp(a, "--threshold")) {
        g->unmask = DLLM_UNMASK_THRESHOLD, g->threshold = strtod(v, &end);
    } else if (!strcmp(a, "--factor")) {
        g->unmask = DLLM_UNMASK_FACTOR, g->factor = strtod(v, &end);
    } else if (!strcmp(a, "--dpad")) {
        g->dpad = DLLM_DPAD_GAUSSIAN, g->dpad_window = (int)strtol(v, &end, 10);
    } else if (!strcmp(a, "--alg")) {
        if (!strcmp(v, "low_confidence") || !strcmp(v, "maskgit_plus")) g->remasking = DLLM_REMASK_LOW_CONFIDENCE;
        else if (!strcmp(v, "topk_margin")) g->remasking = DLLM_REMASK_MARGIN;
        else if (!strcmp(v, "entropy")) g->remasking = DLLM_REMASK_ENTROPY;
        else if (!strcmp(v, "origin")) g->remasking = DLLM_REMASK_ORIGIN;
        else if (!strcmp(v, "random")) g->remasking = DLLM_REMASK_RANDOM;
        else return 0;
    } else {
        return 0;
    }
    return !end || (*end == 0 && end != v);
}

/* Options that take no value; every other known option takes one. */
static int is_flag(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help") || !strcmp(a, "--version") || !strcmp(a, "--timesteps"); }

static int is_value_option(const char *a) {
    static const char *const names[] = {"-m", "--model", "--nll", "--add", "--agree", "--limit", "--batch", "--windows", "-n", "--steps", "--block",
                                        "--backend", "--ref-backend", "--lacache", "--ref-lacache", "--precision", "--ref-precision",
                                        "--cache", "--threshold", "--factor", "--dpad", "--alg", "--soloq-rotation",
                                        "--soloq-bias-correction"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(a, names[i])) return 1;
    return 0;
}

/* A count option's value: an integer in [lo, 1 << 24]; 0 after printing an error naming the option. */
static int parse_count(const char *a, const char *v, int lo, int *out) {
    char *end = NULL;
    long x;
    errno = 0;
    x = strtol(v, &end, 10);
    if (end != v && !*end && ((errno == ERANGE && x == LONG_MAX) || (!errno && x > (1 << 24)))) {
        fprintf(stderr, "dllm-eval: %s %s is too large: at most %d\n", a, v, 1 << 24);
        return 0;
    }
    if (errno || end == v || *end || x < lo || x > (1 << 24)) {
        fprintf(stderr, "dllm-eval: %s must be an integer >= %d, not \"%s\"\n", a, lo, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

/* Returns 0 to go on, 1 after printing an error, 2 after printing help or the version. */
static int parse_args(int argc, char **argv, options *o) {
    int i;
    memset(o, 0, sizeof *o);
    o->windows = 64; o->n = 32; o->steps = 32; o->block = 8; o->batch = 1;
    o->backend = o->ref_backend = DLLM_BACKEND_AUTO;
    o->lacache = DLLM_LACACHE_ON;
    o->ref_lacache = DLLM_LACACHE_OFF;
    o->precision = o->ref_precision = DLLM_PRECISION_AUTO;  /* bf16, or what a dllm-quantize directory holds */
    o->soloq_rotation = DLLM_SOLOQ_ROTATION_DEFAULT, o->soloq_bias_correction = -1;
    o->sched = dllm_gen_default_params();
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!is_flag(a) && !is_value_option(a)) {
            fprintf(stderr, a[0] == '-' && a[1] ? "dllm-eval: unknown option %s (see --help)\n" : "dllm-eval: unexpected argument \"%s\" (see --help)\n", a);
            return 1;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 2; }
        if (!strcmp(a, "--version")) { printf("dllm-eval (dllm %s)\n", dllm_version()); return 2; }
        if (!strcmp(a, "--timesteps")) { o->sched.unmask = DLLM_UNMASK_TIMESTEPS; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "dllm-eval: option %s needs a value (see --help)\n", a);
            return 1;
        }
        v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--nll")) o->nll_file = v;
        else if (!strcmp(a, "--add")) o->add_file = v;
        else if (!strcmp(a, "--agree")) o->agree_file = v;
        else if (!strcmp(a, "--limit")) { if (!parse_count(a, v, 1, &o->limit)) return 1; }  /* 0 stays "all": the default, not a value */
        else if (!strcmp(a, "--batch")) { if (!parse_count(a, v, 1, &o->batch)) return 1; }
        else if (!strcmp(a, "--windows")) { if (!parse_count(a, v, 1, &o->windows)) return 1; }
        else if (!strcmp(a, "-n")) { if (!parse_count(a, v, 1, &o->n)) return 1; }
        else if (!strcmp(a, "--steps")) { if (!parse_count(a, v, 1, &o->steps)) return 1; }
        else if (!strcmp(a, "--block")) { if (!parse_count(a, v, 1, &o->block)) return 1; }
        else if (!strcmp(a, "--backend")) { if (!parse_backend(v, &o->backend)) return fail("bad --backend ", v); }
        else if (!strcmp(a, "--ref-backend")) { if (!parse_backend(v, &o->ref_backend)) return fail("bad --ref-backend ", v); }
        else if (!strcmp(a, "--lacache")) { if (!parse_lacache(v, &o->lacache)) return fail("bad --lacache ", v); }
        else if (!strcmp(a, "--ref-lacache")) { if (!parse_lacache(v, &o->ref_lacache)) return fail("bad --ref-lacache ", v); }
        else if (!strcmp(a, "--precision")) { if (!parse_precision(v, &o->precision)) return fail("bad --precision ", v); }
        else if (!strcmp(a, "--soloq-rotation")) {
            static const char *const rotations[] = {"default", "none", "hadamard", "rpbh", "mixer", "krpbh", "haar"};  /* dllm_soloq_rotation */
            int k = -1, r;
            for (r = 0; r < 7; r++)
                if (!strcmp(v, rotations[r])) k = r;
            if (k < 0) return fail("--soloq-rotation must be none, hadamard, rpbh, mixer, krpbh or haar, not ", v);
            o->soloq_rotation = (dllm_soloq_rotation)k;
        } else if (!strcmp(a, "--soloq-bias-correction")) {
            if (strcmp(v, "0") && strcmp(v, "1")) return fail("--soloq-bias-correction must be 0 or 1, not ", v);
            o->soloq_bias_correction = v[0] == '1';
        }
        else if (!strcmp(a, "--ref-precision")) { if (!parse_precision(v, &o->ref_precision)) return fail("bad --ref-precision ", v); }
        else if (!parse_sched(a, v, &o->sched)) { fprintf(stderr, "dllm-eval: bad value for %s: \"%s\"\n", a, v); return 1; }
    }
    if (!o->model_dir) return fail("no model: pass -m DIR (see --help)", NULL);
    if (!o->nll_file && !o->add_file && !o->agree_file) return fail("nothing to do: pass --nll, --add or --agree", NULL);
    if (o->n % o->block) { fprintf(stderr, "dllm-eval: -n %d is not a multiple of --block %d: pick a --block that divides it\n", o->n, o->block); return 1; }
    if (o->steps % (o->n / o->block)) {
        fprintf(stderr, "dllm-eval: --steps %d is not a multiple of the %d blocks (-n / --block)\n", o->steps, o->n / o->block);
        return 1;
    }
    if (o->steps > o->n && o->sched.unmask != DLLM_UNMASK_THRESHOLD && o->sched.unmask != DLLM_UNMASK_FACTOR) {
        fprintf(stderr, "dllm-eval: --steps %d is more than -n %d: a step commits at least one token, so at most %d steps commit anything: "
                "pass --steps %d or less\n", o->steps, o->n, o->n, o->n);
        return 1;
    }
    return 0;
}

/* Long evaluations report how far they are on stderr, when it is a terminal (a log gets the results only). */
static void progress(const char *what, long done, long total) {
    static int tty = -1;
    if (tty < 0) tty = isatty(STDERR_FILENO);
    if (!tty) return;
    if (done < total) fprintf(stderr, "\r%s %ld/%ld\033[K", what, done, total);
    else fprintf(stderr, "\r\033[K");
    fflush(stderr);
}

/* The number of '\n'-separated lines of text (a last line without '\n' counts). */
static long count_lines(const char *text, size_t len) {
    long n = 0;
    size_t i;
    for (i = 0; i < len; i++) n += text[i] == '\n';
    return n + (len && text[len - 1] != '\n');
}

/* The whole file, NUL-terminated; NULL after printing why not (naming the option that gave the path). */
static char *read_file(const char *option, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long size;
    if (!f) {
        fprintf(stderr, "dllm-eval: %s %s: %s\n", option, path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = (char *)malloc((size_t)size + 1))) {
        *len = fread(buf, 1, (size_t)size, f);
        buf[*len] = 0;
    }
    if (!buf) fprintf(stderr, "dllm-eval: %s %s: cannot read it\n", option, path);
    fclose(f);
    return buf;
}

/* Tokenizes text into a malloc'ed array (parse_special off: evaluation text is data, not markup). */
static int32_t *tokenize(const dllm_tokenizer *tok, const char *text, size_t len, int *n) {
    int32_t *ids;
    *n = 0;
    dllm_tokenize(tok, text, len, 0, NULL, 0, n);  /* reports the size needed */
    ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(*n > 0 ? *n : 1));
    if (ids && dllm_tokenize(tok, text, len, 0, ids, *n, n) != DLLM_OK) { free(ids); ids = NULL; }
    return ids;
}

typedef struct {
    dllm_model *model;
    dllm_tokenizer *tok;
    dllm_model_info info;
} loaded;

static dllm_ctx *make_ctx(const loaded *L, const options *o, dllm_backend backend, dllm_precision precision) {
    dllm_ctx_params cp = dllm_ctx_default_params();
    dllm_ctx *ctx = NULL;
    cp.backend = backend;
    cp.precision = precision;
    cp.soloq_rotation = o->soloq_rotation, cp.soloq_bias_correction = o->soloq_bias_correction;
    if (dllm_ctx_create(L->model, cp, &ctx) != DLLM_OK) fprintf(stderr, "dllm-eval: %s\n", dllm_last_error());
    return ctx;
}

/* -log softmax(row)[id] over V logits, in float64. */
static double token_nll(const float *row, int V, int32_t id) {
    double mx = row[0], z = 0;
    int v;
    for (v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    for (v = 0; v < V; v++) z += exp((double)row[v] - mx);
    return log(z) + mx - row[id];
}

/* Masked-token NLL, dllm protocol 1. */
static int eval_nll(const loaded *L, const options *o) {
    static const double ratios[3] = {0.15, 0.5, 0.9};
    const int W = 128, V = L->info.n_vocab;
    size_t len = 0;
    char *text = read_file("--nll", o->nll_file, &len);
    int n = 0, k, w, i, rc = 1, windows;
    int32_t *ids = text ? tokenize(L->tok, text, len, &n) : NULL, masked[128];
    float *logits = text ? (float *)malloc(sizeof(float) * (size_t)W * V) : NULL;
    dllm_ctx *ctx = text ? make_ctx(L, o, o->backend, o->precision) : NULL;
    if (!text || !ctx) goto done;  /* the reason is printed */
    if (!ids || !logits) { fail("out of memory evaluating NLL on ", o->nll_file); goto done; }
    windows = n / W < o->windows ? n / W : o->windows;
    if (windows == 0) { fprintf(stderr, "dllm-eval: --nll %s: %d tokens, fewer than one window of %d\n", o->nll_file, n, W); goto done; }
    printf("nll_tokens %d\nnll_windows %d\n", n, windows);
    for (k = 0; k < 3; k++) {
        double sum = 0;
        long count = 0;
        for (w = 0; w < windows; w++) {
            const int32_t *win = ids + (size_t)w * W;
            progress("NLL windows", (long)k * windows + w, 3L * windows);
            for (i = 0; i < W; i++)
                masked[i] = dllm_rng_uniform(1234, (uint32_t)i, (uint32_t)w, (uint32_t)k, 3) < ratios[k] ? L->info.mask_id : win[i];
            if (dllm_logits(ctx, masked, W, 0, W, logits, (size_t)W * V) != DLLM_OK) { fail("", dllm_ctx_last_error(ctx)); goto done; }
            for (i = 0; i < W; i++) {
                if (masked[i] != L->info.mask_id || win[i] == L->info.mask_id) continue;
                sum += token_nll(logits + (size_t)i * V, V, win[i]);
                count++;
            }
        }
        if (k == 2) progress("NLL windows", 3, 3);
        printf("nll_%.2f %.6f\nnll_%.2f_masked %ld\n", ratios[k], count ? sum / count : 0.0, ratios[k], count);
    }
    rc = 0;
done:
    dllm_ctx_free(ctx);
    free(logits);
    free(ids);
    free(text);
    return rc;
}

/* Decodes one prompt with the scheduler of p (the rest set here); out gets gen ids (the whole canvas after
 * the prompt, EOS included); forwards (if not NULL) adds the NFE. */
static dllm_status decode_with(dllm_ctx *ctx, dllm_gen_params p, const int32_t *prompt, int np, int gen, int steps, int block, dllm_lacache lc,
                               int32_t *out, int *n_out, long *forwards) {
    dllm_gen_stats st;
    dllm_status s;
    p.gen_length = gen;
    p.steps = steps;
    p.block_length = block;
    p.lacache = lc;
    p.stop_at_eos = 0;
    p.early_stop = 0;
    s = dllm_generate(ctx, prompt, np, p, out, gen, n_out, &st);
    if (s == DLLM_OK && forwards) *forwards += st.forwards;
    return s;
}

static dllm_status decode(dllm_ctx *ctx, const int32_t *prompt, int np, int gen, int steps, int block, dllm_lacache lc, int32_t *out, int *n_out) {
    return decode_with(ctx, dllm_gen_default_params(), prompt, np, gen, steps, block, lc, out, n_out, NULL);
}

/* Pseudo-log-likelihood of the n generated ids after the prompt: sum over them of -log p(id) from one forward
 * of prompt ++ gen with that position alone masked. Adds to *sum and *count; 0 on success. */
static int pseudo_nll(dllm_ctx *ctx, const loaded *L, const int32_t *prompt, int np, const int32_t *gen, int n, double *sum, long *count) {
    const int T = np + n, V = L->info.n_vocab;
    int32_t *canvas = (int32_t *)malloc(sizeof(int32_t) * (size_t)T);
    float *row = (float *)malloc(sizeof(float) * (size_t)V);
    int i, rc = 1;
    if (!canvas || !row) goto done;
    memcpy(canvas, prompt, sizeof(int32_t) * (size_t)np);
    memcpy(canvas + np, gen, sizeof(int32_t) * (size_t)n);
    for (i = np; i < T; i++) {
        canvas[i] = L->info.mask_id;
        if (dllm_logits(ctx, canvas, T, i, i + 1, row, (size_t)V) != DLLM_OK) goto done;
        canvas[i] = gen[i - np];
        *sum += token_nll(row, V, canvas[i]);
        (*count)++;
    }
    rc = 0;
done:
    free(canvas);
    free(row);
    return rc;
}

/* Is line[0..len) "a+b=sum" in decimal digits? Sets *eq to the '='. */
static int is_add_problem(const char *line, size_t len, size_t *eq) {
    size_t i = 0, start;
    int part;
    for (part = 0; part < 3; part++) {
        start = i;
        while (i < len && line[i] >= '0' && line[i] <= '9') i++;
        if (i == start) return 0;
        if (part == 0 && (i == len || line[i++] != '+')) return 0;
        if (part == 1) {
            if (i == len || line[i] != '=') return 0;
            *eq = i++;
        }
    }
    return i == len;
}

/* One --add problem waiting for its answer: the prompt "a+b=" and the digits of the sum. */
typedef struct {
    int32_t *prompt;
    int np;
    const char *want;
    size_t want_len;
} add_problem;

/* Is the decode of out[0..n_out) before the first EOS/EoT the expected sum? */
static int add_answer_is(const loaded *L, const int32_t *out, int n_out, const add_problem *p) {
    char answer[64];
    size_t alen = 0;
    int i, n_ans = 0;
    for (i = 0; i < n_out && out[i] != L->info.eos_id && out[i] != L->info.eot_id; i++) n_ans++;
    answer[0] = 0;
    dllm_detokenize(L->tok, out, n_ans, 1, answer, sizeof answer, &alen);
    return strlen(answer) == p->want_len && !memcmp(answer, p->want, p->want_len);
}

/* Decodes the n pending problems (--batch 1: dllm_generate; more: dllm_generate_batch), adds the right answers to
 * *correct and frees the prompts; 0 on success, 1 after printing the first failure. */
static int solve_adds(dllm_ctx *ctx, const loaded *L, const options *o, add_problem *pending, int n, int *correct) {
    enum { gen = 8 };
    dllm_batch_item *items = n > 1 ? (dllm_batch_item *)calloc((size_t)n, sizeof *items) : NULL;
    dllm_batch_result *results = n > 1 ? (dllm_batch_result *)calloc((size_t)n, sizeof *results) : NULL;
    int32_t *outs = (int32_t *)malloc(sizeof(int32_t) * gen * (size_t)n);
    dllm_gen_params p = dllm_gen_default_params();
    int i, n_out = 0, rc = 1;
    if (!outs || (n > 1 && (!items || !results))) { fail("out of memory", NULL); goto done; }
    if (n == 1) {
        if (decode(ctx, pending[0].prompt, pending[0].np, gen, gen, gen, o->lacache, outs, &n_out) != DLLM_OK) { fail("", dllm_last_error()); goto done; }
        *correct += add_answer_is(L, outs, n_out, &pending[0]);
        rc = 0;
        goto done;
    }
    p.gen_length = p.steps = p.block_length = gen;  /* decode_with's parameters */
    p.lacache = o->lacache;
    p.stop_at_eos = 0;
    p.early_stop = 0;
    for (i = 0; i < n; i++) {
        items[i].prompt = pending[i].prompt, items[i].n_prompt = pending[i].np, items[i].params = p;
        items[i].out = outs + (size_t)i * gen, items[i].out_capacity = gen;
    }
    dllm_generate_batch(ctx, items, n, results, NULL);
    for (i = 0; i < n; i++) {
        if (results[i].status != DLLM_OK) { fail("", results[i].error); goto done; }
        *correct += add_answer_is(L, items[i].out, results[i].n_out, &pending[i]);
    }
    rc = 0;
done:
    for (i = 0; i < n; i++) free(pending[i].prompt);
    free(items);
    free(results);
    free(outs);
    return rc;
}

/* Exact match on "a+b=sum" lines (empty lines skipped): the answer is the decode of the ids before the first
 * EOS/EoT. A line of another shape is an error naming it. */
static int eval_add(const loaded *L, const options *o) {
    const int gen = 8;
    size_t len = 0, pos = 0;
    char *text = read_file("--add", o->add_file, &len);
    dllm_ctx *ctx = text ? make_ctx(L, o, o->backend, o->precision) : NULL;
    add_problem *pending = (add_problem *)calloc((size_t)o->batch, sizeof *pending);
    int total = 0, correct = 0, line_no = 0, n_pending = 0, rc = 1, i;
    long lines = text ? count_lines(text, len) : 0;
    if (!text || !ctx) goto done;
    if (!pending) { fail("out of memory", NULL); goto done; }
    while (pos < len && (!o->limit || total < o->limit)) {
        char *line = text + pos, *nl = (char *)memchr(line, '\n', len - pos);
        size_t line_len = nl ? (size_t)(nl - line) : len - pos, eq = 0;
        int np = 0;
        int32_t *prompt;
        pos += line_len + 1;
        line_no++;
        if (line_len && line[line_len - 1] == '\r') line_len--;
        if (!line_len) continue;
        if (!is_add_problem(line, line_len, &eq)) {
            fprintf(stderr, "dllm-eval: --add %s:%d: expected a line \"a+b=sum\" in decimal digits, got \"%.*s\"\n", o->add_file, line_no,
                    line_len > 40 ? 40 : (int)line_len, line);
            goto done;
        }
        progress("--add problems", line_no, lines);
        prompt = tokenize(L->tok, line, eq + 1, &np);
        if (prompt && np + gen > L->info.max_seq_len) {
            fprintf(stderr, "dllm-eval: --add %s:%d: the problem is %d tokens; with the %d answer tokens that exceeds the model's context of %d\n",
                    o->add_file, line_no, np, gen, L->info.max_seq_len);
            free(prompt);
            goto done;
        }
        if (!prompt) {
            fail("", dllm_last_error());
            goto done;
        }
        pending[n_pending].prompt = prompt, pending[n_pending].np = np;
        pending[n_pending].want = line + eq + 1, pending[n_pending].want_len = line_len - eq - 1;
        total++;
        if (++n_pending == o->batch) {
            n_pending = 0;
            if (solve_adds(ctx, L, o, pending, o->batch, &correct)) goto done;
        }
    }
    i = n_pending, n_pending = 0;
    if (i && solve_adds(ctx, L, o, pending, i, &correct)) goto done;
    if (total == 0) {  /* an exact match over nothing is no result */
        fprintf(stderr, "dllm-eval: --add %s holds no problem: expected lines \"a+b=sum\" in decimal digits\n", o->add_file);
        goto done;
    }
    progress("--add problems", lines, lines);
    printf("add_problems %d\nadd_correct %d\nexact_match %.4f\n", total, correct, total ? (double)correct / total : 0.0);
    rc = 0;
done:
    for (i = 0; pending && i < n_pending; i++) free(pending[i].prompt);
    free(pending);
    free(text);
    dllm_ctx_free(ctx);
    return rc;
}

/* Per-token and per-sequence agreement of the generated ids between two configurations. */
static int eval_agree(const loaded *L, const options *o) {
    size_t len = 0;
    char *text = read_file("--agree", o->agree_file, &len), *line, *save = NULL;
    long lines = text ? count_lines(text, len) : 0;
    const int same_ctx = o->backend == o->ref_backend && o->precision == o->ref_precision;
    dllm_ctx *a = make_ctx(L, o, o->backend, o->precision), *b = same_ctx ? a : make_ctx(L, o, o->ref_backend, o->ref_precision);
    int32_t *ga = (int32_t *)malloc(sizeof(int32_t) * (size_t)o->n), *gb = (int32_t *)malloc(sizeof(int32_t) * (size_t)o->n);
    long tokens = 0, same_tokens = 0, nfe_a = 0, nfe_b = 0, pll_na = 0, pll_nb = 0;
    double pll_a = 0, pll_b = 0;
    int seqs = 0, same_seqs = 0, rc = 1;
    if (!text) goto done;  /* the reason is printed */
    if (!a || !b || !ga || !gb) { fail("cannot evaluate agreement on ", o->agree_file); goto done; }
    for (line = strtok_r(text, "\n", &save); line && (!o->limit || seqs < o->limit); line = strtok_r(NULL, "\n", &save)) {
        int np = 0, na = 0, nb = 0, i, same = 1;
        int32_t *prompt = tokenize(L->tok, line, strlen(line), &np);
        progress("--agree prompts", seqs, o->limit && o->limit < lines ? o->limit : lines);
        if (!prompt || decode_with(a, o->sched, prompt, np, o->n, o->steps, o->block, o->lacache, ga, &na, &nfe_a) != DLLM_OK ||
            decode_with(b, dllm_gen_default_params(), prompt, np, o->n, o->steps, o->block, o->ref_lacache, gb, &nb, &nfe_b) != DLLM_OK ||
            pseudo_nll(b, L, prompt, np, ga, na, &pll_a, &pll_na) || pseudo_nll(b, L, prompt, np, gb, nb, &pll_b, &pll_nb)) {
            free(prompt);
            fail("", dllm_last_error());
            goto done;
        }
        for (i = 0; i < na && i < nb; i++) {
            same_tokens += ga[i] == gb[i];
            same &= ga[i] == gb[i];
        }
        tokens += na;
        same_seqs += same && na == nb;
        seqs++;
        free(prompt);
    }
    progress("--agree prompts", 1, 1);
    if (seqs == 0) {
        fprintf(stderr, "dllm-eval: --agree %s holds no prompt: expected one prompt a line\n", o->agree_file);
        goto done;
    }
    printf("agree_sequences %d\nagree_token %.4f\nagree_sequence %.4f\n", seqs, tokens ? (double)same_tokens / tokens : 0.0,
           seqs ? (double)same_seqs / seqs : 0.0);
    printf("nfe %ld\nref_nfe %ld\npll %.4f\nref_pll %.4f\n", nfe_a, nfe_b, pll_na ? pll_a / pll_na : 0.0, pll_nb ? pll_b / pll_nb : 0.0);
    rc = 0;
done:
    if (b != a) dllm_ctx_free(b);
    dllm_ctx_free(a);
    free(ga);
    free(gb);
    free(text);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    loaded L;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 2 ? 0 : 1;
    memset(&L, 0, sizeof L);
    if (dllm_model_load(o.model_dir, dllm_model_default_params(), &L.model) != DLLM_OK) {
        fprintf(stderr, "dllm-eval: %s (-m)\n", dllm_last_error());
        return 1;
    }
    if (dllm_tokenizer_load(o.model_dir, &L.tok) != DLLM_OK || dllm_tokenizer_check_model(L.tok, L.model) != DLLM_OK) {
        rc = fail("", dllm_last_error());
        goto done;
    }
    dllm_model_get_info(L.model, &L.info);
    if (o.nll_file) rc |= eval_nll(&L, &o);
    if (!rc && o.add_file) rc |= eval_add(&L, &o);
    if (!rc && o.agree_file) rc |= eval_agree(&L, &o);
done:
    dllm_tokenizer_free(L.tok);
    dllm_model_free(L.model);
    return rc;
}
