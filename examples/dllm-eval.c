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
 * --add FILE    exact match on lines "a+b=sum": prompt "a+b=", gen = steps = block = 8, greedy.
 * --agree FILE  one raw text prompt per line, decoded twice: with the configuration under test and with the
 *               reference (--ref-*); prints per-token and per-sequence agreement of the generated ids, the
 *               forwards (NFE) each took and the pseudo-log-likelihood of each one's output: the mean over
 *               generated tokens of -log p(token) with that token alone masked, one forward a token (a
 *               quality measure of a masked model's own; lower is more likely). The scheduler options
 *               (--cache, --threshold, --factor, --dpad, --alg, --timesteps) apply to the configuration under
 *               test only: the reference is LLaDA's vanilla decoding.
 * --precision bf16|fp8|fp8-all|soloq-n|soloq-i|soloq-c|rtn-w4a4 (or a -w4a16 form) sets dllm_ctx_params.precision
 * for every mode (--ref-precision: the reference's).
 * Each result is also printed as a "key value" line for scripts. Exit 0 on success, 1 with one line on
 * stderr for bad usage or a bad model.
 */
#include "../dllm.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *model_dir, *nll_file, *add_file, *agree_file;
    int limit, windows, n, steps, block;
    dllm_backend backend, ref_backend;
    dllm_lacache lacache, ref_lacache;
    dllm_precision precision, ref_precision;
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
           "  --limit N               use the first N problems / prompts only\n"
           "  --agree FILE            generation agreement against the reference configuration\n"
           "  -n N, --steps N, --block N   decoding for --agree (default 32, 32, 8)\n"
           "  --backend B, --ref-backend B   auto (default), cpu or gpu\n"
           "  --lacache M, --ref-lacache M   on (default), truncate or off\n"
           "  --precision P, --ref-precision P   bf16 (default), fp8 (FFN of layers >= 1), fp8-all, or SoloQ W4A4\n"
           "                          (CPU backend): soloq-n, soloq-i, soloq-c, rtn-w4a4, and each -w4a16 (weight-only)\n"
           "  scheduler under test (--agree; the reference decodes vanilla):\n"
           "  --cache none|prefix|dual  Fast-dLLM K/V cache (approximate)\n"
           "  --threshold T, --factor F  Fast-dLLM parallel decoding\n"
           "  --dpad W                DPad Gaussian suffix dropout over a window of W (k 4, scale 2)\n"
           "  --alg A                 low_confidence (default), topk_margin, entropy, origin or random\n"
           "  --timesteps             Dream's per-step count (eps 1e-3); --alg origin needs it\n");
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

static int parse_args(int argc, char **argv, options *o) {
    int i;
    memset(o, 0, sizeof *o);
    o->windows = 64; o->n = 32; o->steps = 32; o->block = 8;
    o->backend = o->ref_backend = DLLM_BACKEND_AUTO;
    o->lacache = DLLM_LACACHE_ON;
    o->ref_lacache = DLLM_LACACHE_OFF;
    o->precision = o->ref_precision = DLLM_PRECISION_BF16;
    o->sched = dllm_gen_default_params();
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); exit(0); }
        if (!strcmp(a, "--timesteps")) { o->sched.unmask = DLLM_UNMASK_TIMESTEPS; continue; }
        if (!v) return fail("missing value after ", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--nll")) o->nll_file = v;
        else if (!strcmp(a, "--add")) o->add_file = v;
        else if (!strcmp(a, "--agree")) o->agree_file = v;
        else if (!strcmp(a, "--limit")) o->limit = atoi(v);
        else if (!strcmp(a, "--windows")) o->windows = atoi(v);
        else if (!strcmp(a, "-n")) o->n = atoi(v);
        else if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--block")) o->block = atoi(v);
        else if (!strcmp(a, "--backend")) { if (!parse_backend(v, &o->backend)) return fail("bad --backend ", v); }
        else if (!strcmp(a, "--ref-backend")) { if (!parse_backend(v, &o->ref_backend)) return fail("bad --ref-backend ", v); }
        else if (!strcmp(a, "--lacache")) { if (!parse_lacache(v, &o->lacache)) return fail("bad --lacache ", v); }
        else if (!strcmp(a, "--ref-lacache")) { if (!parse_lacache(v, &o->ref_lacache)) return fail("bad --ref-lacache ", v); }
        else if (!strcmp(a, "--precision")) { if (!parse_precision(v, &o->precision)) return fail("bad --precision ", v); }
        else if (!strcmp(a, "--ref-precision")) { if (!parse_precision(v, &o->ref_precision)) return fail("bad --ref-precision ", v); }
        else if (!parse_sched(a, v, &o->sched)) return fail("unknown option or bad value: ", a);
    }
    if (!o->model_dir) return fail("no model: pass -m DIR (see --help)", NULL);
    if (!o->nll_file && !o->add_file && !o->agree_file) return fail("nothing to do: pass --nll, --add or --agree", NULL);
    if (o->windows <= 0 || o->n <= 0 || o->steps <= 0 || o->block <= 0 || o->limit < 0) return fail("counts must be positive", NULL);
    return 0;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long size;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = (char *)malloc((size_t)size + 1))) {
        *len = fread(buf, 1, (size_t)size, f);
        buf[*len] = 0;
    }
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

static dllm_ctx *make_ctx(const loaded *L, dllm_backend backend, dllm_precision precision) {
    dllm_ctx_params cp = dllm_ctx_default_params();
    dllm_ctx *ctx = NULL;
    cp.backend = backend;
    cp.precision = precision;
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
    char *text = read_file(o->nll_file, &len);
    int n = 0, k, w, i, rc = 1, windows;
    int32_t *ids = text ? tokenize(L->tok, text, len, &n) : NULL, masked[128];
    float *logits = (float *)malloc(sizeof(float) * (size_t)W * V);
    dllm_ctx *ctx = make_ctx(L, o->backend, o->precision);
    if (!text || !ids || !logits || !ctx) { fail("cannot evaluate NLL on ", o->nll_file); goto done; }
    windows = n / W < o->windows ? n / W : o->windows;
    printf("nll_tokens %d\nnll_windows %d\n", n, windows);
    for (k = 0; k < 3; k++) {
        double sum = 0;
        long count = 0;
        for (w = 0; w < windows; w++) {
            const int32_t *win = ids + (size_t)w * W;
            for (i = 0; i < W; i++)
                masked[i] = dllm_rng_uniform(1234, (uint32_t)i, (uint32_t)w, (uint32_t)k, 3) < ratios[k] ? L->info.mask_id : win[i];
            if (dllm_logits(ctx, masked, W, 0, W, logits, (size_t)W * V) != DLLM_OK) { fail("", dllm_ctx_last_error(ctx)); goto done; }
            for (i = 0; i < W; i++) {
                if (masked[i] != L->info.mask_id || win[i] == L->info.mask_id) continue;
                sum += token_nll(logits + (size_t)i * V, V, win[i]);
                count++;
            }
        }
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

/* Exact match on "a+b=sum" lines: the answer is the decode of the ids before the first EOS/EoT. */
static int eval_add(const loaded *L, const options *o) {
    size_t len = 0;
    char *text = read_file(o->add_file, &len), *line, *save = NULL;
    dllm_ctx *ctx = make_ctx(L, o->backend, o->precision);
    int total = 0, correct = 0;
    if (!text || !ctx) { free(text); dllm_ctx_free(ctx); return fail("cannot evaluate ", o->add_file); }
    for (line = strtok_r(text, "\n", &save); line && (!o->limit || total < o->limit); line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        int np = 0, n_out = 0, i, n_ans = 0;
        int32_t out[8], *prompt;
        char answer[64];
        size_t alen = 0;
        if (!eq) continue;
        prompt = tokenize(L->tok, line, (size_t)(eq - line + 1), &np);
        if (!prompt || decode(ctx, prompt, np, 8, 8, 8, o->lacache, out, &n_out) != DLLM_OK) { free(prompt); free(text); dllm_ctx_free(ctx); return fail("", dllm_last_error()); }
        for (i = 0; i < n_out && out[i] != L->info.eos_id && out[i] != L->info.eot_id; i++) n_ans++;
        answer[0] = 0;
        dllm_detokenize(L->tok, out, n_ans, 1, answer, sizeof answer, &alen);
        correct += strcmp(answer, eq + 1) == 0;
        total++;
        free(prompt);
    }
    printf("add_problems %d\nadd_correct %d\nexact_match %.4f\n", total, correct, total ? (double)correct / total : 0.0);
    free(text);
    dllm_ctx_free(ctx);
    return 0;
}

/* Per-token and per-sequence agreement of the generated ids between two configurations. */
static int eval_agree(const loaded *L, const options *o) {
    size_t len = 0;
    char *text = read_file(o->agree_file, &len), *line, *save = NULL;
    const int same_ctx = o->backend == o->ref_backend && o->precision == o->ref_precision;
    dllm_ctx *a = make_ctx(L, o->backend, o->precision), *b = same_ctx ? a : make_ctx(L, o->ref_backend, o->ref_precision);
    int32_t *ga = (int32_t *)malloc(sizeof(int32_t) * (size_t)o->n), *gb = (int32_t *)malloc(sizeof(int32_t) * (size_t)o->n);
    long tokens = 0, same_tokens = 0, nfe_a = 0, nfe_b = 0, pll_na = 0, pll_nb = 0;
    double pll_a = 0, pll_b = 0;
    int seqs = 0, same_seqs = 0, rc = 1;
    if (!text || !a || !b || !ga || !gb) { fail("cannot evaluate agreement on ", o->agree_file); goto done; }
    for (line = strtok_r(text, "\n", &save); line && (!o->limit || seqs < o->limit); line = strtok_r(NULL, "\n", &save)) {
        int np = 0, na = 0, nb = 0, i, same = 1;
        int32_t *prompt = tokenize(L->tok, line, strlen(line), &np);
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
    int rc = 0;
    if (parse_args(argc, argv, &o)) return 1;
    memset(&L, 0, sizeof L);
    if (dllm_model_load(o.model_dir, dllm_model_default_params(), &L.model) != DLLM_OK) return fail("", dllm_last_error());
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
