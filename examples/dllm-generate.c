/* dllm-generate: decode a prompt with a diffusion LLM through the public dllm API.
 *
 *   build/dllm-generate -m models/tiny-llada -p "Tell me a story about a dog."
 *   build/dllm-generate -m LLaDA-8B-Instruct -p "Why is the sky blue?" -n 256 --threshold 0.9 --cache dual
 *   build/dllm-generate -m LLaDA-8B-Instruct -i --system "You are terse."          (multi-turn chat)
 *   build/dllm-generate -m tests/data/tiny-llada --ids "5 17 42" -n 32 --json
 *   build/dllm-generate -m models/tiny-llada --prompts questions.txt --batch 8 --print-ids   (one prompt a line)
 *
 * A text prompt (-p TEXT, -p - for stdin, -f FILE) goes through the model's chat template (unless --raw) and
 * tokenizer; the answer is streamed to stdout as its prefix gets committed, or, with --visual, the whole canvas
 * is redrawn after every step with the masks shown; --json prints one object (text, ids, stats) instead. A
 * stats line ends the run on stderr. Defaults a new user expects: --block and --steps follow -n, early stop is
 * on (blocks after one holding EOS cannot change the answer), sampling (--temp > 0) draws a fresh seed that the
 * stats line prints. Exit status 0 on success, 1 with one line on stderr naming the flag to change. Written in
 * C99 against dllm.h only: it doubles as an example of the API.
 */
#include "../dllm.h"
#include "common.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_STOPS 16

/* Every option; a value option may be given once (--stop is repeatable). */
enum {
    OPT_HELP, OPT_VERSION, OPT_MODEL, OPT_PROMPT, OPT_FILE, OPT_IDS, OPT_INTERACTIVE, OPT_SYSTEM, OPT_RAW, OPT_NO_PARSE_SPECIAL,
    OPT_VISUAL, OPT_JSON, OPT_PRINT_IDS, OPT_PROGRESS, OPT_VERBOSE, OPT_N, OPT_STEPS, OPT_BLOCK, OPT_TEMP, OPT_TOP_K, OPT_TOP_P,
    OPT_MIN_P, OPT_STOP, OPT_SEED, OPT_ALG, OPT_LACACHE, OPT_CFG, OPT_THRESHOLD, OPT_FACTOR, OPT_CACHE, OPT_DPAD_WINDOW, OPT_DPAD_K,
    OPT_DPAD_SCALE, OPT_DPAD_UNIFORM, OPT_EARLY_STOP, OPT_NO_EARLY_STOP, OPT_TIMESTEPS, OPT_EPS, OPT_ALG_TEMP, OPT_LOGITS_EOS_INF,
    OPT_EOS_EOT_LAST, OPT_NO_STOP_AT_EOS, OPT_BACKEND, OPT_PRECISION, OPT_THREADS, OPT_SUB_BLOCK, OPT_BLOCK_CACHE, OPT_MASK_ID, OPT_STOP_ID,
    OPT_PROMPTS, OPT_BATCH, OPT_KV_QUANT, OPT_KV_SINKS, OPT_DEVICES, OPT_SOLOQ_ROTATION, OPT_SOLOQ_BIAS_CORRECTION, OPT_EDIT_THRESHOLD, OPT_MAX_POST_STEPS, OPT_PRESET, OPT_RANDOM_WEIGHTS, OPT_TUNED_FORWARDS, OPT_COUNT
};

typedef struct {
    int id, takes_value;
    const char *names[3];
} option_def;

static const option_def option_defs[] = {
    {OPT_HELP, 0, {"-h", "--help"}}, {OPT_VERSION, 0, {"--version"}}, {OPT_MODEL, 1, {"-m", "--model"}},
    {OPT_PROMPT, 1, {"-p", "--prompt"}}, {OPT_FILE, 1, {"-f", "--file"}}, {OPT_IDS, 1, {"--ids"}},
    {OPT_INTERACTIVE, 0, {"-i", "--interactive"}}, {OPT_SYSTEM, 1, {"--system", "-sys", "--system-prompt"}}, {OPT_RAW, 0, {"--raw"}},
    {OPT_NO_PARSE_SPECIAL, 0, {"--no-parse-special"}}, {OPT_VISUAL, 0, {"--visual", "--diffusion-visual"}}, {OPT_JSON, 0, {"--json"}},
    {OPT_PRINT_IDS, 0, {"--print-ids"}}, {OPT_PROGRESS, 0, {"--progress"}}, {OPT_VERBOSE, 0, {"-v", "--verbose"}},
    {OPT_N, 1, {"-n", "--gen-length", "--n-predict"}}, {OPT_STEPS, 1, {"--steps", "--diffusion-steps"}},
    {OPT_BLOCK, 1, {"--block", "--diffusion-block-length"}}, {OPT_TEMP, 1, {"--temp", "--temperature"}}, {OPT_TOP_K, 1, {"--top-k"}},
    {OPT_TOP_P, 1, {"--top-p"}}, {OPT_MIN_P, 1, {"--min-p"}}, {OPT_STOP, 1, {"--stop"}}, {OPT_SEED, 1, {"-s", "--seed"}},
    {OPT_ALG, 1, {"--alg", "--remask"}}, {OPT_LACACHE, 1, {"--lacache"}}, {OPT_TUNED_FORWARDS, 0, {"--tuned-forwards"}}, {OPT_CFG, 1, {"--cfg"}}, {OPT_THRESHOLD, 1, {"--threshold"}},
    {OPT_FACTOR, 1, {"--factor"}}, {OPT_CACHE, 1, {"--cache"}}, {OPT_DPAD_WINDOW, 1, {"--dpad-window"}}, {OPT_DPAD_K, 1, {"--dpad-k"}},
    {OPT_DPAD_SCALE, 1, {"--dpad-scale"}}, {OPT_DPAD_UNIFORM, 1, {"--dpad-uniform"}}, {OPT_EARLY_STOP, 0, {"--early-stop"}},
    {OPT_NO_EARLY_STOP, 0, {"--no-early-stop"}}, {OPT_TIMESTEPS, 0, {"--timesteps"}}, {OPT_EPS, 1, {"--eps"}},
    {OPT_ALG_TEMP, 1, {"--alg-temp"}}, {OPT_LOGITS_EOS_INF, 0, {"--logits-eos-inf"}}, {OPT_EOS_EOT_LAST, 0, {"--eos-eot-last"}},
    {OPT_NO_STOP_AT_EOS, 0, {"--no-stop-at-eos"}}, {OPT_BACKEND, 1, {"--backend"}}, {OPT_PRECISION, 1, {"--precision"}},
    {OPT_THREADS, 1, {"--threads", "-t"}}, {OPT_SUB_BLOCK, 1, {"--sub-block"}}, {OPT_BLOCK_CACHE, 0, {"--block-cache"}},
    {OPT_MASK_ID, 1, {"--mask-id"}}, {OPT_STOP_ID, 1, {"--stop-id"}}, {OPT_PROMPTS, 1, {"--prompts"}}, {OPT_BATCH, 1, {"--batch"}},
    {OPT_KV_QUANT, 1, {"--kv-quant"}}, {OPT_KV_SINKS, 1, {"--kv-sinks"}}, {OPT_DEVICES, 1, {"--devices"}},
    {OPT_SOLOQ_ROTATION, 1, {"--soloq-rotation"}}, {OPT_SOLOQ_BIAS_CORRECTION, 1, {"--soloq-bias-correction"}},
    {OPT_EDIT_THRESHOLD, 1, {"--edit-threshold"}}, {OPT_MAX_POST_STEPS, 1, {"--max-post-steps"}}, {OPT_PRESET, 1, {"--preset"}},
    {OPT_RANDOM_WEIGHTS, 1, {"--random-weights"}},
};

typedef struct {
    const char *model_dir, *ids_text, *prompt_arg, *prompt_file, *system, *prompts_file, *precision_name, *devices_text;
    char *prompt;               /* the text prompt, from -p, -p - (stdin) or -f; malloc'ed */
    const char *stops[MAX_STOPS];
    int n_stops;
    dllm_gen_params gen;
    dllm_ctx_params ctx;
    const char *given[OPT_COUNT]; /* the spelling each option was given as, NULL if not given */
    int print_ids, verbose, progress, raw, visual, json, interactive, parse_special, random_weights;
    int random_seed;            /* the seed was drawn, not given */
    int batch;                  /* --prompts: how many prompts decode together */
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dllm-generate -m DIR (-p TEXT | -p - | -f FILE | --ids \"I J K\" | -i | --prompts FILE) [options]\n"
            "\n"
            "Decodes a prompt with LLaDA's semi-autoregressive block schedule (generate.py semantics), Fast-dLLM's\n"
            "parallel decoding, DPad or Dream's samplers.\n"
            "\n"
            "  -m, --model DIR        Hugging Face model directory (config.json + safetensors + tokenizer files)\n"
            "  --random-weights DIR   instead of -m, for benchmarks at real sizes without a checkpoint: a model of DIR's\n"
            "                         config.json shape with random weights drawn on the GPU (GPU backend only; seed 0),\n"
            "                         DIR's tokenizer files for the text (tools/serve_bench.py writes a stand-in)\n"
            "  -p, --prompt TEXT      prompt as text: the model's chat template is applied, the answer streamed;\n"
            "                         -p - reads the prompt from stdin (one trailing newline dropped)\n"
            "  -f, --file FILE        the whole file is the prompt (as llama.cpp reads it; one trailing newline dropped)\n"
            "  --ids \"I J K\"          prompt as token ids, separated by spaces; the answer is printed as text when the\n"
            "                         model directory has a tokenizer, as ids otherwise\n"
            "  -i, --interactive      chat: each line on stdin is a user turn, answered with the conversation so far\n"
            "                         (-p/-f, if given, is the first turn); ends at end of input\n"
            "  --system TEXT          a system message first (with the chat template); alias -sys, --system-prompt\n"
            "  --raw                  tokenize the text as given, without the chat template\n"
            "  --no-parse-special     the prompt's text is plain text: \"<|eot_id|>\" typed in it is not the special token\n"
            "  --visual               redraw the whole canvas after every step, masks shown as '_' and the end of the\n"
            "                         answer (EOS / EoT) as [EOS] / [EOT]; alias --diffusion-visual\n"
            "  --json                 print one JSON object on stdout instead of text: {\"text\", \"ids\", \"stats\"} (one line\n"
            "                         per turn with -i; with --prompts one line per prompt: {\"index\", \"text\", \"ids\",\n"
            "                         \"stats\"}, or {\"index\", \"error\"} for a prompt that failed)\n"
            "  --print-ids            print the generated ids on one line starting with \"ids:\" (after the text)\n"
            "  --prompts FILE         many prompts, one a line (empty lines skipped), each through the chat template as\n"
            "                         -p; decoded in batches (dllm_generate_batch), each exactly as if alone. Prints the\n"
            "                         final answers only, in input order, one line each: \"[N] answer\" (N from 0; a\n"
            "                         backslash, newline and carriage return in the answer written as \\\\, \\n and \\r),\n"
            "                         then its \"ids:\" line with --print-ids; one stats line per batch on stderr. A prompt\n"
            "                         that cannot decode is reported as \"prompt N: ...\" on stderr, the others still\n"
            "                         print, and the exit status is 1\n"
            "  --batch N              --prompts: how many prompts decode together (default 8)\n"
            "\n"
            "  -n, --gen-length N     tokens to generate (default 128); alias --n-predict\n"
            "  --block N              block length (default: the largest divisor of -n up to 32); alias --diffusion-block-length\n"
            "  --steps N              denoising steps in total (default: -n, one token a step, also the most that commit\n"
            "                         anything); LLaDA and Dream only; alias --diffusion-steps\n"
            "  --temp T               temperature, 0 = greedy (default 0); > 0 draws a fresh seed unless --seed is given\n"
            "  --top-k K              sample among the K most likely tokens (0 = off); ties at the K-th are kept\n"
            "  --top-p P              ... among the most likely tokens whose probability mass reaches P (1 = off)\n"
            "  --min-p P              ... among tokens with p >= P * p(most likely) (0 = off). The three filters apply to\n"
            "                         softmax(logits / temp) and intersect; the confidence sees the filtered row (as Dream)\n"
            "  --stop STR             end the answer before STR and stop decoding (repeatable); --json, --print-ids and\n"
            "                         the stats line then count the ids of the answer before STR (a token holding both the\n"
            "                         answer's end and the start of STR is left out)\n"
            "  -s, --seed N           seed of every random draw; -1 = a fresh one (the default when anything is random);\n"
            "                         the stats line prints it so that a run can be repeated\n"
            "  --alg MODE             which masks a step commits first: low_confidence (default, highest p(x0); alias\n"
            "                         maskgit_plus), topk_margin (p(top1) - p(top2)), entropy (sum p log p), random, or\n"
            "                         origin (see --timesteps); alias --remask. topk_margin and entropy take p from\n"
            "                         softmax(logits / temp) as Dream does, low_confidence only with --timesteps\n"
            "  --lacache MODE         exact caching: on (default), truncate (LM head on the block only) or off; every\n"
            "                         mode gives the same tokens (on the GPU, in --tuned-forwards' forwards)\n"
            "  --tuned-forwards       GPU: this prompt's own forwards, GEMMs tuned to its row count, LaCache's reuse;\n"
            "                         the same tokens up to near-ties, not the bits --prompts or the server give it\n"
            "  --cfg S                classifier-free guidance scale, 0 = off (default 0)\n"
            "  --no-early-stop        decode every block even after one holding EOS/EoT (the library's default); early\n"
            "                         stop cannot change the answer, only the ids after it (see --no-stop-at-eos)\n"
            "\n"
            "Fast-dLLM and DPad (compose with each other and with --lacache):\n"
            "  --threshold TAU        parallel decoding: each step commits the best candidate and every one with\n"
            "                         confidence >= TAU; a block steps until it is full (--steps is ignored: a warning);\n"
            "                         TAU in (0, 1], or <= 0 with --alg entropy (minus the entropy, in nats)\n"
            "  --factor F             parallel decoding, factor rule: the n-th best needs conf >= 1 - F/(n+1)\n"
            "  --cache MODE           none (default, exact), prefix or dual: Fast-dLLM's K/V caches, APPROXIMATE\n"
            "                         (K/V outside the forwarded rows are reused stale within a block)\n"
            "  --dpad-window W        DPad suffix dropout: each block sees a random subset of the next W masks\n"
            "                         (changes the output by design)\n"
            "  --dpad-k K             DPad Gaussian sharpness (default 4)\n"
            "  --dpad-scale A         DPad Gaussian scale (default 2)\n"
            "  --dpad-uniform N       DPad: keep N positions drawn uniformly from the window instead\n"
            "  --early-stop           after a block with EOS/EoT, fill the rest with it and stop (the default here)\n"
            "  Paper settings, LLaDA-8B-Instruct GSM8K: -n 256 --block 32 --threshold 0.9 --cache dual\n"
            "                         (+ --dpad-window 256 --dpad-k 4 --dpad-scale 2 for DPad)\n"
            "\n"
            "Block diffusion (Fast-dLLM v2, Nemotron-Labs-Diffusion; chosen by the model, either backend; the official generate;\n"
            "greedy: --steps, --temp, --alg, --cache, --cfg, DPad, Dream's samplers and the sampler filters are refused;\n"
            "--sub-block, --block-cache and --stop-id are refused on LLaDA and Dream):\n"
            "  --block N              the block (default: the model's, 32); -n must be a multiple of it\n"
            "  --sub-block N          sub-block decoded left to right, dividing the block (default 8)\n"
            "  --block-cache          Fast-dLLM v2's sub-block cache (approximate by design, as the official one)\n"
            "  --threshold TAU        commit every mask with p > TAU plus the best (default: one token a step);\n"
            "                         the HF README uses 0.9\n"
            "  --mask-id ID           the mask token, overriding the model's (for checkpoints without a tokenizer)\n"
            "  --stop-id ID           the stop token, overriding the model's (<|im_end|> for Fast-dLLM v2)\n"
            "  --kv-quant Q           quantise each committed block's K/V (SoloQ's commit-time KV; both backends):\n"
            "                         none (default), soloq-kv4, soloq-kv2 (keys KIVI per channel, values K-RPBH +\n"
            "                         Lloyd-Max + bias correction), kivi-kv4, kivi-kv2 (the baseline); prints the cache's\n"
            "                         bytes per token\n"
            "  --kv-sinks N           with --kv-quant: positions [0, N) stay full precision (default: the model's, 3 for\n"
            "                         Fast-dLLM v2, 1 for Nemotron)\n"
            "  Fast-dLLM v2 README settings: -n 512 --threshold 0.9 (add --block-cache for the hierarchical cache)\n"
            "\n"
            "LLaDA2.0 / LLaDA2.1 (mixture of experts; the official generate, greedy; both backends run every\n"
            "--precision, its router always exact):\n"
            "  --block N              the block, counted from position 0 (default 32); -n need not be a multiple\n"
            "  --threshold TAU        commit every mask with p > TAU (default 0.95, the official 2.0 default); 2.0 falls\n"
            "                         back to its step schedule (--steps), 2.1 to the single best mask\n"
            "  --edit-threshold X     LLaDA2.1's loop: also rewrite decoded tokens of the block whose new prediction has\n"
            "                         p > X (1 = no edits); without it LLaDA2.0's loop runs\n"
            "  --max-post-steps N     LLaDA2.1: forwards after a block's last mask that may still edit it (default 16)\n"
            "  --preset P             the LLaDA2.1 model card's settings: quality (--threshold 0.7 --edit-threshold 0.5)\n"
            "                         or speed (--threshold 0.5 --edit-threshold 0), block 32, 16 post steps\n"
            "  --early-stop           LLaDA2.0: stop at a committed EOS with no mask before it; LLaDA2.1: after a full\n"
            "                         block holding EOS (off by default, as the official eos_early_stop)\n"
            "\n"
            "Dream's samplers (generation_utils.py; any model, composing with blocks and caches):\n"
            "  --timesteps            Dream's count: with t = linspace(1, eps, steps per block + 1), step i of a block\n"
            "                         commits floor(n (1 - t[i+1]/t[i])) of its n masks left (0 happens), all of them\n"
            "                         at the last step. --alg origin implies it: each mask transfers independently\n"
            "                         with probability 1 - t[i+1]/t[i]\n"
            "  --eps E                the last timestep, in (0, 1) (default 1e-3)\n"
            "  --alg-temp T           > 0: a step samples its positions from softmax(confidence / T) without\n"
            "                         replacement instead of taking the top ones (default 0)\n"
            "  Dream's README settings (alg entropy, 512 steps, temperature 0.2, top_p 0.95, the answer as one block):\n"
            "                         -n 512 --block 512 --temp 0.2 --top-p 0.95 --alg entropy --timesteps\n"
            "\n"
            "  --logits-eos-inf       forbid the EOS token\n"
            "  --eos-eot-last         commit EOS/EoT predictions last (confidence_eos_eot_inf)\n"
            "  --no-stop-at-eos       print the whole generation, EOS/EoT included (early stop is then off unless asked for)\n"
            "  --backend B            auto (default), cpu or gpu\n"
            "  --precision P          bf16 (default; a dllm-quantize directory: its own), fp8 or fp8-all. fp8: the\n"
            "                         FFN linears of layers >= 1 in FP8 E4M3\n"
            "                         (LaCache's scheme; block-scaled GEMMs on sm_90 and sm_89, other GPUs run BF16\n"
            "                         with a warning); fp8-all also quantises the attention projections (beyond\n"
            "                         the paper). The CPU backend computes the same function. soloq-n, soloq-i,\n"
            "                         soloq-c, rtn-w4a4: SoloQ W4A4 (each -w4a16 form: weight-only), both backends\n"
            "  --soloq-rotation R     SoloQ's rotation: krpbh (default, the paper's), none, hadamard, rpbh, mixer or haar\n"
            "                         (ablations; a dllm-quantize directory runs only with the one it was made with)\n"
            "  --soloq-bias-correction 0|1  SoloQ's scale-only bias correction (default 1)\n"
            "  -t, --threads N        CPU backend threads (default: all; more than the cores is clamped to them, with a note)\n"
            "  --devices LIST         GPUs for tensor parallelism, e.g. 0,1 (one model split across them; not built yet:\n"
            "                         more than one device is an error for now); one ordinal picks that GPU\n"
            "  --progress             show the progress on stderr (on a terminal the answer is then printed at the end)\n"
            "  -v, --verbose          library log messages at info level\n"
            "  --version              print the version\n"
            "  -h, --help             this text\n"
            "\n"
            "The bundled tiny models (models/README.md; trained on fortune quotes, not instruction-tuned, for testing):\n"
            "  models/tiny-llada          LLaDA layout, the default of ./build.sh run: -p TEXT (chat template) or --raw\n"
            "  models/tiny-dream          Dream layout; trained without a chat template, so pass --raw: --raw -p \"Life is\"\n"
            "  models/tiny-fast-dllm-v2   block diffusion (Fast-dLLM v2 layout): -n a multiple of its block, 32; --raw\n"
            "  models/tiny-add            5-digit addition: --raw -p \"12345+54321=\" -n 8\n");
}

/* --prompts: the index of the prompt being prepared or reported (-1 otherwise); fail() then names it. */
static int current_prompt = -1;
/* The last message fail() printed, without "dllm-generate: " (--prompts --json repeats it in the prompt's object). */
static char last_failure[1024];

#if defined(__GNUC__)
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif

/* One line on stderr, "dllm-generate: " first (and "prompt N: " under --prompts); returns 1 (the exit status of
 * every failure). */
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_failure, sizeof last_failure, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dllm-generate: ");
    if (current_prompt >= 0) fprintf(stderr, "prompt %d: ", current_prompt);
    fprintf(stderr, "%s\n", last_failure);
    return 1;
}

/* One line on stderr about something that goes on anyway: "dllm-generate: warning: ...". */
static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dllm-generate: warning: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static const char *plural(long n) { return n == 1 ? "" : "s"; }

static int is_word_char(char c) { return c == '_' || c == '.' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'); }

/* A library message in the CLI's words. The library names a parameter with its flag, "gen_length (-n) 30 is not a
 * multiple of block_length (--block) 32": the flag replaces the pair ("-n 30 is not a multiple of --block 32"). A name
 * it writes bare (NCCL's "n_devices > 1") becomes words. Whole identifiers only; the result is in a static buffer. */
static const char *in_flags(const char *msg) {
    static const char *const map[][2] = {{"n_devices", "the device count"}};
    static char buf[1024];
    size_t n = 0, i, k;
    const char *p = msg ? msg : "";
    while (*p && n + 1 < sizeof buf) {
        const char *flag = NULL;
        size_t flag_len = 0, skip = 1;
        if (p == msg || !is_word_char(p[-1])) {
            for (k = 0; is_word_char(p[k]); k++) {}
            if (k && !strncmp(p + k, " (-", 3) && (p[k + 3] == '-' || ((p[k + 3] | 32) >= 'a' && (p[k + 3] | 32) <= 'z')) && strchr(p + k, ')')) {
                flag = p + k + 2;  /* "name (flag)": the flag */
                flag_len = (size_t)(strchr(p + k, ')') - flag);
                skip = (size_t)(flag + flag_len + 1 - p);
            }
            for (i = 0; k && !flag && i < sizeof map / sizeof map[0]; i++)
                if (strlen(map[i][0]) == k && !strncmp(p, map[i][0], k)) flag = map[i][1], flag_len = strlen(flag), skip = k;
        }
        if (!flag) {
            buf[n++] = *p++;
            continue;
        }
        if (n + flag_len + 1 >= sizeof buf) break;
        memcpy(buf + n, flag, flag_len);
        n += flag_len;
        p += skip;
    }
    buf[n] = 0;
    return buf;
}

/* A whole number in [lo, hi]: 1 if s is one; 0 otherwise, with *too_large set if s is a whole number above hi. */
static int parse_int_range(const char *s, long lo, long hi, int *out, int *too_large) {
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    *too_large = 0;
    if (!end || *end || end == s) return 0;
    if ((errno == ERANGE && v == LONG_MAX) || (!errno && v > hi)) {
        *too_large = s[0] != '-';
        return 0;
    }
    if (errno || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_int(const char *s, long lo, long hi, int *out) {
    int too_large;
    return parse_int_range(s, lo, hi, out, &too_large);
}

/* A count option's value in [lo, hi]; 0, or 1 after printing "A V is too large (at most HI)" or "A must be WHAT". */
static int count_option(const char *a, const char *v, long lo, long hi, const char *what, int *out) {
    int too_large;
    if (parse_int_range(v, lo, hi, out, &too_large)) return 0;
    if (too_large) return fail("%s %s is too large: at most %ld", a, v, hi);
    return fail("%s must be %s, not \"%s\"", a, what, v);
}

/* "0,1,3": up to DLLM_MAX_DEVICES comma-separated device ordinals into the context's device list. Whether they are
 * distinct and whether the model splits over them is the library's check (dllm_ctx_create names the field). */
static int parse_devices(const char *s, dllm_ctx_params *cp) {
    int n = 0;
    for (;;) {
        char item[16];
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= sizeof item || n == DLLM_MAX_DEVICES) return 0;
        memcpy(item, s, len);
        item[len] = 0;
        if (!parse_int(item, 0, 1 << 20, &cp->devices[n++])) return 0;
        if (!s[len]) break;
        s += len + 1;
    }
    cp->n_devices = n;
    return 1;
}

static int parse_double(const char *s, double *out) {
    char *end = NULL;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || !end || *end || end == s || v != v) return 0;
    *out = v;
    return 1;
}

static int parse_float(const char *s, float *out) {
    double v;
    if (!parse_double(s, &v)) return 0;
    *out = (float)v;
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

/* All of f in a malloc'ed NUL-terminated buffer, one trailing newline dropped (llama.cpp's -f); NULL on failure. */
static char *read_all(FILE *f) {
    size_t cap = 1 << 12, n = 0, got;
    char *buf = (char *)malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *grown = (char *)realloc(buf, cap *= 2);
            if (!grown) { free(buf); return NULL; }
            buf = grown;
        }
    }
    if (buf && ferror(f)) { free(buf); return NULL; }
    if (buf) {
        if (n && buf[n - 1] == '\n') n--;
        buf[n] = 0;
    }
    return buf;
}

static const option_def *find_option(const char *a) {
    size_t i;
    int k;
    for (i = 0; i < sizeof option_defs / sizeof option_defs[0]; i++)
        for (k = 0; k < 3 && option_defs[i].names[k]; k++)
            if (!strcmp(a, option_defs[i].names[k])) return &option_defs[i];
    return NULL;
}

/* Applies one option; returns 0, or 1 after printing an error that names the flag. */
static int apply_option(options *o, int id, const char *a, const char *v) {
    static const char *const presets[] = {"quality", "speed"};
    static const char *const caches[] = {"none", "prefix", "dual"}, *const lacaches[] = {"off", "truncate", "on"},
                             *const precisions[] = {"bf16", "fp8", "fp8-all", "soloq-n", "soloq-i", "soloq-c", "rtn-w4a4", "soloq-n-w4a16",
                                                     "soloq-i-w4a16", "soloq-c-w4a16", "rtn-w4a16"},  /* dllm_precision order */
                             *const backends[] = {"auto", "cpu", "gpu"},
                             *const kv_quants[] = {"none", "soloq-kv4", "soloq-kv2", "kivi-kv4", "kivi-kv2"},  /* dllm_kv_quant order */
                             *const rotations[] = {"default", "none", "hadamard", "rpbh", "mixer", "krpbh", "haar"};  /* dllm_soloq_rotation */
    dllm_gen_params *g = &o->gen;
    int k = 0;
    switch (id) {
    case OPT_MODEL: o->model_dir = v; break;
    case OPT_RANDOM_WEIGHTS: o->model_dir = v, o->random_weights = 1; break;
    case OPT_PROMPT: o->prompt_arg = v; break;
    case OPT_FILE: o->prompt_file = v; break;
    case OPT_IDS: o->ids_text = v; break;
    case OPT_INTERACTIVE: o->interactive = 1; break;
    case OPT_SYSTEM: o->system = v; break;
    case OPT_RAW: o->raw = 1; break;
    case OPT_NO_PARSE_SPECIAL: o->parse_special = 0; break;
    case OPT_VISUAL: o->visual = 1; break;
    case OPT_JSON: o->json = 1; break;
    case OPT_PRINT_IDS: o->print_ids = 1; break;
    case OPT_PROGRESS: o->progress = 1; break;
    case OPT_VERBOSE: o->verbose = 1; break;
    case OPT_N: return count_option(a, v, 1, 1 << 20, "a positive count", &g->gen_length);
    case OPT_STEPS: return count_option(a, v, 1, 1 << 24, "a positive count", &g->steps);
    case OPT_BLOCK: return count_option(a, v, 1, 1 << 20, "a positive length", &g->block_length);
    case OPT_TEMP:
        {
            double t;
            if (!parse_double(v, &t) || !(t >= 0 && t <= FLT_MAX)) return fail("%s must be a finite number >= 0, not \"%s\"", a, v);
            g->temperature = (float)t;
        }
        break;
    case OPT_TOP_K: return count_option(a, v, 0, 1 << 30, "a count >= 0 (0 = off)", &g->top_k);
    case OPT_TOP_P: if (!parse_float(v, &g->top_p) || !(g->top_p > 0 && g->top_p <= 1)) return fail("%s must be in (0, 1] (1 = off), not \"%s\"", a, v); break;
    case OPT_MIN_P: if (!parse_float(v, &g->min_p) || !(g->min_p >= 0 && g->min_p <= 1)) return fail("%s must be in [0, 1] (0 = off), not \"%s\"", a, v); break;
    case OPT_STOP:
        if (!*v) return fail("%s needs a non-empty string", a);
        if (o->n_stops == MAX_STOPS) return fail("at most %d %s strings", MAX_STOPS, a);
        o->stops[o->n_stops++] = v;
        break;
    case OPT_SEED:
        if (!strcmp(v, "-1")) { o->random_seed = 1; break; }
        {
            char *end = NULL;
            errno = 0;
            g->seed = strtoull(v, &end, 0);
            if (errno || !end || *end || end == v || v[0] == '-') return fail("%s must be a non-negative integer or -1 (random), not \"%s\"", a, v);
            o->random_seed = 0;
        }
        break;
    case OPT_ALG:
        if (!parse_alg(v, &g->remasking)) return fail("%s must be low_confidence, maskgit_plus, topk_margin, entropy, origin or random, not \"%s\"", a, v);
        break;
    case OPT_LACACHE: if (!parse_choice(v, lacaches, 3, &k)) return fail("%s must be on, truncate or off, not \"%s\"", a, v); g->lacache = (dllm_lacache)k; break;
    case OPT_CFG: if (!parse_float(v, &g->cfg_scale) || !(g->cfg_scale >= 0)) return fail("%s must be >= 0, not \"%s\"", a, v); break;
    case OPT_THRESHOLD: if (!parse_double(v, &g->threshold)) return fail("%s must be a number, not \"%s\"", a, v); g->unmask = DLLM_UNMASK_THRESHOLD; break;
    case OPT_FACTOR: if (!parse_double(v, &g->factor) || !(g->factor > 0)) return fail("%s must be > 0, not \"%s\"", a, v); g->unmask = DLLM_UNMASK_FACTOR; break;
    case OPT_CACHE: if (!parse_choice(v, caches, 3, &k)) return fail("%s must be none, prefix or dual, not \"%s\"", a, v); g->kv_cache = (dllm_kv_cache)k; break;
    case OPT_DPAD_WINDOW:
        if (count_option(a, v, 2, 1 << 20, "at least 2", &g->dpad_window)) return 1;
        if (g->dpad == DLLM_DPAD_OFF) g->dpad = DLLM_DPAD_GAUSSIAN;
        break;
    case OPT_DPAD_K: if (!parse_float(v, &g->dpad_k) || !(g->dpad_k >= 0)) return fail("%s must be >= 0, not \"%s\"", a, v); break;
    case OPT_DPAD_SCALE: if (!parse_float(v, &g->dpad_scale) || !(g->dpad_scale >= 0)) return fail("%s must be >= 0, not \"%s\"", a, v); break;
    case OPT_DPAD_UNIFORM: if (count_option(a, v, 0, 1 << 20, "a count >= 0", &g->dpad_n)) return 1; g->dpad = DLLM_DPAD_UNIFORM; break;
    case OPT_EARLY_STOP: g->early_stop = 1; break;
    case OPT_NO_EARLY_STOP: g->early_stop = 0; break;
    case OPT_TIMESTEPS: g->unmask = DLLM_UNMASK_TIMESTEPS; break;
    case OPT_EPS: if (!parse_double(v, &g->eps) || !(g->eps > 0 && g->eps < 1)) return fail("%s must be in (0, 1), not \"%s\"", a, v); break;
    case OPT_ALG_TEMP: if (!parse_double(v, &g->alg_temp) || !(g->alg_temp >= 0)) return fail("%s must be >= 0, not \"%s\"", a, v); break;
    case OPT_LOGITS_EOS_INF: g->logits_eos_inf = 1; break;
    case OPT_EOS_EOT_LAST: g->confidence_eos_eot_inf = 1; break;
    case OPT_NO_STOP_AT_EOS: g->stop_at_eos = 0; break;
    case OPT_BACKEND: if (!parse_choice(v, backends, 3, &k)) return fail("%s must be auto, cpu or gpu, not \"%s\"", a, v); o->ctx.backend = (dllm_backend)k; break;
    case OPT_PRECISION:
        if (!parse_choice(v, precisions, 11, &k))
            return fail("%s must be bf16, fp8, fp8-all, soloq-n, soloq-i, soloq-c, rtn-w4a4 or a -w4a16 form, not \"%s\"", a, v);
        o->ctx.precision = (dllm_precision)k;
        o->precision_name = v;
        break;
    case OPT_THREADS: return count_option(a, v, 0, 1024, "a count in [0, 1024] (0 = all cores)", &o->ctx.n_threads);
    case OPT_SOLOQ_ROTATION:
        if (!parse_choice(v, rotations, 7, &k)) return fail("%s must be none, hadamard, rpbh, mixer, krpbh or haar, not \"%s\"", a, v);
        o->ctx.soloq_rotation = (dllm_soloq_rotation)k;
        break;
    case OPT_SOLOQ_BIAS_CORRECTION:
        if (strcmp(v, "0") && strcmp(v, "1")) return fail("%s must be 0 or 1, not \"%s\"", a, v);
        o->ctx.soloq_bias_correction = v[0] == '1';
        break;
    case OPT_DEVICES:
        if (!parse_devices(v, &o->ctx)) return fail("%s must be up to %d comma-separated GPU ordinals such as 0,1, not \"%s\"", a, DLLM_MAX_DEVICES, v);
        o->devices_text = v;
        break;
    case OPT_SUB_BLOCK: return count_option(a, v, 1, 1 << 20, "a positive length", &g->sub_block_length);
    case OPT_BLOCK_CACHE: g->block_cache = 1; break;
    case OPT_TUNED_FORWARDS: g->tuned_forwards = 1; break;
    case OPT_KV_QUANT:
        if (!parse_choice(v, kv_quants, 5, &k)) return fail("%s must be none, soloq-kv4, soloq-kv2, kivi-kv4 or kivi-kv2, not \"%s\"", a, v);
        o->ctx.kv_quant = (dllm_kv_quant)k;
        break;
    case OPT_KV_SINKS: return count_option(a, v, 0, 1 << 20, "a count >= 0", &o->ctx.kv_sink_tokens);
    case OPT_MASK_ID: if (!parse_int(v, 0, INT32_MAX, &g->mask_id)) return fail("%s must be a token id, not \"%s\"", a, v); break;
    case OPT_STOP_ID: if (!parse_int(v, 0, INT32_MAX, &g->stop_id)) return fail("%s must be a token id, not \"%s\"", a, v); break;
    case OPT_EDIT_THRESHOLD:
        if (!parse_double(v, &g->edit_threshold) || !(g->edit_threshold >= 0 && g->edit_threshold <= 1))
            return fail("%s must be in [0, 1] (1 = LLaDA2.1's loop without edits), not \"%s\"", a, v);
        break;
    case OPT_MAX_POST_STEPS: if (!parse_int(v, 0, 1 << 20, &g->max_post_steps)) return fail("%s must be a count >= 0, not \"%s\"", a, v); break;
    case OPT_PRESET:
        if (!parse_choice(v, presets, 2, &k)) return fail("%s must be quality or speed, not \"%s\"", a, v);
        g->threshold = k == 0 ? 0.7 : 0.5, g->edit_threshold = k == 0 ? 0.5 : 0.0, g->unmask = DLLM_UNMASK_THRESHOLD;
        break;
    case OPT_PROMPTS: o->prompts_file = v; break;
    case OPT_BATCH: return count_option(a, v, 1, 1 << 16, "a positive count", &o->batch);
    }
    return 0;
}

/* Pairs of options that contradict each other: the second would silently override the first. */
static int check_conflicts(const options *o) {
    static const int pairs[][2] = {
        {OPT_PROMPT, OPT_FILE}, {OPT_PROMPT, OPT_IDS}, {OPT_FILE, OPT_IDS}, {OPT_INTERACTIVE, OPT_IDS},
        {OPT_THRESHOLD, OPT_FACTOR}, {OPT_THRESHOLD, OPT_TIMESTEPS}, {OPT_FACTOR, OPT_TIMESTEPS},
        {OPT_EARLY_STOP, OPT_NO_EARLY_STOP}, {OPT_PRESET, OPT_THRESHOLD}, {OPT_PRESET, OPT_EDIT_THRESHOLD}, {OPT_RAW, OPT_SYSTEM}, {OPT_RAW, OPT_INTERACTIVE}, {OPT_VISUAL, OPT_JSON},
        {OPT_VISUAL, OPT_INTERACTIVE}, {OPT_DPAD_UNIFORM, OPT_DPAD_K}, {OPT_DPAD_UNIFORM, OPT_DPAD_SCALE},
        /* --prompts prints final answers only: nothing streams, stops or redraws */
        {OPT_PROMPTS, OPT_PROMPT}, {OPT_PROMPTS, OPT_FILE}, {OPT_PROMPTS, OPT_IDS}, {OPT_PROMPTS, OPT_INTERACTIVE}, {OPT_PROMPTS, OPT_VISUAL},
{OPT_PROMPTS, OPT_STOP}, {OPT_PROMPTS, OPT_PROGRESS}};
    size_t i;
    for (i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (o->given[pairs[i][0]] && o->given[pairs[i][1]])
            return fail("%s and %s conflict: pass one of them", o->given[pairs[i][0]], o->given[pairs[i][1]]);
    if (o->given[OPT_DEVICES] && o->ctx.backend == DLLM_BACKEND_CPU)
        return fail("%s picks GPUs, and --backend cpu runs on the CPU: drop %s", o->given[OPT_DEVICES], o->given[OPT_DEVICES]);
    if (o->given[OPT_KV_SINKS] && o->ctx.kv_quant == DLLM_KV_QUANT_NONE)
        return fail("%s keeps sinks of a quantised cache: it needs --kv-quant", o->given[OPT_KV_SINKS]);
    return 0;
}

/* Combinations the library would refuse, checked here so that the message names the flags. */
static int check_schedule(const options *o) {
    const dllm_gen_params *g = &o->gen;
    const char *rule = o->given[OPT_THRESHOLD] ? o->given[OPT_THRESHOLD] : o->given[OPT_FACTOR];
    int b;
    if (g->gen_length % g->block_length) {
        for (b = g->block_length; g->gen_length % b; b--) {}
        return fail("-n %d is not a multiple of --block %d: pick a --block that divides it (e.g. %d)", g->gen_length, g->block_length, b);
    }
    if (g->remasking == DLLM_REMASK_ORIGIN && rule)
        return fail("--alg origin commits by Dream's timestep schedule, which %s replaces: drop %s or pick another --alg", rule, rule);
    if (g->remasking == DLLM_REMASK_ORIGIN && g->confidence_eos_eot_inf) return fail("--alg origin ranks nothing, so --eos-eot-last cannot apply: drop it");
    if (g->alg_temp > 0 && (rule || g->remasking == DLLM_REMASK_ORIGIN))
        return fail("--alg-temp samples the positions of a counted step; %s has none: drop --alg-temp", rule ? rule : "--alg origin");
    if (g->unmask == DLLM_UNMASK_THRESHOLD && g->remasking != DLLM_REMASK_ENTROPY && !(g->threshold > 0 && g->threshold <= 1))
        return fail("--threshold must be in (0, 1] (or <= 0 with --alg entropy), not %g", g->threshold);
    if (g->unmask == DLLM_UNMASK_THRESHOLD && g->remasking == DLLM_REMASK_ENTROPY && !(g->threshold <= 0))
        return fail("with --alg entropy the confidence is minus the entropy (<= 0): --threshold must be <= 0 (e.g. -0.5), not %g", g->threshold);
    return 0;
}

static const char *family_name(dllm_family f) {
    switch (f) {
    case DLLM_FAMILY_LLADA: return "LLaDA";
    case DLLM_FAMILY_DREAM: return "Dream";
    case DLLM_FAMILY_FAST_DLLM_V2: return "Fast-dLLM v2";
    case DLLM_FAMILY_NEMOTRON_DIFFUSION: return "Nemotron-Labs-Diffusion";
    case DLLM_FAMILY_LLADA2: return "LLaDA2";
    }
    return "this";
}

/* The checks that need the model: which options apply to its family, with block diffusion's rules in flag names.
 * 0, or 1 after printing an error. */
static int check_model_options(options *o, const dllm_model_info *info) {
    const dllm_gen_params *g = &o->gen;
    const char *fam = family_name(info->family);
    int i;
    if (info->block_size <= 0) {  /* LLaDA, Dream: the block-diffusion options mean nothing */
        static const int bd_only[] = {OPT_SUB_BLOCK, OPT_BLOCK_CACHE, OPT_STOP_ID};
        const int counted = g->unmask == DLLM_UNMASK_SCHEDULE || g->unmask == DLLM_UNMASK_TIMESTEPS;
        const int n_blocks = g->gen_length / g->block_length;
        for (i = 0; i < (int)(sizeof bd_only / sizeof bd_only[0]); i++)
            if (o->given[bd_only[i]])
                return fail("%s applies to block-diffusion models (Fast-dLLM v2, Nemotron) only, and %s is a %s model: drop %s", o->given[bd_only[i]],
                            o->model_dir, fam, o->given[bd_only[i]]);
        if (!counted && o->given[OPT_STEPS])
            warn("%s is ignored with %s (a block steps until it has no mask left); drop %s", o->given[OPT_STEPS],
                 o->given[OPT_THRESHOLD] ? o->given[OPT_THRESHOLD] : o->given[OPT_FACTOR], o->given[OPT_STEPS]);
        /* more steps than tokens: the steps past one a token commit nothing and only cost forwards */
        if (counted && g->steps > g->gen_length)
            return fail("%s %d is more than -n %d: a step commits at least one token, so at most %d steps (one token a step) commit anything: "
                        "pass %s %d or less", o->given[OPT_STEPS], g->steps, g->gen_length, g->gen_length, o->given[OPT_STEPS], g->gen_length);
        if (counted && g->steps % n_blocks)
            return fail("--steps %d is not a multiple of the %d blocks (-n %d / --block %d): pass --steps %d", g->steps, n_blocks, g->gen_length,
                        g->block_length, (g->steps / n_blocks + 1) * n_blocks);
        return 0;
    }
    /* block diffusion: greedy, its own cache and stop token; the options of the other schedulers do not apply */
    {
        static const int not_bd[] = {OPT_STEPS, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_CFG, OPT_FACTOR, OPT_TIMESTEPS, OPT_EPS, OPT_ALG_TEMP,
                                     OPT_CACHE, OPT_DPAD_WINDOW, OPT_DPAD_K, OPT_DPAD_SCALE, OPT_DPAD_UNIFORM, OPT_EARLY_STOP, OPT_LOGITS_EOS_INF,
                                     OPT_EOS_EOT_LAST};
        const int B = o->given[OPT_BLOCK] ? g->block_length : info->block_size, S = g->sub_block_length ? g->sub_block_length : 8;
        for (i = 0; i < (int)(sizeof not_bd / sizeof not_bd[0]); i++) {
            const char *a = o->given[not_bd[i]];
            if (!a) continue;
            if (not_bd[i] == OPT_STEPS)
                return fail("%s does not apply to %s, a block-diffusion model: each sub-block steps until it has no mask left (--threshold sets how "
                            "many a step commits): drop %s", a, o->model_dir, a);
            if (not_bd[i] == OPT_TEMP && g->temperature == 0) continue;
            return fail("%s does not apply to %s, a block-diffusion model (%s decodes greedily, with its own block cache and stop token): drop %s", a,
                        o->model_dir, fam, a);
        }
        if (g->remasking != DLLM_REMASK_LOW_CONFIDENCE)
            return fail("%s does not apply to %s, a block-diffusion model (it commits by confidence, as --alg low_confidence): drop %s", o->given[OPT_ALG],
                        o->model_dir, o->given[OPT_ALG]);
        if (g->gen_length % B)
            return fail("-n %d is not a multiple of the block, %d (%s): pass -n %d, or a --block that divides -n", g->gen_length, B,
                        o->given[OPT_BLOCK] ? "--block" : "the model's; --block changes it", (g->gen_length / B + 1) * B);
        if (B % S)
            return fail("%s %d must divide the block, %d (%s): pass a --sub-block that divides it", o->given[OPT_SUB_BLOCK] ? "--sub-block" : "the default --sub-block",
                        S, B, o->given[OPT_BLOCK] ? "--block" : "the model's");
        if (g->mask_id < 0 && info->mask_id < 0) return fail("%s names no mask token: pass --mask-id ID", o->model_dir);
    }
    return 0;
}

/* Returns 0 to go on, 1 after printing an error, 2 after printing help or the version. */
static int parse_args(int argc, char **argv, options *o) {
    int i, rc, b;
    o->gen = dllm_gen_default_params();
    o->ctx = dllm_ctx_default_params();
    o->parse_special = 1;
    o->random_seed = 1;
    o->gen.early_stop = -1;  /* not chosen yet */
    o->batch = 8;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        const option_def *d = find_option(a);
        if (!d) return a[0] == '-' && a[1] ? fail("unknown option %s (see --help)", a) : fail("unexpected argument \"%s\" (see --help)", a);
        if (d->id == OPT_HELP) { usage(stdout); return 2; }
        if (d->id == OPT_VERSION) { printf("dllm-generate (dllm %s)\n", dllm_version()); return 2; }
        if (d->takes_value) {
            if (i + 1 >= argc) return fail("option %s needs a value (see --help)", a);
            v = argv[++i];
        }
        if (o->given[d->id] && d->id != OPT_STOP)
            return strcmp(o->given[d->id], a) ? fail("%s and %s are the same option, given twice: pass it once", o->given[d->id], a)
                                              : fail("%s is given twice: pass it once", a);
        o->given[d->id] = a;
        if ((rc = apply_option(o, d->id, a, v))) return rc;
    }
    if ((rc = check_conflicts(o))) return rc;
    if (o->given[OPT_MODEL] && o->given[OPT_RANDOM_WEIGHTS])
        return fail("%s and %s both name the model: pass one (%s DIR reads DIR's config.json and tokenizer, not its weights)",
                    o->given[OPT_MODEL], o->given[OPT_RANDOM_WEIGHTS], o->given[OPT_RANDOM_WEIGHTS]);
    if (!o->model_dir) return fail("no model: pass -m DIR (see --help)");
    if (!o->ids_text && !o->prompt_arg && !o->prompt_file && !o->interactive && !o->prompts_file)
        return fail("no prompt: pass -p \"text\", -f FILE, --ids \"I J K\", -i or --prompts FILE");
    if (o->given[OPT_BATCH] && !o->prompts_file) return fail("%s sets how many --prompts decode together: pass --prompts FILE", o->given[OPT_BATCH]);
    if ((o->raw || o->visual || o->system || !o->parse_special) && o->ids_text)
        return fail("%s goes with a text prompt (-p, -f or -i), not --ids", o->raw ? "--raw" : o->visual ? "--visual" : o->system ? "--system" : "--no-parse-special");
    /* The defaults a new user expects: a block that divides -n, a step a token, early stop where it changes nothing. */
    if (!o->given[OPT_BLOCK]) {
        for (b = o->gen.gen_length < 32 ? o->gen.gen_length : 32; o->gen.gen_length % b; b--) {}
        o->gen.block_length = b;
    }
    if (!o->given[OPT_STEPS]) o->gen.steps = o->gen.gen_length;
    if (o->gen.early_stop < 0) o->gen.early_stop = o->gen.stop_at_eos;
    /* origin has no other count */
    if (o->gen.remasking == DLLM_REMASK_ORIGIN && o->gen.unmask == DLLM_UNMASK_SCHEDULE) o->gen.unmask = DLLM_UNMASK_TIMESTEPS;
    if ((rc = check_schedule(o))) return rc;
    /* A fresh seed only where something is drawn; otherwise the seed changes nothing and stays 0. */
    if (o->random_seed && (o->gen.temperature > 0 || o->gen.remasking == DLLM_REMASK_RANDOM || o->gen.remasking == DLLM_REMASK_ORIGIN ||
                           o->gen.alg_temp > 0 || o->gen.dpad != DLLM_DPAD_OFF))
        o->gen.seed = fresh_seed();
    if (o->prompt_arg && !strcmp(o->prompt_arg, "-")) {
        if (!(o->prompt = read_all(stdin))) return fail("-p -: cannot read the prompt from stdin");
    } else if (o->prompt_arg) {
        if (!(o->prompt = (char *)malloc(strlen(o->prompt_arg) + 1))) return fail("out of memory");
        strcpy(o->prompt, o->prompt_arg);
    } else if (o->prompt_file) {
        FILE *f = fopen(o->prompt_file, "rb");
        if (!f) return fail("-f %s: %s", o->prompt_file, strerror(errno));
        o->prompt = read_all(f);
        fclose(f);
        if (!o->prompt) return fail("-f %s: cannot read it", o->prompt_file);
    }
    if (o->prompt && !*o->prompt) {  /* decodable, but rarely meant */
        const char *then = o->raw ? "with --raw the model decodes from nothing" : "the model answers an empty user turn";
        if (o->prompt_file) warn("-f %s is empty: %s", o->prompt_file, then);
        else if (!strcmp(o->prompt_arg, "-")) warn("-p - read an empty stdin: %s", then);
        else warn("-p \"\" is an empty prompt: %s", then);
    }
    return 0;
}

/* ---- text out: streaming, stop strings, progress ------------------------------------------------- */

/* What the step callback needs to show the answer as it forms. */
typedef struct {
    const options *o;
    answer_text answer;         /* the settled text and stop strings (common.h); tok NULL without a tokenizer */
    int tty;                    /* stdout is a terminal: --visual redraws in place */
    int live;                   /* the answer is streamed to stdout as it forms */
    int progress_line;          /* --progress redraws one line on a terminal */
    int last_block;             /* --progress without a terminal: the block last reported */
    size_t printed;             /* bytes of the answer already written to stdout */
} stream;

/* Writes the answer text beyond what is already on stdout; returns 0, or -1 if the ids do not decode. A trailing
 * U+FFFD may be half of a character whose other bytes are not committed yet, so it waits unless this is the end. */
static int print_new_text(stream *s, const int32_t *ids, int n, int final) {
    long len = answer_detok(&s->answer, ids, n);
    if (len < 0) return -1;
    len = answer_shown_length(&s->answer, s->answer.text, len, final);
    if (len > (long)s->printed) {
        fwrite(s->answer.text + s->printed, 1, (size_t)len - s->printed, stdout);
        fflush(stdout);
        s->printed = (size_t)len;
    }
    return 0;
}

/* --visual: the generated canvas with each mask as '_', runs of tokens decoded together so that
 * characters split across tokens come out whole. An EOS / EoT token shows as "[EOS]" / "[EOT]": with the
 * answer ending at the first one (the default), the canvas after it is not drawn. */
static void draw_canvas(stream *s, const dllm_step_info *info) {
    answer_text *a = &s->answer;
    const int32_t *gen = info->canvas + info->prompt_len;
    int n = info->canvas_len - info->prompt_len, i = 0;
    if (s->tty) printf("\033[H\033[2J");
    printf("step %d/%d, %d mask%s left\n", info->global_step, info->total_steps, info->n_masked, plural(info->n_masked));
    while (i < n) {
        int run = i;
        while (run < n && gen[run] != a->mask_id && gen[run] != a->eos_id && gen[run] != a->eot_id) run++;
        if (run > i && answer_detok(a, gen + i, run - i) >= 0) fputs(a->text, stdout);
        if (run < n && gen[run] != a->mask_id) {  /* EOS or EoT: where the answer ends */
            fputs(gen[run] == a->eos_id ? "[EOS]" : "[EOT]", stdout);
            if (s->o->gen.stop_at_eos) break;
            i = run + 1;
            continue;
        }
        for (i = run; i < n && gen[i] == a->mask_id; i++) putchar('_');
    }
    printf("\n");
    fflush(stdout);
}

static void show_progress(stream *s, const dllm_step_info *info) {
    if (s->progress_line) {
        fprintf(stderr, "\rstep %d/%d  block %d/%d  masks left %d\033[K", info->global_step, info->total_steps, info->block + 1, info->n_blocks,
                info->n_masked);
    } else if (info->block != s->last_block) {  /* a log, not a terminal: one line a block */
        fprintf(stderr, "block %d/%d from step %d of at most %d\n", info->block + 1, info->n_blocks, info->global_step, info->total_steps);
        s->last_block = info->block;
    }
}

static int on_step(const dllm_step_info *info, void *user_data) {
    stream *s = (stream *)user_data;
    const int32_t *gen = info->canvas + info->prompt_len;
    int n;
    if (s->o->progress) show_progress(s, info);
    if (!s->answer.tok) return 0;
    if (s->o->visual) draw_canvas(s, info);
    n = answer_settled_prefix(&s->answer, gen, info->canvas_len - info->prompt_len);
    if (s->o->n_stops && answer_reached_stop(&s->answer, gen, n)) {
        if (s->live) print_new_text(s, gen, s->answer.stop_ids, 1);
        return 1;  /* cancel: nothing after the stop string is wanted */
    }
    if (s->live) print_new_text(s, gen, n, 0);
    return 0;
}

static void log_to_stderr(dllm_log_level level, const char *text, void *user_data) {
    (void)level;
    (void)user_data;
    fprintf(stderr, "dllm: %s\n", text);
}

static void json_string(FILE *f, const char *s, size_t n) {
    size_t i;
    fputc('"', f);
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* ---- prompts ------------------------------------------------------------------------------------- */

typedef struct {
    dllm_chat_message *msgs;
    int n, cap;
} conversation;

static int conv_add(conversation *c, const char *role, const char *content) {
    char *copy = (char *)malloc(strlen(content) + 1);
    if (!copy) return 0;
    strcpy(copy, content);
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        dllm_chat_message *grown = (dllm_chat_message *)realloc(c->msgs, sizeof *grown * (size_t)cap);
        if (!grown) { free(copy); return 0; }
        c->msgs = grown;
        c->cap = cap;
    }
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = copy;
    c->n++;
    return 1;
}

static void conv_free(conversation *c) {
    int i;
    for (i = 0; i < c->n; i++) free((void *)c->msgs[i].content);
    free(c->msgs);
}

typedef struct {
    int32_t *ids;
    int n, cap;
} id_list;

/* Appends the tokens of text[0..len) to l; 0 after printing an error. */
static int tokenize_into(const dllm_tokenizer *tok, const char *text, size_t len, int parse_special, id_list *l) {
    int n = 0;
    dllm_tokenize(tok, text, len, parse_special, NULL, 0, &n);
    if (l->n + n > l->cap) {
        int cap = l->n + n + 64;
        int32_t *grown = (int32_t *)realloc(l->ids, sizeof(int32_t) * (size_t)cap);
        if (!grown) return !fail("out of memory");
        l->ids = grown;
        l->cap = cap;
    }
    if (dllm_tokenize(tok, text, len, parse_special, l->ids + l->n, l->cap - l->n, &n) != DLLM_OK) return !fail("%s", dllm_last_error());
    l->n += n;
    return 1;
}

/* Renders c (assistant turn opened); *out is malloc'ed. 0 after printing an error. */
static int render(const dllm_tokenizer *tok, const dllm_chat_message *msgs, int n, char **out, size_t *len) {
    dllm_chat_render(tok, msgs, n, 1, NULL, 0, len);
    if (!(*out = (char *)malloc(*len ? *len : 1))) return !fail("out of memory");
    if (dllm_chat_render(tok, msgs, n, 1, *out, *len, len) != DLLM_OK) { free(*out); return !fail("%s", dllm_last_error()); }
    (*len)--;
    return 1;
}

/* The conversation's tokens with each message's text taken as plain text (--no-parse-special) while the
 * template's own special tokens stay special: rendered once with a sentinel for every message to find the
 * template's pieces, and once per message with its own text, to find that text as the template writes it
 * (LLaDA's trims it). */
static int tokenize_plain_messages(const dllm_tokenizer *tok, const conversation *c, id_list *l) {
    dllm_chat_message *sent = (dllm_chat_message *)malloc(sizeof *sent * (size_t)(c->n ? c->n : 1));
    char (*marks)[32] = (char (*)[32])malloc(32 * (size_t)(c->n ? c->n : 1));
    char *all = NULL, *one = NULL;
    size_t all_len = 0, one_len = 0, at = 0;
    int i, ok = sent && marks;
    for (i = 0; ok && i < c->n; i++) {
        snprintf(marks[i], sizeof marks[i], "\x01\x02msg%d\x02\x01", i);
        sent[i].role = c->msgs[i].role;
        sent[i].content = marks[i];
    }
    ok = ok && render(tok, sent, c->n, &all, &all_len);
    for (i = 0; ok && i < c->n; i++) {
        const char *mark = strstr(all + at, marks[i]);
        size_t pos, mlen = strlen(marks[i]), text_len;
        if (!mark) { ok = !fail("--no-parse-special: the chat template does not write message %d verbatim", i); break; }
        pos = (size_t)(mark - all);
        ok = tokenize_into(tok, all + at, pos - at, 1, l);
        sent[i].content = c->msgs[i].content;
        ok = ok && render(tok, sent, c->n, &one, &one_len);
        text_len = one_len + mlen - all_len;  /* only message i differs between the two renderings */
        ok = ok && tokenize_into(tok, one + pos, text_len, 0, l);
        free(one);
        one = NULL;
        sent[i].content = marks[i];
        at = pos + mlen;
    }
    ok = ok && tokenize_into(tok, all + at, all_len - at, 1, l);
    free(all);
    free(marks);
    free(sent);
    return ok;
}

/* The prompt ids of a text conversation (or, with --raw, of the text alone). 0 after printing an error. */
static int text_prompt(const options *o, const dllm_tokenizer *tok, const conversation *c, id_list *l) {
    char *rendered = NULL;
    size_t len = 0;
    int ok;
    l->n = 0;
    if (o->raw) return tokenize_into(tok, c->msgs[c->n - 1].content, strlen(c->msgs[c->n - 1].content), o->parse_special, l);
    if (dllm_tokenizer_chat_template(tok) == DLLM_CHAT_NONE)
        return !fail("%s: no known chat template for this model; pass --raw to use the prompt as given", o->model_dir);
    if (!o->parse_special) return tokenize_plain_messages(tok, c, l);
    if (!render(tok, c->msgs, c->n, &rendered, &len)) return 0;
    ok = tokenize_into(tok, rendered, len, 1, l);
    free(rendered);
    return ok;
}

/* ---- one generation ------------------------------------------------------------------------------ */

typedef struct {
    dllm_model *model;
    dllm_ctx *ctx;
    dllm_tokenizer *tok;
    dllm_model_info info;
} session;

/* Prompt checks that need the tokens, in the user's words. */
static int check_prompt(const options *o, const session *S, const int32_t *prompt, int n_prompt) {
    int32_t mask = o->gen.mask_id >= 0 ? o->gen.mask_id : S->info.mask_id;
    int i;
    if (n_prompt + o->gen.gen_length > S->info.max_seq_len)
        return fail("the prompt is %d tokens; with -n %d that exceeds the model's context of %d: lower -n or shorten the prompt%s", n_prompt,
                    o->gen.gen_length, S->info.max_seq_len,
                    o->ids_text || o->raw ? "" : " (the chat template adds tokens: --raw leaves it out)");
    if (o->gen.kv_cache != DLLM_KV_CACHE_NONE)
        for (i = 0; i < n_prompt; i++)
            if (prompt[i] == mask)
                return fail("the prompt holds the mask token (id %d) at %d, which %s cannot decode (it recomputes the block only): "
                            "drop %s, or pass --no-parse-special to keep its text plain", mask, i, o->given[OPT_CACHE], o->given[OPT_CACHE]);
    return 0;
}

/* LLaDA2's options (--edit-threshold, --max-post-steps, --preset) on other models, and on LLaDA2 the options its loops
 * do not take: an error naming the flag (0 when none is given). */
static int check_family_options(const options *o, const session *S) {
    static const int llada2_only[] = {OPT_EDIT_THRESHOLD, OPT_MAX_POST_STEPS, OPT_PRESET};
    static const int not_llada2[] = {OPT_CFG, OPT_CACHE, OPT_ALG, OPT_FACTOR, OPT_TIMESTEPS, OPT_EPS, OPT_ALG_TEMP, OPT_DPAD_WINDOW,
                                     OPT_DPAD_K, OPT_DPAD_SCALE, OPT_DPAD_UNIFORM, OPT_LOGITS_EOS_INF, OPT_EOS_EOT_LAST,
                                     OPT_SUB_BLOCK, OPT_BLOCK_CACHE, OPT_STOP_ID, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_KV_QUANT};
    const int llada2 = S->info.family == DLLM_FAMILY_LLADA2;
    size_t i;
    for (i = 0; !llada2 && i < sizeof llada2_only / sizeof llada2_only[0]; i++)
        if (o->given[llada2_only[i]]) return fail("%s is LLaDA2's (token editing); this model does not take it", o->given[llada2_only[i]]);
    for (i = 0; llada2 && i < sizeof not_llada2 / sizeof not_llada2[0]; i++)
        if (o->given[not_llada2[i]]) return fail("%s does not apply to LLaDA2's decoding: drop it", o->given[not_llada2[i]]);
    if (llada2 && o->gen.temperature > 0) return fail("%s: LLaDA2 decodes greedily in dllm (temperature 0)", o->given[OPT_TEMP]);
    if (llada2 && o->given[OPT_MAX_POST_STEPS] && o->gen.edit_threshold < 0)
        return fail("%s belongs to LLaDA2.1's loop: add --edit-threshold or --preset", o->given[OPT_MAX_POST_STEPS]);
    return 0;
}

/* The parameters of a run: the options', with block diffusion's defaults; 0, or 1 after printing an error. */
static int run_params(const options *o, const session *S, dllm_gen_params *gp) {
    *gp = o->gen;
    if (check_family_options(o, S)) return 1;
    if (S->info.family == DLLM_FAMILY_LLADA2 && !o->given[OPT_THRESHOLD] && !o->given[OPT_PRESET])
        gp->threshold = 0.95;  /* the official generate's default */
    if (S->info.block_size > 0) {  /* block diffusion: the model's block and stop token; it stops by itself */
        if (!o->given[OPT_BLOCK]) gp->block_length = S->info.block_size;
        if (!o->given[OPT_EARLY_STOP]) gp->early_stop = 0;
    }
    if (gp->early_stop && (gp->eos_id >= 0 ? gp->eos_id : S->info.eos_id) < 0 && (gp->eot_id >= 0 ? gp->eot_id : S->info.eot_id) < 0 &&
        !(S->info.block_size > 0 && gp->stop_id >= 0)) {
        if (o->given[OPT_EARLY_STOP]) return fail("--early-stop needs an EOS or EoT token and the model names none");
        gp->early_stop = 0;  /* only the default asked for it */
    }
    return 0;
}

/* Decodes one prompt and prints the answer (streamed, or whole, or as JSON) and the stats line. The answer's
 * text is left in *answer (malloc'ed, may be NULL without a tokenizer). Returns 0 or 1. */
static int generate(const options *o, session *S, const int32_t *prompt, int n_prompt, char **answer) {
    stream st;
    int32_t *out = (int32_t *)malloc(sizeof(int32_t) * ((size_t)o->gen.gen_length + 1));  /* + 1: block diffusion may end with an AR seed */
    int n_out = 0, n_ids, rc = 1, i;
    long text_len = 0;
    dllm_gen_stats stats;
    dllm_gen_params gp;
    dllm_status s;
    *answer = NULL;
    memset(&st, 0, sizeof st);
    if (!out) return fail("out of memory");
    if (check_prompt(o, S, prompt, n_prompt) || run_params(o, S, &gp)) goto done;
    st.o = o;
    st.answer.tok = S->tok;
    st.answer.stops = o->stops;
    st.answer.n_stops = o->n_stops;
    st.answer.stop_at_eos = o->gen.stop_at_eos;
    st.answer.mask_id = gp.mask_id >= 0 ? gp.mask_id : S->info.mask_id;
    st.answer.eos_id = gp.eos_id >= 0 ? gp.eos_id : S->info.eos_id;
    st.answer.eot_id = gp.eot_id >= 0 ? gp.eot_id : S->info.eot_id;
    if (S->info.block_size > 0 && gp.stop_id >= 0) st.answer.eot_id = gp.stop_id;
    st.tty = isatty(STDOUT_FILENO);
    st.progress_line = o->progress && isatty(STDERR_FILENO);
    /* a progress line and a streamed answer on one terminal would overwrite each other: the answer waits */
    st.live = S->tok && !o->visual && !o->json && !(st.progress_line && st.tty);
    st.last_block = -1;
    st.answer.stop_ids = -1;
    if (o->progress || S->tok) {
        gp.on_step = on_step;
        gp.on_step_data = &st;
    }
    s = dllm_generate(S->ctx, prompt, n_prompt, gp, out, gp.gen_length + 1, &n_out, &stats);
    if (st.progress_line) fprintf(stderr, "\r\033[K");
    if (s != DLLM_OK && !(s == DLLM_ERR_CANCELLED && st.answer.stop_ids >= 0)) {
        if (st.printed) printf("\n");
        fail("%s", in_flags(dllm_ctx_last_error(S->ctx)));
        goto done;
    }
    n_ids = st.answer.stop_ids >= 0 ? st.answer.stop_ids : n_out;
    if (S->tok) {
        if (o->visual || !st.live) st.printed = 0;  /* the answer is printed whole */
        if ((text_len = answer_detok(&st.answer, out, n_ids)) < 0) { fail("%s", dllm_last_error()); goto done; }
        text_len = answer_shown_length(&st.answer, st.answer.text, text_len, 1);
        if ((*answer = (char *)malloc((size_t)text_len + 1))) {
            memcpy(*answer, st.answer.text, (size_t)text_len);
            (*answer)[text_len] = 0;
        }
        if (!o->json) {
            print_new_text(&st, out, n_ids, 1);
            printf("\n");
        }
        /* Cut at a stop string: the ids (and their count) are those of the text before it, the longest prefix of ids
         * whose text the cut answer begins with; a token that holds both the answer's end and the stop string's
         * start is left out with the stop string. */
        if (st.answer.stop_ids >= 0 && *answer) {
            long l;
            while (n_ids > 0 && ((l = answer_detok(&st.answer, out, n_ids)) < 0 || l > text_len ||
                                 memcmp(st.answer.text, *answer, (size_t)l)))
                n_ids--;
        }
    }
    if (o->json) {
        printf("{\"text\": ");
        json_string(stdout, *answer ? *answer : "", *answer ? (size_t)text_len : 0);
        printf(", \"ids\": [");
        for (i = 0; i < n_ids; i++) printf(i ? ", %d" : "%d", out[i]);
        printf("], \"stats\": {\"n_prompt\": %d, \"n_generated\": %d, \"steps\": %d, \"forwards\": %d, \"wall_ms\": %.1f, \"seed\": %llu, "
               "\"backend\": \"%s\", \"stopped_at\": %s}}\n",
               stats.n_prompt, n_ids, stats.steps, stats.forwards, stats.wall_ms, (unsigned long long)gp.seed,
               dllm_ctx_get_backend(S->ctx) == DLLM_BACKEND_GPU ? "gpu" : "cpu", st.answer.stop_ids >= 0 ? "\"stop string\"" : "null");
    } else if (o->print_ids || !S->tok) {
        printf("ids:");
        for (i = 0; i < n_ids; i++) printf(" %d", out[i]);
        printf("\n");
    }
    fflush(stdout);  /* the answer before the stats line, also when both go to one pipe */
    fprintf(stderr, "generated %d token%s (prompt %d) in %d step%s, %d forward%s, %.1f ms (%.1f tokens/s), %s backend, seed %llu%s\n", n_ids,
            plural(n_ids), stats.n_prompt, stats.steps, plural(stats.steps), stats.forwards, plural(stats.forwards), stats.wall_ms,
            stats.wall_ms > 0 ? 1000.0 * n_ids / stats.wall_ms : 0.0,
            dllm_ctx_get_backend(S->ctx) == DLLM_BACKEND_GPU ? "GPU" : "CPU", (unsigned long long)gp.seed,
            st.answer.stop_ids >= 0 ? ", ended at a stop string" : "");
    rc = 0;
done:
    free(st.answer.text);
    free(out);
    return rc;
}

/* ---- --prompts: many prompts, decoded in batches --------------------------------------------------- */

/* The prompt ids of one line of --prompts, with --system first: what -p TEXT would decode. */
static int line_prompt(const options *o, const dllm_tokenizer *tok, const char *line, id_list *l) {
    conversation c = {NULL, 0, 0};
    int ok = (!o->system || conv_add(&c, "system", o->system)) && conv_add(&c, "user", line);
    ok = ok ? text_prompt(o, tok, &c, l) : !fail("out of memory");
    conv_free(&c);
    return ok;
}

/* text[0..len) on one line: a backslash, newline and carriage return written as \\, \n and \r (as dllm-tokenize
 * --decode writes them), so that each --prompts answer is exactly one line. */
static void print_one_line(const char *text, size_t len) {
    size_t i;
    for (i = 0; i < len; i++) {
        if (text[i] == '\\') fputs("\\\\", stdout);
        else if (text[i] == '\n') fputs("\\n", stdout);
        else if (text[i] == '\r') fputs("\\r", stdout);
        else putchar(text[i]);
    }
}

/* Prints one item's final answer: "[N] text" on one line (then its "ids:" line with --print-ids), or with --json
 * one object {"index", "text", "ids", "stats"} on one line. */
static void print_answer(const options *o, const session *S, int index, const int32_t *out, int n_out, const dllm_gen_stats *gs) {
    answer_text a;
    long len = 0;
    int i;
    memset(&a, 0, sizeof a);
    a.tok = S->tok;
    if (S->tok && (len = answer_detok(&a, out, n_out)) < 0) len = 0;
    if (o->json) {
        printf("{\"index\": %d, \"text\": ", index);
        json_string(stdout, a.text ? a.text : "", (size_t)len);
        printf(", \"ids\": [");
        for (i = 0; i < n_out; i++) printf(i ? ", %d" : "%d", out[i]);
        printf("], \"stats\": {\"n_prompt\": %d, \"n_generated\": %d, \"steps\": %d, \"forwards\": %d}}\n", gs->n_prompt, n_out, gs->steps,
               gs->forwards);
    } else {
        printf("[%d] ", index);
        print_one_line(a.text ? a.text : "", (size_t)len);
        printf("\n");
        if (o->print_ids) {
            printf("ids:");
            for (i = 0; i < n_out; i++) printf(" %d", out[i]);
            printf("\n");
        }
    }
    free(a.text);
}

/* --json: a prompt that failed is an object {"index", "error"} in its place. */
static void print_failure(const options *o, int index) {
    if (!o->json) return;
    printf("{\"index\": %d, \"error\": ", index);
    json_string(stdout, last_failure, strlen(last_failure));
    printf("}\n");
}

/* Decodes prompts [first, first + n) of lines together and prints their answers in order. A prompt that cannot
 * decode (too long, a typed mask with a cache, an error from the library) is reported as "prompt N: ..." on stderr
 * and the others still decode. 0, or 1 if any failed. */
static int generate_batch(const options *o, session *S, char **lines, int first, int n) {
    const int cap = o->gen.gen_length + 1;  /* + 1: block diffusion may end with an AR seed */
    dllm_batch_item *items = (dllm_batch_item *)calloc((size_t)n, sizeof *items);
    dllm_batch_result *results = (dllm_batch_result *)calloc((size_t)n, sizeof *results);
    int32_t *outs = (int32_t *)malloc(sizeof(int32_t) * (size_t)cap * (size_t)n);
    int *index = (int *)malloc(sizeof(int) * (size_t)n);   /* items[j] is prompt index[j] */
    char **errors = (char **)calloc((size_t)n, sizeof *errors); /* prompt first + i's error, for --json */
    dllm_gen_params gp;
    dllm_gen_stats bs;
    int i, j, m = 0, rc = 1;
    memset(&bs, 0, sizeof bs);
    if (!items || !results || !outs || !index || !errors) { fail("out of memory"); goto done; }
    if (run_params(o, S, &gp)) goto done;
    rc = 0;
    for (i = 0; i < n; i++) {
        id_list ids = {NULL, 0, 0};
        current_prompt = first + i;
        if (!line_prompt(o, S->tok, lines[first + i], &ids) || check_prompt(o, S, ids.ids, ids.n)) {
            free(ids.ids);
            rc = 1;
            if ((errors[i] = (char *)malloc(strlen(last_failure) + 1))) strcpy(errors[i], last_failure);
            continue;
        }
        items[m].prompt = ids.ids, items[m].n_prompt = ids.n, items[m].params = gp;
        items[m].out = outs + (size_t)m * cap, items[m].out_capacity = cap;
        index[m++] = first + i;
    }
    current_prompt = -1;
    if (m) dllm_generate_batch(S->ctx, items, m, results, &bs);
    for (i = 0, j = 0; i < n; i++) {
        if (j < m && index[j] == first + i) {
            if (results[j].status == DLLM_OK) {
                print_answer(o, S, first + i, items[j].out, results[j].n_out, &results[j].stats);
            } else {
                current_prompt = first + i;
                rc = fail("%s", in_flags(results[j].error));
                current_prompt = -1;
                print_failure(o, first + i);
            }
            j++;
        } else if (errors[i]) {
            snprintf(last_failure, sizeof last_failure, "%s", errors[i]);
            print_failure(o, first + i);
        }
    }
    fflush(stdout);  /* the answers before the stats line, also when both go to one pipe */
    if (m)
        fprintf(stderr, "batch of %d prompt%s (%d-%d): generated %d token%s in %d batched step%s, %d forward%s, %.1f ms (%.1f tokens/s), %s backend, "
                "seed %llu\n", m, plural(m), first, first + n - 1, bs.n_generated, plural(bs.n_generated), bs.steps, plural(bs.steps), bs.forwards,
                plural(bs.forwards), bs.wall_ms, bs.wall_ms > 0 ? 1000.0 * bs.n_generated / bs.wall_ms : 0.0,
                dllm_ctx_get_backend(S->ctx) == DLLM_BACKEND_GPU ? "GPU" : "CPU", (unsigned long long)gp.seed);
done:
    current_prompt = -1;
    for (i = 0; items && i < m; i++) free((void *)items[i].prompt);
    for (i = 0; errors && i < n; i++) free(errors[i]);
    free(errors);
    free(index);
    free(items);
    free(results);
    free(outs);
    return rc;
}

/* --prompts FILE: every non-empty line a prompt, --batch of them at a time. */
static int generate_prompts(const options *o, session *S) {
    FILE *f = fopen(o->prompts_file, "rb");
    char *text, *line, **lines = NULL;
    int n = 0, cap = 0, first, rc = 0;
    if (!f) return fail("--prompts %s: %s", o->prompts_file, strerror(errno));
    text = read_all(f);
    fclose(f);
    if (!text) return fail("--prompts %s: cannot read it", o->prompts_file);
    for (line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        if (n == cap) {
            char **grown = (char **)realloc(lines, sizeof *lines * (size_t)(cap = cap ? 2 * cap : 64));
            if (!grown) { free(lines); free(text); return fail("out of memory"); }
            lines = grown;
        }
        lines[n++] = line;
    }
    if (!n) rc = fail("--prompts %s holds no prompt (one a line)", o->prompts_file);
    for (first = 0; first < n; first += o->batch) rc |= generate_batch(o, S, lines, first, n - first < o->batch ? n - first : o->batch);
    free(lines);
    free(text);
    return rc;
}

/* One line of stdin (newline dropped) into a malloc'ed string; NULL at end of input. */
static char *read_line(void) {
    size_t cap = 256, n = 0;
    char *line = (char *)malloc(cap);
    int c;
    while (line && (c = getchar()) != EOF && c != '\n') {
        if (n + 1 == cap) {
            char *grown = (char *)realloc(line, cap *= 2);
            if (!grown) { free(line); return NULL; }
            line = grown;
        }
        line[n++] = (char)c;
    }
    if (line && c == EOF && n == 0) { free(line); return NULL; }
    if (line) line[n] = 0;
    return line;
}

/* -i: each line on stdin is a user turn; the answer joins the conversation. */
static int chat(const options *o, session *S, conversation *c) {
    id_list ids = {NULL, 0, 0};
    int rc = 0, prompt_tty = isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
    for (;;) {
        char *line, *answer = NULL;
        if (c->n == 0 || !strcmp(c->msgs[c->n - 1].role, "assistant") || !strcmp(c->msgs[c->n - 1].role, "system")) {
            if (prompt_tty) fprintf(stderr, "> ");
            if (!(line = read_line())) break;
            if (!*line) { free(line); continue; }
            rc = !conv_add(c, "user", line) && fail("out of memory");
            free(line);
            if (rc) break;
        }
        if (!text_prompt(o, S->tok, c, &ids) || generate(o, S, ids.ids, ids.n, &answer)) { rc = 1; break; }
        rc = !conv_add(c, "assistant", answer ? answer : "") && fail("out of memory");
        free(answer);
        if (rc) break;
    }
    free(ids.ids);
    return rc;
}

/* The quantising line of a terminal, redrawn in place (user_data: the precision's name). */
static void show_quantize_progress(int done, int total, void *user_data) {
    fprintf(stderr, "\r\033[Kdllm-generate: quantising the linears to %s at load (dllm-quantize does it once, ahead): layer %d/%d",
            (const char *)user_data, done, total);
    fflush(stderr);
}

int main(int argc, char **argv) {
    options o;
    session S;
    conversation conv = {NULL, 0, 0};
    id_list ids = {NULL, 0, 0};
    char *answer = NULL;
    int rc, quantising;
    dllm_status st;

    memset(&o, 0, sizeof o);
    memset(&S, 0, sizeof S);
    rc = parse_args(argc, argv, &o);
    if (rc) {
        free(o.prompt);
        return rc == 2 ? 0 : 1;
    }
    rc = 1;
    if (o.verbose) dllm_log_set(log_to_stderr, NULL, DLLM_LOG_INFO);
    if (o.ids_text && (ids.n = parse_ids(o.ids_text, &ids.ids)) < 0) {
        free(o.prompt);
        return fail("bad --ids \"%s\": expected non-negative integers separated by spaces", o.ids_text);
    }
    if (o.ids_text && ids.n == 0) warn("--ids is empty: the model decodes from no prompt");
    st = o.random_weights ? dllm_model_load_random(o.model_dir, 0, &S.model) : dllm_model_load(o.model_dir, dllm_model_default_params(), &S.model);
    if (st != DLLM_OK) { fail("%s (%s)", dllm_last_error(), o.random_weights ? o.given[OPT_RANDOM_WEIGHTS] : "-m"); goto done; }
    dllm_model_get_info(S.model, &S.info);
    if (check_model_options(&o, &S.info)) goto done;
    /* A text prompt needs the tokenizer; an --ids prompt uses it to print the answer when there is one. */
    if (dllm_tokenizer_load(o.model_dir, &S.tok) != DLLM_OK || dllm_tokenizer_check_model(S.tok, S.model) != DLLM_OK) {
        if (!o.ids_text) { fail("%s", dllm_last_error()); goto done; }
        dllm_tokenizer_free(S.tok);
        S.tok = NULL;
        if (o.n_stops) { fail("--stop needs the model's tokenizer, and %s has none that loads", o.model_dir); goto done; }
    }
    if (o.ctx.n_threads > 0) {  /* more threads than cores only slows the CPU backend down */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores > 0 && o.ctx.n_threads > cores) {
            fprintf(stderr, "dllm-generate: note: %s %d is more than the %ld core%s here: using %ld\n", o.given[OPT_THREADS], o.ctx.n_threads, cores,
                    plural(cores), cores);
            o.ctx.n_threads = (int)cores;
        }
    }
    /* SoloQ / RTN precisions quantise every linear when the context is created (seconds to minutes): on a terminal, a
     * line that counts the layers, erased once done. */
    quantising = o.ctx.precision >= DLLM_PRECISION_SOLOQ_N && S.info.precision == DLLM_PRECISION_BF16 && isatty(STDERR_FILENO);
    if (quantising) {
        o.ctx.progress = show_quantize_progress;
        o.ctx.progress_user_data = (void *)o.precision_name;
        show_quantize_progress(0, S.info.n_layer, o.ctx.progress_user_data);
    }
    st = dllm_ctx_create(S.model, o.ctx, &S.ctx);
    if (quantising) fprintf(stderr, "\r\033[K");
    if (st != DLLM_OK) {
        if (o.given[OPT_DEVICES])  /* the library's words about its device list, then the flag that set it */
            fail("%s %s cannot be used: %s: drop %s%s", o.given[OPT_DEVICES], o.devices_text, in_flags(dllm_last_error()), o.given[OPT_DEVICES],
                 st == DLLM_ERR_NO_DEVICE ? " to run on the CPU" : "");
        else if (o.random_weights)  /* random weights are drawn on the GPU: the CPU has none to run */
            fail("%s: %s needs a GPU (on the CPU pass -m with a checkpoint)", in_flags(dllm_last_error()), o.given[OPT_RANDOM_WEIGHTS]);
        else
            fail("%s%s", in_flags(dllm_last_error()),
                 st == DLLM_ERR_NO_DEVICE && o.ctx.backend == DLLM_BACKEND_GPU ? " (drop --backend gpu to run on the CPU)" : "");
        goto done;
    }
    if (o.given[OPT_DEVICES] && dllm_ctx_get_backend(S.ctx) != DLLM_BACKEND_GPU)
        warn("%s picks GPUs, and this run is on the CPU (no usable GPU): %s is ignored; drop it", o.given[OPT_DEVICES], o.given[OPT_DEVICES]);
    if (o.ctx.kv_quant != DLLM_KV_QUANT_NONE) {
        double bytes = 0, bf16 = 0;
        int block = o.given[OPT_BLOCK] ? o.gen.block_length : 0;
        if (dllm_kv_bytes_per_token(S.model, o.ctx.kv_quant, block, &bytes) != DLLM_OK ||
            dllm_kv_bytes_per_token(S.model, DLLM_KV_QUANT_NONE, block, &bf16) != DLLM_OK) {
            fail("%s", dllm_last_error());
            goto done;
        }
        fprintf(stderr, "K/V cache: %.1f bytes per committed token, %.3fx the BF16 cache's %.0f\n", bytes, bytes / bf16, bf16);
    }
    if (o.system && !conv_add(&conv, "system", o.system)) { fail("out of memory"); goto done; }
    if (o.prompt && !conv_add(&conv, "user", o.prompt)) { fail("out of memory"); goto done; }
    if (o.prompts_file) rc = generate_prompts(&o, &S);
    else if (o.interactive) rc = chat(&o, &S, &conv);
    else if (o.ids_text) rc = generate(&o, &S, ids.ids, ids.n, &answer);
    else rc = !text_prompt(&o, S.tok, &conv, &ids) || generate(&o, &S, ids.ids, ids.n, &answer);
done:
    free(answer);
    free(ids.ids);
    free(o.prompt);
    conv_free(&conv);
    dllm_ctx_free(S.ctx);
    dllm_tokenizer_free(S.tok);
    dllm_model_free(S.model);
    return rc;
}
