/* dllm-generate: decode a prompt with a diffusion LLM through the public dllm API.
 *
 *   build/dllm-generate -m LLaDA-8B-Instruct -p "Why is the sky blue?" -n 128 --steps 128 --block 32
 *   build/dllm-generate -m tests/data/tiny-llada --ids "5 17 42" -n 32 --steps 32 --block 8 --print-ids
 *   build/dllm-generate -m LLaDA-8B-Instruct -p "..." -n 256 --block 32 --threshold 0.9 --cache dual --precision fp8
 *
 * A text prompt (-p) goes through the model's chat template (unless --raw) and tokenizer; the answer is
 * streamed to stdout as its prefix gets committed, or, with --visual, the whole canvas is redrawn after
 * every step with the masks shown. A stats line ends the run on stderr. Exit status 0 on success; on
 * bad usage or a bad model, 1 with a one-line message on stderr. Written in C99 against dllm.h only: it
 * doubles as an example of the API.
 */
#include "../dllm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *model_dir;
    const char *ids_text;
    const char *prompt;
    dllm_gen_params gen;
    dllm_ctx_params ctx;
    int print_ids;
    int verbose;
    int progress;
    int raw;
    int visual;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dllm-generate -m DIR (-p \"text\" | --ids \"I J K\") [options]\n"
            "\n"
            "Decodes a prompt with LLaDA's semi-autoregressive block schedule (generate.py semantics), Fast-dLLM's\n"
            "parallel decoding, DPad or Dream's samplers.\n"
            "\n"
            "  -m, --model DIR        Hugging Face model directory (config.json + safetensors + tokenizer files)\n"
            "  -p, --prompt TEXT      prompt as text: the model's chat template is applied, the answer streamed\n"
            "  --raw                  with -p: tokenize the text as given, without the chat template\n"
            "  --visual               with -p: redraw the whole canvas after every step, masks shown as '_';\n"
            "                         alias --diffusion-visual\n"
            "  --ids \"I J K\"          prompt as token ids, separated by spaces (no tokenizer needed)\n"
            "  -n, --gen-length N     tokens to generate (default 128); alias --n-predict\n"
            "  --steps N              denoising steps in total (default: gen length); alias --diffusion-steps\n"
            "  --block N              block length (default 32); alias --diffusion-block-length\n"
            "  --temp T               temperature, 0 = greedy (default 0)\n"
            "  --alg MODE             which masks a step commits first: low_confidence (default, highest p(x0); alias\n"
            "                         maskgit_plus), topk_margin (p(top1) - p(top2)), entropy (sum p log p), random, or\n"
            "                         origin (see --timesteps); alias --remask. topk_margin and entropy take p from\n"
            "                         softmax(logits / temp) as Dream does, low_confidence only with --timesteps\n"
            "  --lacache MODE         GPU exact caching: on (default), truncate (LM head on the block only) or off;\n"
            "                         every mode gives the same tokens\n"
            "  --cfg S                classifier-free guidance scale, 0 = off (default 0)\n"
            "\n"
            "Fast-dLLM and DPad (compose with each other and with --lacache):\n"
            "  --threshold TAU        parallel decoding: each step commits the best candidate and every one with\n"
            "                         confidence >= TAU; a block steps until it is full (--steps is ignored);\n"
            "                         TAU in (0, 1], or <= 0 with --alg entropy (minus the entropy, in nats)\n"
            "  --factor F             parallel decoding, factor rule: the n-th best needs conf >= 1 - F/(n+1)\n"
            "  --cache MODE           none (default, exact), prefix or dual: Fast-dLLM's K/V caches, APPROXIMATE\n"
            "                         (K/V outside the forwarded rows are reused stale within a block)\n"
            "  --dpad-window W        DPad suffix dropout: each block sees a random subset of the next W masks\n"
            "                         (changes the output by design)\n"
            "  --dpad-k K             DPad Gaussian sharpness (default 4)\n"
            "  --dpad-scale A         DPad Gaussian scale (default 2)\n"
            "  --dpad-uniform N       DPad: keep N positions drawn uniformly from the window instead\n"
            "  --early-stop           after a block with EOS/EoT, fill the rest with it and stop\n"
            "  Paper settings, LLaDA-8B-Instruct GSM8K: -n 256 --block 32 --threshold 0.9 --cache dual\n"
            "                         (+ --dpad-window 256 --dpad-k 4 --dpad-scale 2 --early-stop for DPad)\n"
            "\n"
            "Dream's samplers (generation_utils.py; any model, composing with blocks and caches):\n"
            "  --timesteps            Dream's count: with t = linspace(1, eps, steps per block + 1), step i of a block\n"
            "                         commits floor(n (1 - t[i+1]/t[i])) of its n masks left (0 happens), all of them\n"
            "                         at the last step. --alg origin implies it: each mask transfers independently\n"
            "                         with probability 1 - t[i+1]/t[i]\n"
            "  --eps E                the last timestep, in (0, 1) (default 1e-3)\n"
            "  --alg-temp T           > 0: a step samples its positions from softmax(confidence / T) without\n"
            "                         replacement instead of taking the top ones (default 0)\n"
            "  Dream's README settings (alg entropy, 512 steps, temperature 0.2, the whole answer as one block):\n"
            "                         -n 512 --steps 512 --block 512 --temp 0.2 --alg entropy --timesteps\n"
            "                         (its top_p 0.95 is not supported: dllm samples from the full softmax)\n"
            "\n"
            "  --seed N               seed of every random draw (default 0)\n"
            "  --logits-eos-inf       forbid the EOS token\n"
            "  --eos-eot-last         commit EOS/EoT predictions last (confidence_eos_eot_inf)\n"
            "  --no-stop-at-eos       print the whole generation, EOS/EoT included\n"
            "  --backend B            auto (default), cpu or gpu\n"
            "  --precision P          bf16 (default), fp8 or fp8-all. fp8: the FFN linears of layers >= 1 in FP8 E4M3\n"
            "                         (LaCache's scheme; block-scaled GEMMs on sm_90 and sm_89, other GPUs run BF16\n"
            "                         with a warning); fp8-all also quantises the attention projections (beyond\n"
            "                         the paper). The CPU backend computes the same function. soloq-n, soloq-i,\n"
            "                         soloq-c, rtn-w4a4 (and -w4a16 forms): SoloQ 4-bit, CPU backend only for now\n"
            "  --threads N            CPU backend threads (default: all)\n"
            "  --print-ids            print the generated ids on one line starting with \"ids:\" (after the text)\n"
            "  --progress             show a progress line on stderr\n"
            "  -v, --verbose          library log messages at info level\n"
            "  -h, --help             this text\n");
}

static int fail(const char *fmt, const char *arg) {
    fprintf(stderr, "dllm-generate: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    return 1;
}

static int parse_int(const char *s, long lo, long hi, int *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_double(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !end || *end || end == s) return 0;
    *out = v;
    return 1;
}

/* --alg / --remask: dllm's names and Dream's; returns 0 for an unknown name. */
static int parse_alg(const char *s, dllm_remasking *out) {
    static const struct { const char *name; dllm_remasking value; } algs[] = {
        {"low_confidence", DLLM_REMASK_LOW_CONFIDENCE}, {"maskgit_plus", DLLM_REMASK_LOW_CONFIDENCE}, {"topk_margin", DLLM_REMASK_MARGIN},
        {"entropy", DLLM_REMASK_ENTROPY}, {"origin", DLLM_REMASK_ORIGIN}, {"random", DLLM_REMASK_RANDOM}};
    size_t i;
    for (i = 0; i < sizeof algs / sizeof algs[0]; i++)
        if (!strcmp(s, algs[i].name)) { *out = algs[i].value; return 1; }
    return 0;
}

static int parse_float(const char *s, float *out) {
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || !end || *end || end == s) return 0;
    *out = v;
    return 1;
}

/* Parses "I J K" into a malloc'ed array; returns the count or -1. */
static int parse_ids(const char *text, int32_t **out) {
    int cap = 16, n = 0;
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)cap);
    const char *p = text;
    if (!ids) return -1;
    while (*p) {
        char *end = NULL;
        long v;
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        errno = 0;
        v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX) { free(ids); return -1; }
        if (n == cap) {
            int32_t *grown = (int32_t *)realloc(ids, sizeof(int32_t) * (size_t)(cap *= 2));
            if (!grown) { free(ids); return -1; }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    return n;
}

/* Returns 0 on success, 1 after printing an error, 2 after printing help. */
static int parse_args(int argc, char **argv, options *o) {
    int steps_given = 0, i;
    o->gen = dllm_gen_default_params();
    o->ctx = dllm_ctx_default_params();
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes_value = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 2; }
        else if (!strcmp(a, "--print-ids")) { o->print_ids = 1; takes_value = 0; }
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { o->verbose = 1; takes_value = 0; }
        else if (!strcmp(a, "--progress")) { o->progress = 1; takes_value = 0; }
        else if (!strcmp(a, "--logits-eos-inf")) { o->gen.logits_eos_inf = 1; takes_value = 0; }
        else if (!strcmp(a, "--eos-eot-last")) { o->gen.confidence_eos_eot_inf = 1; takes_value = 0; }
        else if (!strcmp(a, "--no-stop-at-eos")) { o->gen.stop_at_eos = 0; takes_value = 0; }
        else if (!strcmp(a, "--raw")) { o->raw = 1; takes_value = 0; }
        else if (!strcmp(a, "--visual") || !strcmp(a, "--diffusion-visual")) { o->visual = 1; takes_value = 0; }
        else if (!strcmp(a, "--early-stop")) { o->gen.early_stop = 1; takes_value = 0; }
        else if (!strcmp(a, "--timesteps")) { o->gen.unmask = DLLM_UNMASK_TIMESTEPS; takes_value = 0; }
        else if (!v) return fail("option %s needs a value (see --help)", a);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--ids")) o->ids_text = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--gen-length") || !strcmp(a, "--n-predict")) { if (!parse_int(v, 1, 1 << 20, &o->gen.gen_length)) return fail("bad gen length \"%s\"", v); }
        else if (!strcmp(a, "--steps") || !strcmp(a, "--diffusion-steps")) { if (!parse_int(v, 1, 1 << 24, &o->gen.steps)) return fail("bad step count \"%s\"", v); steps_given = 1; }
        else if (!strcmp(a, "--block") || !strcmp(a, "--diffusion-block-length")) { if (!parse_int(v, 1, 1 << 20, &o->gen.block_length)) return fail("bad block length \"%s\"", v); }
        else if (!strcmp(a, "--temp")) { if (!parse_float(v, &o->gen.temperature) || o->gen.temperature < 0) return fail("bad temperature \"%s\"", v); }
        else if (!strcmp(a, "--cfg")) { if (!parse_float(v, &o->gen.cfg_scale) || o->gen.cfg_scale < 0) return fail("bad cfg scale \"%s\"", v); }
        else if (!strcmp(a, "--seed")) { char *end = NULL; errno = 0; o->gen.seed = strtoull(v, &end, 0); if (errno || !end || *end || end == v) return fail("bad seed \"%s\"", v); }
        else if (!strcmp(a, "--threshold")) { if (!parse_double(v, &o->gen.threshold)) return fail("bad threshold \"%s\"", v); o->gen.unmask = DLLM_UNMASK_THRESHOLD; }
        else if (!strcmp(a, "--eps")) { if (!parse_double(v, &o->gen.eps) || !(o->gen.eps > 0 && o->gen.eps < 1)) return fail("--eps must be in (0, 1), not \"%s\"", v); }
        else if (!strcmp(a, "--alg-temp")) { if (!parse_double(v, &o->gen.alg_temp) || !(o->gen.alg_temp >= 0)) return fail("bad --alg-temp \"%s\"", v); }
        else if (!strcmp(a, "--factor")) { float f; if (!parse_float(v, &f) || !(f > 0)) return fail("--factor must be > 0, not \"%s\"", v); o->gen.unmask = DLLM_UNMASK_FACTOR; o->gen.factor = f; }
        else if (!strcmp(a, "--dpad-window")) { if (!parse_int(v, 2, 1 << 20, &o->gen.dpad_window)) return fail("bad DPad window \"%s\" (at least 2)", v); if (o->gen.dpad == DLLM_DPAD_OFF) o->gen.dpad = DLLM_DPAD_GAUSSIAN; }
        else if (!strcmp(a, "--dpad-k")) { if (!parse_float(v, &o->gen.dpad_k) || !(o->gen.dpad_k >= 0)) return fail("bad DPad k \"%s\"", v); }
        else if (!strcmp(a, "--dpad-scale")) { if (!parse_float(v, &o->gen.dpad_scale) || !(o->gen.dpad_scale >= 0)) return fail("bad DPad scale \"%s\"", v); }
        else if (!strcmp(a, "--dpad-uniform")) { if (!parse_int(v, 0, 1 << 20, &o->gen.dpad_n)) return fail("bad DPad count \"%s\"", v); o->gen.dpad = DLLM_DPAD_UNIFORM; }
        else if (!strcmp(a, "--cache")) {
            if (!strcmp(v, "none")) o->gen.kv_cache = DLLM_KV_CACHE_NONE;
            else if (!strcmp(v, "prefix")) o->gen.kv_cache = DLLM_KV_CACHE_PREFIX;
            else if (!strcmp(v, "dual")) o->gen.kv_cache = DLLM_KV_CACHE_DUAL;
            else return fail("--cache must be none, prefix or dual, not \"%s\"", v);
        }
        else if (!strcmp(a, "--threads")) { if (!parse_int(v, 0, 1024, &o->ctx.n_threads)) return fail("bad thread count \"%s\"", v); }
        else if (!strcmp(a, "--alg") || !strcmp(a, "--remask")) {
            if (!parse_alg(v, &o->gen.remasking)) return fail("--alg must be low_confidence, maskgit_plus, topk_margin, entropy, origin or random, not \"%s\"", v);
        } else if (!strcmp(a, "--lacache")) {
            if (!strcmp(v, "on")) o->gen.lacache = DLLM_LACACHE_ON;
            else if (!strcmp(v, "truncate")) o->gen.lacache = DLLM_LACACHE_TRUNCATE;
            else if (!strcmp(v, "off")) o->gen.lacache = DLLM_LACACHE_OFF;
            else return fail("--lacache must be on, truncate or off, not \"%s\"", v);
        } else if (!strcmp(a, "--precision")) {
            if (!strcmp(v, "bf16")) o->ctx.precision = DLLM_PRECISION_BF16;
            else if (!strcmp(v, "fp8")) o->ctx.precision = DLLM_PRECISION_FP8_FFN;
            else if (!strcmp(v, "fp8-all")) o->ctx.precision = DLLM_PRECISION_FP8_ALL;
            else {
                static const char *const soloq[] = {"soloq-n", "soloq-i", "soloq-c", "rtn-w4a4", "soloq-n-w4a16", "soloq-i-w4a16", "soloq-c-w4a16", "rtn-w4a16"};
                int i = 0;
                while (i < 8 && strcmp(v, soloq[i])) i++;
                if (i == 8) return fail("--precision must be bf16, fp8, fp8-all, soloq-n, soloq-i, soloq-c, rtn-w4a4 or a -w4a16 form, not \"%s\"", v);
                o->ctx.precision = (dllm_precision)(DLLM_PRECISION_SOLOQ_N + i);
            }
        } else if (!strcmp(a, "--backend")) {
            if (!strcmp(v, "auto")) o->ctx.backend = DLLM_BACKEND_AUTO;
            else if (!strcmp(v, "cpu")) o->ctx.backend = DLLM_BACKEND_CPU;
            else if (!strcmp(v, "gpu")) o->ctx.backend = DLLM_BACKEND_GPU;
            else return fail("--backend must be auto, cpu or gpu, not \"%s\"", v);
        } else return fail("unknown option %s (see --help)", a);
        if (takes_value) i++;
    }
    if (!steps_given) o->gen.steps = o->gen.gen_length;
    /* origin has no other count; an explicit --threshold/--factor stays, for the library to refuse with its reason */
    if (o->gen.remasking == DLLM_REMASK_ORIGIN && o->gen.unmask == DLLM_UNMASK_SCHEDULE) o->gen.unmask = DLLM_UNMASK_TIMESTEPS;
    if (!o->model_dir) return fail("%s", "no model: pass -m DIR (see --help)");
    if (!o->ids_text == !o->prompt) return fail("%s", "pass exactly one prompt: -p \"text\" or --ids \"I J K\" (see --help)");
    if ((o->raw || o->visual) && !o->prompt) return fail("%s", "--raw and --visual go with a text prompt (-p)");
    return 0;
}

/* What the step callback needs to show the answer as it forms. */
typedef struct {
    const options *o;
    const dllm_tokenizer *tok;  /* NULL for --ids prompts: nothing to show */
    int32_t mask_id, eos_id, eot_id;
    int tty;                    /* stdout is a terminal: --visual redraws in place */
    size_t printed;             /* bytes of the answer already written to stdout */
    char *text;
    size_t text_cap;
} stream;

/* Detokenizes ids[0..n) into s->text (skipping special tokens); returns its length or -1. */
static long detok(stream *s, const int32_t *ids, int n) {
    size_t need = 0;
    dllm_status st = dllm_detokenize(s->tok, ids, n, 1, s->text, s->text_cap, &need);
    if (st == DLLM_ERR_BUFFER_TOO_SMALL) {
        char *grown = (char *)realloc(s->text, need);
        if (!grown) return -1;
        s->text = grown;
        s->text_cap = need;
        st = dllm_detokenize(s->tok, ids, n, 1, s->text, s->text_cap, &need);
    }
    return st == DLLM_OK ? (long)need - 1 : -1;
}

/* Writes the answer text beyond what is already on stdout; returns 0, or -1 if the ids do not decode
 * (an id the tokenizer lacks). A trailing U+FFFD may be half of a character whose other bytes are not
 * committed yet, so it waits for the next step unless this is the end. */
static int print_new_text(stream *s, const int32_t *ids, int n, int final) {
    long len = detok(s, ids, n);
    if (len < 0) return -1;
    while (!final && len >= 3 && !memcmp(s->text + len - 3, "\xEF\xBF\xBD", 3)) len -= 3;
    if (len > (long)s->printed) {
        fwrite(s->text + s->printed, 1, (size_t)len - s->printed, stdout);
        fflush(stdout);
        s->printed = (size_t)len;
    }
    return 0;
}

/* The generated ids that are settled: up to the first mask (and, with stop_at_eos, the first EOS/EoT). */
static int committed_prefix(const stream *s, const dllm_step_info *info) {
    int n = 0;
    const int32_t *gen = info->canvas + info->prompt_len;
    while (info->prompt_len + n < info->canvas_len && gen[n] != s->mask_id) {
        if (s->o->gen.stop_at_eos && (gen[n] == s->eos_id || gen[n] == s->eot_id)) break;
        n++;
    }
    return n;
}

/* --visual: the generated canvas with each mask as '_', runs of tokens decoded together so that
 * characters split across tokens come out whole. */
static void draw_canvas(stream *s, const dllm_step_info *info) {
    const int32_t *gen = info->canvas + info->prompt_len;
    int n = info->canvas_len - info->prompt_len, i = 0;
    if (s->tty) printf("\033[H\033[2J");
    printf("step %d/%d, %d masks left\n", info->global_step, info->total_steps, info->n_masked);
    while (i < n) {
        int run = i;
        while (run < n && gen[run] != s->mask_id) run++;
        if (run > i && detok(s, gen + i, run - i) >= 0) fputs(s->text, stdout);
        for (i = run; i < n && gen[i] == s->mask_id; i++) putchar('_');
    }
    printf("\n");
    fflush(stdout);
}

static int on_step(const dllm_step_info *info, void *user_data) {
    stream *s = (stream *)user_data;
    if (s->o->progress) {
        fprintf(stderr, "\rstep %d/%d  block %d/%d  masks left %d ", info->global_step, info->total_steps, info->block + 1,
                info->n_blocks, info->n_masked);
        if (info->global_step == info->total_steps) fprintf(stderr, "\n");
    }
    if (!s->tok) return 0;
    if (s->o->visual) draw_canvas(s, info);
    else print_new_text(s, info->canvas + info->prompt_len, committed_prefix(s, info), 0);
    return 0;
}

static void log_to_stderr(dllm_log_level level, const char *text, void *user_data) {
    (void)level;
    (void)user_data;
    fprintf(stderr, "dllm: %s\n", text);
}

/* Tokenizes -p TEXT, through the chat template unless --raw, into a malloc'ed array; returns the count
 * or -1 after printing an error. */
static int text_prompt(const options *o, const dllm_tokenizer *tok, int32_t **out) {
    dllm_chat_message msg;
    size_t len = strlen(o->prompt);
    char *rendered = NULL;
    int n = 0;
    dllm_status s;
    if (!o->raw) {
        if (dllm_tokenizer_chat_template(tok) == DLLM_CHAT_NONE) {
            fail("%s: no known chat template for this model; pass --raw to use the prompt as given", o->model_dir);
            return -1;
        }
        msg.role = "user";
        msg.content = o->prompt;
        dllm_chat_render(tok, &msg, 1, 1, NULL, 0, &len);
        rendered = (char *)malloc(len);
        if (!rendered) {
            fail("%s", "out of memory");
            return -1;
        }
        if (dllm_chat_render(tok, &msg, 1, 1, rendered, len, &len) != DLLM_OK) {
            free(rendered);
            fail("%s", dllm_last_error());
            return -1;
        }
        len--;
    }
    dllm_tokenize(tok, rendered ? rendered : o->prompt, len, 1, NULL, 0, &n);
    *out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    s = *out ? dllm_tokenize(tok, rendered ? rendered : o->prompt, len, 1, *out, n, &n) : DLLM_ERR_OUT_OF_MEMORY;
    free(rendered);
    if (s != DLLM_OK) {
        fail("%s", *out ? dllm_last_error() : "out of memory");
        return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    options o;
    dllm_model *model = NULL;
    dllm_ctx *ctx = NULL;
    dllm_tokenizer *tok = NULL;
    dllm_model_info info;
    int32_t *prompt = NULL, *out = NULL;
    int n_prompt = 0, n_out = 0, rc = 1, i;
    dllm_gen_stats stats;
    dllm_status s;
    stream st;

    memset(&o, 0, sizeof o);
    memset(&st, 0, sizeof st);
    rc = parse_args(argc, argv, &o);
    if (rc) return rc == 2 ? 0 : 1;
    rc = 1;
    if (o.verbose) dllm_log_set(log_to_stderr, NULL, DLLM_LOG_INFO);
    if (o.ids_text) {
        n_prompt = parse_ids(o.ids_text, &prompt);
        if (n_prompt < 0) return fail("bad --ids \"%s\": expected non-negative integers separated by spaces", o.ids_text);
    }
    if (dllm_model_load(o.model_dir, dllm_model_default_params(), &model) != DLLM_OK) {
        fprintf(stderr, "dllm-generate: %s\n", dllm_last_error());
        goto done;
    }
    dllm_model_get_info(model, &info);
    if (o.prompt) {
        if (dllm_tokenizer_load(o.model_dir, &tok) != DLLM_OK || dllm_tokenizer_check_model(tok, model) != DLLM_OK) {
            fprintf(stderr, "dllm-generate: %s\n", dllm_last_error());
            goto done;
        }
        n_prompt = text_prompt(&o, tok, &prompt);
        if (n_prompt < 0) goto done;
        if (n_prompt + o.gen.gen_length > info.max_seq_len) {
            fprintf(stderr, "dllm-generate: the prompt is %d tokens; with %d to generate that exceeds the model's context of %d\n", n_prompt,
                    o.gen.gen_length, info.max_seq_len);
            goto done;
        }
    }
    st.o = &o;
    st.tok = tok;
    st.mask_id = o.gen.mask_id >= 0 ? o.gen.mask_id : info.mask_id;
    st.eos_id = o.gen.eos_id >= 0 ? o.gen.eos_id : info.eos_id;
    st.eot_id = o.gen.eot_id >= 0 ? o.gen.eot_id : info.eot_id;
    st.tty = isatty(STDOUT_FILENO);
    if (o.progress || tok) {
        o.gen.on_step = on_step;
        o.gen.on_step_data = &st;
    }
    if (dllm_ctx_create(model, o.ctx, &ctx) != DLLM_OK) {
        fprintf(stderr, "dllm-generate: %s\n", dllm_last_error());
        goto done;
    }
    out = (int32_t *)malloc(sizeof(int32_t) * (size_t)o.gen.gen_length);
    if (!out) { fprintf(stderr, "dllm-generate: out of memory\n"); goto done; }
    s = dllm_generate(ctx, prompt, n_prompt, o.gen, out, o.gen.gen_length, &n_out, &stats);
    if (s != DLLM_OK) {
        if (st.printed) printf("\n");
        fprintf(stderr, "dllm-generate: %s\n", dllm_ctx_last_error(ctx));
        goto done;
    }
    if (tok) {  /* the rest of the answer; --visual has drawn the canvas, so the answer is printed whole */
        if (o.visual) st.printed = 0;
        if (print_new_text(&st, out, n_out, 1) != 0) {
            printf("\n");
            fprintf(stderr, "dllm-generate: %s\n", dllm_last_error());
            goto done;
        }
        printf("\n");
    }
    if (o.print_ids) {
        printf("ids:");
        for (i = 0; i < n_out; i++) printf(" %d", out[i]);
        printf("\n");
    }
    fflush(stdout);  /* the answer before the stats line, also when both go to one pipe */
    fprintf(stderr, "generated %d tokens (prompt %d) in %d steps, %d forwards, %.1f ms (%.1f tokens/s), %s backend\n",
            stats.n_generated, stats.n_prompt, stats.steps, stats.forwards, stats.wall_ms,
            stats.wall_ms > 0 ? 1000.0 * stats.n_generated / stats.wall_ms : 0.0,
            dllm_ctx_get_backend(ctx) == DLLM_BACKEND_GPU ? "GPU" : "CPU");
    rc = 0;
done:
    free(st.text);
    free(out);
    free(prompt);
    dllm_ctx_free(ctx);
    dllm_tokenizer_free(tok);
    dllm_model_free(model);
    return rc;
}
