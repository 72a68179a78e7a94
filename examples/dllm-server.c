/* dllm-server: an OpenAI-compatible HTTP server for diffusion LLMs, over the public dllm API.
 *
 *   build/dllm-server -m models/tiny-llada --port 8080
 *   curl localhost:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'
 *   open http://127.0.0.1:8080/ for the live canvas: the answer drawn as it denoises
 *
 * POST /v1/chat/completions and /v1/completions (streamed as server-sent events with "stream": true), GET
 * /v1/models, /health, and the canvas page at /. Requests take OpenAI's fields and dllm's own under dllm-generate's
 * names and defaults (steps, block_length, threshold, cache, remasking, ...), so that an answer equals what
 * dllm-generate prints for the same prompt and settings. One worker thread owns the dllm context and decodes the
 * queued requests in batches (examples/server/scheduler.c). Built by examples/server/build.sh on libmicrohttpd
 * and cJSON. SIGINT/SIGTERM: stop taking requests, let those in flight finish (--drain-timeout), exit.
 */
#include "../dllm.h"
#include "common.h"
#include "server/http.h"
#include "server/scheduler.h"
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dllm-server -m DIR [options]\n"
            "\n"
            "An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions (\"stream\": true for\n"
            "server-sent events), GET /v1/models and /health, and a live denoising canvas at /.\n"
            "\n"
            "  -m, --model DIR        Hugging Face model directory (config.json + safetensors + tokenizer files)\n"
            "  --random-weights DIR   instead of -m, for benchmarks at real sizes without a checkpoint: a model of DIR's\n"
            "                         config.json shape with random weights drawn on the GPU (GPU backend only; seed 0),\n"
            "                         DIR's tokenizer files and chat template for the text (tools/serve_bench.py writes\n"
            "                         a stand-in); the answers are as dllm-generate --random-weights DIR gives them\n"
            "  --host ADDR            address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every interface)\n"
            "  --port N               TCP port (default 8080; 0 = any free one, printed at start)\n"
            "  --backend B            auto (default), cpu or gpu\n"
            "  --precision P          bf16 (default; a dllm-quantize directory: its own), fp8, fp8-all, soloq-n,\n"
            "                         soloq-i, soloq-c, rtn-w4a4 or a -w4a16 form (see dllm-generate --help)\n"
            "  -t, --threads N        CPU backend threads (default: all)\n"
            "  --max-batch N          sequences decoded together (default 8)\n"
            "  --max-fill-rows N      K/V-cache fill rows one step forwards (a cached block's first step forwards the\n"
            "                         whole canvas); sequences past it wait a step, new requests first (default 1024,\n"
            "                         0 = no bound). Lower keeps steps short for arriving requests\n"
            "  --max-queue N          sequences that may wait for the decoder; more is HTTP 429 (default 64)\n"
            "  --max-streams N        concurrent streaming responses; more is HTTP 429 (default 32)\n"
            "  --max-tokens N         the largest max_tokens a request may ask for (default 1024, at most the model's context)\n"
            "  --max-n N              the largest n (choices a request) (default 4)\n"
            "  --max-body BYTES       request body limit; more is HTTP 413 (default 1048576)\n"
            "  --api-key KEY          require \"Authorization: Bearer KEY\" on /v1/ (default: the DLLM_API_KEY environment\n"
            "                         variable if set, else no key)\n"
            "  --drain-timeout S      on SIGINT/SIGTERM, how long requests in flight may go on before they are cancelled\n"
            "                         (default 30)\n"
            "  -v, --verbose          library log messages at info level\n"
            "  --version              print the version\n"
            "  -h, --help             this text\n"
            "\n"
            "Request fields: OpenAI's model, messages (chat) or prompt (a string, tokenized as given, or token ids),\n"
            "max_tokens (default 128), temperature, top_p, top_k, min_p, seed, stop, stream, stream_options.include_usage,\n"
            "n; dllm's steps, block_length, threshold, factor, cache, remasking, lacache, cfg, timesteps, eps, alg_temp,\n"
            "early_stop, stop_at_eos, logits_eos_inf, eos_eot_last, sub_block_length, block_cache, dpad_window, dpad_k,\n"
            "dpad_scale, dpad_uniform with dllm-generate's defaults; \"dllm_canvas\": true adds per-step canvas events\n"
            "({\"object\": \"dllm.canvas\", ...}) to a stream.\n");
}

#if defined(__GNUC__)
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dllm-server: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_int(const char *s, long lo, long hi, int *out) {
    long v;
    if (!parse_long(s, lo, hi, &v)) return 0;
    *out = (int)v;
    return 1;
}

/* Returns 0 to go on, 1 after printing an error, 2 after printing help or the version. */
static int parse_args(int argc, char **argv, server_config *cfg) {
    static const char *const backends[] = {"auto", "cpu", "gpu"},
                             *const precisions[] = {"bf16", "fp8", "fp8-all", "soloq-n", "soloq-i", "soloq-c", "rtn-w4a4", "soloq-n-w4a16",
                                                     "soloq-i-w4a16", "soloq-c-w4a16", "rtn-w4a16"};  /* dllm_precision order */
    int i, k;
    long body;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 2; }
        if (!strcmp(a, "--version")) { printf("dllm-server (dllm %s)\n", dllm_version()); return 2; }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { cfg->verbose = 1; continue; }
        if (!v && a[0] == '-') return fail("option %s needs a value, or is unknown (see --help)", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--random-weights")) {
            if (cfg->model_dir) return fail("the model is given twice (-m or --random-weights): pass one");
            cfg->model_dir = v;
            cfg->random_weights = !strcmp(a, "--random-weights");
        }
        else if (!strcmp(a, "--host")) cfg->host = v;
        else if (!strcmp(a, "--port")) { if (!parse_int(v, 0, 65535, &cfg->port)) return fail("%s must be a port in [0, 65535], not \"%s\"", a, v); }
        else if (!strcmp(a, "--backend")) {
            if (!parse_choice(v, backends, 3, &k)) return fail("%s must be auto, cpu or gpu, not \"%s\"", a, v);
            cfg->backend = (dllm_backend)k;
        } else if (!strcmp(a, "--precision")) {
            if (!parse_choice(v, precisions, 11, &k)) return fail("%s must be bf16, fp8, fp8-all, soloq-n, soloq-i, soloq-c, rtn-w4a4 or a -w4a16 form, not \"%s\"", a, v);
            cfg->precision = (dllm_precision)k;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!parse_int(v, 0, 1024, &cfg->n_threads)) return fail("%s must be in [0, 1024], not \"%s\"", a, v); }
        else if (!strcmp(a, "--max-batch")) { if (!parse_int(v, 1, 1024, &cfg->max_batch)) return fail("%s must be in [1, 1024], not \"%s\"", a, v); }
        else if (!strcmp(a, "--max-fill-rows")) { if (!parse_int(v, 0, 1 << 20, &cfg->max_fill_rows)) return fail("%s must be in [0, 1048576], not \"%s\"", a, v); }
        else if (!strcmp(a, "--max-queue")) { if (!parse_int(v, 1, 1 << 16, &cfg->max_queue)) return fail("%s must be in [1, 65536], not \"%s\"", a, v); }
        else if (!strcmp(a, "--max-streams")) { if (!parse_int(v, 1, 1 << 12, &cfg->max_streams)) return fail("%s must be in [1, 4096], not \"%s\"", a, v); }
        else if (!strcmp(a, "--max-tokens")) { if (!parse_int(v, 1, 1 << 20, &cfg->max_tokens)) return fail("%s must be a positive count, not \"%s\"", a, v); }
        else if (!strcmp(a, "--max-n")) { if (!parse_int(v, 1, 64, &cfg->max_n)) return fail("%s must be in [1, 64], not \"%s\"", a, v); }
        else if (!strcmp(a, "--max-body")) {
            if (!parse_long(v, 64, 1L << 30, &body)) return fail("%s must be a byte count in [64, 2^30], not \"%s\"", a, v);
            cfg->max_body = (size_t)body;
        } else if (!strcmp(a, "--api-key")) {
            if (!*v) return fail("%s needs a non-empty key", a);
            cfg->api_key = v;
        } else if (!strcmp(a, "--drain-timeout")) { if (!parse_int(v, 0, 86400, &cfg->drain_seconds)) return fail("%s must be seconds in [0, 86400], not \"%s\"", a, v); }
        else return a[0] == '-' ? fail("unknown option %s (see --help)", a) : fail("unexpected argument \"%s\" (see --help)", a);
        i++;  /* the value */
    }
    if (!cfg->model_dir) return fail("no model: pass -m DIR (see --help)");
    if (!cfg->api_key && getenv("DLLM_API_KEY") && *getenv("DLLM_API_KEY")) cfg->api_key = getenv("DLLM_API_KEY");
    return 0;
}

static void log_to_stderr(dllm_log_level level, const char *text, void *user_data) {
    (void)level;
    (void)user_data;
    fprintf(stderr, "dllm: %s\n", text);
}

/* The id clients name the model by: the directory's last component ("models/tiny-llada/" -> "tiny-llada"). */
static void set_model_id(server *srv) {
    char path[sizeof srv->model_id];
    size_t len;
    const char *slash;
    snprintf(path, sizeof path, "%s", srv->cfg.model_dir);
    for (len = strlen(path); len > 1 && path[len - 1] == '/'; len--) path[len - 1] = 0;
    slash = strrchr(path, '/');
    snprintf(srv->model_id, sizeof srv->model_id, "%s", slash && slash[1] ? slash + 1 : path);
}

/* SIGINT/SIGTERM are turned into a byte on this pipe: a handler may run on any thread (the library may have
 * started its own before main), and main reads the pipe at its own pace. */
static int signal_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    unsigned char b = (unsigned char)sig;
    int saved = errno;
    if (write(signal_pipe[1], &b, 1) < 0) {}  /* a full pipe already holds a signal: nothing is lost */
    errno = saved;
}

/* The next signal's number; waits at most timeout_ms (-1: forever); 0 if none came. */
static int next_signal(int timeout_ms) {
    struct pollfd p;
    unsigned char b = 0;
    p.fd = signal_pipe[0];
    p.events = POLLIN;
    for (;;) {
        int r = poll(&p, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        return read(signal_pipe[0], &b, 1) == 1 ? b : 0;
    }
}

/* Waits up to seconds for every completion request to be over (a second signal cuts it short); 1 if they are. */
static int wait_in_flight(server *srv, double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (atomic_load(&srv->in_flight) > 0) {
        if (next_signal(50)) return 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec) > seconds) return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    static server srv;  /* static: threads reach it until the very end of main */
    struct MHD_Daemon *daemon = NULL;
    dllm_ctx *ctx = NULL;
    dllm_ctx_params cp;
    struct sigaction sa;
    int rc, port = 0, sig = 0;
    dllm_status st;

    srv.cfg.host = "127.0.0.1";
    srv.cfg.port = 8080;
    srv.cfg.backend = DLLM_BACKEND_AUTO;
    srv.cfg.precision = DLLM_PRECISION_AUTO;
    srv.cfg.max_batch = 8;
    srv.cfg.max_fill_rows = dllm_stepper_default_params().max_fill_rows;
    srv.cfg.max_queue = 64;
    srv.cfg.max_streams = 32;
    srv.cfg.max_tokens = 1024;
    srv.cfg.max_n = 4;
    srv.cfg.max_body = 1 << 20;
    srv.cfg.drain_seconds = 30;
    rc = parse_args(argc, argv, &srv.cfg);
    if (rc) return rc == 2 ? 0 : 1;
    rc = 1;
    if (pipe(signal_pipe) != 0) return fail("pipe: %s", strerror(errno));
    fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK);  /* the handler never blocks */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);  /* a client closing its socket mid-write is an error return, not the end of the server */
    if (srv.cfg.verbose) dllm_log_set(log_to_stderr, NULL, DLLM_LOG_INFO);

    st = srv.cfg.random_weights ? dllm_model_load_random(srv.cfg.model_dir, 0, &srv.model)
                                : dllm_model_load(srv.cfg.model_dir, dllm_model_default_params(), &srv.model);
    if (st != DLLM_OK) { fail("%s (%s)", dllm_last_error(), srv.cfg.random_weights ? "--random-weights" : "-m"); goto done; }
    dllm_model_get_info(srv.model, &srv.info);
    if (dllm_tokenizer_load(srv.cfg.model_dir, &srv.tok) != DLLM_OK || dllm_tokenizer_check_model(srv.tok, srv.model) != DLLM_OK) {
        fail("%s (the server needs the model's tokenizer)", dllm_last_error());
        goto done;
    }
    if (srv.cfg.max_tokens > srv.info.max_seq_len) srv.cfg.max_tokens = srv.info.max_seq_len;
    cp = dllm_ctx_default_params();
    cp.backend = srv.cfg.backend;
    cp.precision = srv.cfg.precision;
    cp.n_threads = srv.cfg.n_threads;
    if ((st = dllm_ctx_create(srv.model, cp, &ctx)) != DLLM_OK) {
        fail("%s%s", dllm_last_error(), srv.cfg.random_weights      ? " (--random-weights needs a GPU; on the CPU pass -m with a checkpoint)"
                                         : st == DLLM_ERR_NO_DEVICE ? " (drop --backend gpu to run on the CPU)"
                                                                    : "");
        goto done;
    }
    srv.backend_used = dllm_ctx_get_backend(ctx);
    set_model_id(&srv);
    srv.started = time(NULL);
    if (!(srv.sched = sched_create(ctx, srv.cfg.max_batch, srv.cfg.max_fill_rows, srv.cfg.max_queue))) { fail("cannot start the decoding thread"); goto done; }
    if (!(daemon = http_start(&srv, &port))) goto done;
    fprintf(stderr, "dllm-server: serving %s (%s backend) on http://%s%s%s:%d/ (max batch %d, queue %d, streams %d%s)\n", srv.model_id,
            srv.backend_used == DLLM_BACKEND_GPU ? "GPU" : "CPU", strchr(srv.cfg.host, ':') ? "[" : "", srv.cfg.host,
            strchr(srv.cfg.host, ':') ? "]" : "", port, srv.cfg.max_batch, srv.cfg.max_queue, srv.cfg.max_streams,
            srv.cfg.api_key ? ", API key required" : "");

    while (!(sig = next_signal(-1))) {}
    fprintf(stderr, "dllm-server: %s: finishing %d request(s) in flight, taking no new ones\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            atomic_load(&srv.in_flight));
    atomic_store(&srv.stopping, 1);
    sched_drain(srv.sched);
    if (!wait_in_flight(&srv, srv.cfg.drain_seconds)) {
        fprintf(stderr, "dllm-server: cancelling the requests still in flight\n");
        atomic_store(&srv.cancel_all, 1);
        wait_in_flight(&srv, 30);  /* each stops at its next step */
    }
    rc = 0;
done:
    http_stop(daemon);          /* no handler runs after this... */
    sched_free(srv.sched);      /* ...nor the worker after this */
    dllm_ctx_free(ctx);
    dllm_tokenizer_free(srv.tok);
    dllm_model_free(srv.model);
    close(signal_pipe[0]);
    close(signal_pipe[1]);
    if (!rc) fprintf(stderr, "dllm-server: stopped\n");
    return rc;
}
