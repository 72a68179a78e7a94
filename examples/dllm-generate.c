/* dllm-generate: decode a prompt with a diffusion LLM through the public dllm API.
 *
 *   build/dllm-generate -m tests/data/tiny-llada --ids "5 17 42" -n 32 --steps 32 --block 8 --print-ids
 *
 * Exit status 0 on success; on bad usage or a bad model, 1 with a one-line message on stderr.
 * Written in C99 against dllm.h only: it doubles as an example of the API.
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
    dllm_gen_params gen;
    dllm_ctx_params ctx;
    int print_ids;
    int verbose;
    int progress;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dllm-generate -m DIR --ids \"I J K\" [options]\n"
            "\n"
            "Decodes a prompt with LLaDA's semi-autoregressive block schedule (generate.py semantics).\n"
            "\n"
            "  -m, --model DIR        Hugging Face model directory (config.json + safetensors)\n"
            "  --ids \"I J K\"          prompt as token ids, separated by spaces\n"
            "  -n, --gen-length N     tokens to generate (default 128)\n"
            "  --steps N              denoising steps in total (default: gen length); alias --diffusion-steps\n"
            "  --block N              block length (default 32); alias --diffusion-block-length\n"
            "  --temp T               temperature, 0 = greedy (default 0)\n"
            "  --remask MODE          low_confidence (default) or random\n"
            "  --cfg S                classifier-free guidance scale, 0 = off (default 0)\n"
            "  --seed N               seed of every random draw (default 0)\n"
            "  --logits-eos-inf       forbid the EOS token\n"
            "  --eos-eot-last         commit EOS/EoT predictions last (confidence_eos_eot_inf)\n"
            "  --no-stop-at-eos       print the whole generation, EOS/EoT included\n"
            "  --backend B            auto (default), cpu or gpu\n"
            "  --threads N            CPU backend threads (default: all)\n"
            "  --print-ids            print the generated ids on one line starting with \"ids:\"\n"
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
        else if (!v) return fail("option %s needs a value (see --help)", a);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--ids")) o->ids_text = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--gen-length")) { if (!parse_int(v, 1, 1 << 20, &o->gen.gen_length)) return fail("bad gen length \"%s\"", v); }
        else if (!strcmp(a, "--steps") || !strcmp(a, "--diffusion-steps")) { if (!parse_int(v, 1, 1 << 24, &o->gen.steps)) return fail("bad step count \"%s\"", v); steps_given = 1; }
        else if (!strcmp(a, "--block") || !strcmp(a, "--diffusion-block-length")) { if (!parse_int(v, 1, 1 << 20, &o->gen.block_length)) return fail("bad block length \"%s\"", v); }
        else if (!strcmp(a, "--temp")) { if (!parse_float(v, &o->gen.temperature) || o->gen.temperature < 0) return fail("bad temperature \"%s\"", v); }
        else if (!strcmp(a, "--cfg")) { if (!parse_float(v, &o->gen.cfg_scale) || o->gen.cfg_scale < 0) return fail("bad cfg scale \"%s\"", v); }
        else if (!strcmp(a, "--seed")) { char *end = NULL; errno = 0; o->gen.seed = strtoull(v, &end, 0); if (errno || !end || *end || end == v) return fail("bad seed \"%s\"", v); }
        else if (!strcmp(a, "--threads")) { if (!parse_int(v, 0, 1024, &o->ctx.n_threads)) return fail("bad thread count \"%s\"", v); }
        else if (!strcmp(a, "--remask")) {
            if (!strcmp(v, "low_confidence")) o->gen.remasking = DLLM_REMASK_LOW_CONFIDENCE;
            else if (!strcmp(v, "random")) o->gen.remasking = DLLM_REMASK_RANDOM;
            else return fail("--remask must be low_confidence or random, not \"%s\"", v);
        } else if (!strcmp(a, "--backend")) {
            if (!strcmp(v, "auto")) o->ctx.backend = DLLM_BACKEND_AUTO;
            else if (!strcmp(v, "cpu")) o->ctx.backend = DLLM_BACKEND_CPU;
            else if (!strcmp(v, "gpu")) o->ctx.backend = DLLM_BACKEND_GPU;
            else return fail("--backend must be auto, cpu or gpu, not \"%s\"", v);
        } else return fail("unknown option %s (see --help)", a);
        if (takes_value) i++;
    }
    if (!steps_given) o->gen.steps = o->gen.gen_length;
    if (!o->model_dir) return fail("%s", "no model: pass -m DIR (see --help)");
    if (!o->ids_text) return fail("%s", "no prompt: pass --ids \"I J K\" (see --help)");
    return 0;
}

static int on_step(const dllm_step_info *info, void *user_data) {
    (void)user_data;
    fprintf(stderr, "\rstep %d/%d  block %d/%d  masks left %d ", info->global_step, info->total_steps, info->block + 1,
            info->n_blocks, info->n_masked);
    if (info->global_step == info->total_steps) fprintf(stderr, "\n");
    return 0;
}

static void log_to_stderr(dllm_log_level level, const char *text, void *user_data) {
    (void)level;
    (void)user_data;
    fprintf(stderr, "dllm: %s\n", text);
}

int main(int argc, char **argv) {
    options o;
    dllm_model *model = NULL;
    dllm_ctx *ctx = NULL;
    int32_t *prompt = NULL, *out = NULL;
    int n_prompt, n_out = 0, rc = 1, i;
    dllm_gen_stats stats;
    dllm_status s;

    memset(&o, 0, sizeof o);
    rc = parse_args(argc, argv, &o);
    if (rc) return rc == 2 ? 0 : 1;
    rc = 1;
    if (o.verbose) dllm_log_set(log_to_stderr, NULL, DLLM_LOG_INFO);
    n_prompt = parse_ids(o.ids_text, &prompt);
    if (n_prompt < 0) return fail("bad --ids \"%s\": expected non-negative integers separated by spaces", o.ids_text);
    if (o.progress) o.gen.on_step = on_step;

    if (dllm_model_load(o.model_dir, dllm_model_default_params(), &model) != DLLM_OK) {
        fprintf(stderr, "dllm-generate: %s\n", dllm_last_error());
        goto done;
    }
    if (dllm_ctx_create(model, o.ctx, &ctx) != DLLM_OK) {
        fprintf(stderr, "dllm-generate: %s\n", dllm_last_error());
        goto done;
    }
    out = (int32_t *)malloc(sizeof(int32_t) * (size_t)o.gen.gen_length);
    if (!out) { fprintf(stderr, "dllm-generate: out of memory\n"); goto done; }
    s = dllm_generate(ctx, prompt, n_prompt, o.gen, out, o.gen.gen_length, &n_out, &stats);
    if (s != DLLM_OK) {
        fprintf(stderr, "dllm-generate: %s\n", dllm_ctx_last_error(ctx));
        goto done;
    }
    if (o.print_ids) {
        printf("ids:");
        for (i = 0; i < n_out; i++) printf(" %d", out[i]);
        printf("\n");
    }
    fprintf(stderr, "generated %d tokens (prompt %d) in %d steps, %d forwards, %.1f ms (%.1f tokens/s), %s backend\n",
            stats.n_generated, stats.n_prompt, stats.steps, stats.forwards, stats.wall_ms,
            stats.wall_ms > 0 ? 1000.0 * stats.n_generated / stats.wall_ms : 0.0,
            dllm_ctx_get_backend(ctx) == DLLM_BACKEND_GPU ? "GPU" : "CPU");
    rc = 0;
done:
    free(out);
    free(prompt);
    dllm_ctx_free(ctx);
    dllm_model_free(model);
    return rc;
}
