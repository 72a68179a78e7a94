/* dllm-quantize: quantise a model's linears to a SoloQ precision once, and write them as a model directory.
 *
 *   build/dllm-quantize -m models/tiny-llada -o /tmp/tiny-llada-soloq-i --precision soloq-i
 *   build/dllm-generate -m /tmp/tiny-llada-soloq-i -p "Hello"        (the stored precision is the default)
 *
 * Quantising an 8B model on the CPU takes minutes; a context on the written directory loads the stored 4-bit
 * codes and scales instead, and computes exactly what quantising at load would (dllm_model_quantize in dllm.h
 * and README.md describe the format). The output directory must not exist or be empty unless --force. Progress
 * (layer k/n) goes to stderr. Exit status 0 on success, 1 with a one-line message.
 * Written in C99 against dllm.h only.
 */
#include "../dllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dllm-quantize -m MODEL_DIR -o OUT_DIR --precision P [options]\n"
            "\n"
            "Quantises every attention and MLP linear of the model (LLaDA2: every routed and shared expert too, the\n"
            "router stays as it is) and optionally its LM head to 4 bits once and\n"
            "writes OUT_DIR: config.json and the tokenizer files copied, model.safetensors (or shards with an index)\n"
            "holding the 4-bit codes, NVFP4 block scales and FP32 row scales of each layer, and the tensors that stay\n"
            "unquantised. Load OUT_DIR like any model directory; its precision is then the default.\n"
            "\n"
            "  -m, --model DIR        the unquantised model (config.json + safetensors)\n"
            "  -o, --output DIR       the directory to write (created; must be empty unless --force)\n"
            "  --precision P          soloq-n (NVFP4), soloq-i (INT4), soloq-c (E8P codebook) or rtn-w4a4 (the\n"
            "                         baseline); a -w4a16 form (e.g. soloq-i-w4a16) stores the same weights and\n"
            "                         records that precision as the default\n"
            "  --quantize-lm-head     quantise the LM head too (default: it stays BF16, as in the paper)\n"
            "  --soloq-rotation R     krpbh (default, the paper's), none, hadamard, rpbh, mixer or haar (ablations)\n"
            "  --soloq-bias-correction 0|1  the scale-only bias correction (default 1)\n"
            "  --threads N            CPU threads (default: all)\n"
            "  --max-shard-mb N       at most N MB a safetensors file (default 4096); larger outputs are sharded\n"
            "  --force                write into a non-empty OUT_DIR, replacing its model files\n"
            "  --quiet                no progress on stderr\n"
            "  --version              print the version\n"
            "  -h, --help             this text\n"
            "\n"
            "The rotation and the bias correction are recorded: OUT_DIR runs with them, and a context asking for others\n"
            "is refused.\n");
}

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "dllm-quantize: %s%s\n", what, detail);
    return 1;
}

static void progress(int done, int total, void *user_data) {
    (void)user_data;
    fprintf(stderr, "dllm-quantize: layer %d/%d\n", done, total);
}

/* A whole decimal number in [lo, hi]. */
static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_precision(const char *s, dllm_precision *p) {
    static const char *const names[] = {"soloq-n", "soloq-i", "soloq-c", "rtn-w4a4", "soloq-n-w4a16", "soloq-i-w4a16", "soloq-c-w4a16", "rtn-w4a16"};
    int i;
    for (i = 0; i < 8; i++)
        if (!strcmp(s, names[i])) { *p = (dllm_precision)(DLLM_PRECISION_SOLOQ_N + i); return 1; }
    return 0;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *out_dir = NULL;
    int have_precision = 0, quiet = 0, i;
    long v, cores;
    dllm_quantize_params qp = dllm_quantize_default_params();
    dllm_model *model = NULL;
    dllm_status s;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int takes_value = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--precision") ||
                                !strcmp(a, "--threads") || !strcmp(a, "--max-shard-mb") || !strcmp(a, "--soloq-rotation") ||
                                !strcmp(a, "--soloq-bias-correction");
        const char *val = takes_value && i + 1 < argc ? argv[i + 1] : NULL;
        if (takes_value && !val) { fprintf(stderr, "dllm-quantize: %s needs a value\n", a); return 1; }
        if (takes_value) i++;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--version")) { printf("dllm-quantize (dllm %s)\n", dllm_version()); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_dir = val;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out_dir = val;
        else if (!strcmp(a, "--precision")) {
            if (!parse_precision(val, &qp.precision))
                return fail("--precision must be soloq-n, soloq-i, soloq-c or rtn-w4a4 (or a -w4a16 form), not ", val);
            have_precision = 1;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(val, 0, 1024, &v)) return fail("--threads must be a whole number in [0, 1024], not ", val);
            qp.n_threads = (int)v;
            if ((cores = sysconf(_SC_NPROCESSORS_ONLN)) > 0 && v > cores) {  /* more threads than cores only slows it down */
                fprintf(stderr, "dllm-quantize: note: --threads %ld is more than the %ld core%s here: using %ld\n", v, cores, cores == 1 ? "" : "s", cores);
                qp.n_threads = (int)cores;
            }
        } else if (!strcmp(a, "--max-shard-mb")) {
            if (!parse_int(val, 1, 1L << 30, &v)) return fail("--max-shard-mb must be a positive whole number, not ", val);
            qp.max_shard_bytes = (size_t)v * 1000 * 1000;
        } else if (!strcmp(a, "--soloq-rotation")) {
            static const char *const rotations[] = {"default", "none", "hadamard", "rpbh", "mixer", "krpbh", "haar"};  /* dllm_soloq_rotation */
            int k = -1;
            for (int r = 0; r < 7; r++)
                if (!strcmp(val, rotations[r])) k = r;
            if (k < 0) return fail("--soloq-rotation must be none, hadamard, rpbh, mixer, krpbh or haar, not ", val);
            qp.soloq_rotation = (dllm_soloq_rotation)k;
        } else if (!strcmp(a, "--soloq-bias-correction")) {
            if (strcmp(val, "0") && strcmp(val, "1")) return fail("--soloq-bias-correction must be 0 or 1, not ", val);
            qp.soloq_bias_correction = val[0] == '1';
        } else if (!strcmp(a, "--quantize-lm-head")) qp.quantize_lm_head = 1;
        else if (!strcmp(a, "--force")) qp.overwrite = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else {
            fprintf(stderr, a[0] == '-' ? "dllm-quantize: unknown option %s (see --help)\n" : "dllm-quantize: unexpected argument \"%s\" (see --help)\n", a);
            return 1;
        }
    }
    if (!model_dir) return fail("-m MODEL_DIR is required (see --help)", "");
    if (!out_dir) return fail("-o OUT_DIR is required (see --help)", "");
    if (!have_precision) return fail("--precision is required: soloq-n, soloq-i, soloq-c or rtn-w4a4", "");
    if (!quiet) qp.progress = progress;
    s = dllm_model_load(model_dir, dllm_model_default_params(), &model);
    if (s != DLLM_OK) return fail("", dllm_last_error());
    s = dllm_model_quantize(model, out_dir, &qp);
    dllm_model_free(model);
    if (s != DLLM_OK) return fail("", dllm_last_error());
    if (!quiet) fprintf(stderr, "dllm-quantize: wrote %s\n", out_dir);
    return 0;
}
