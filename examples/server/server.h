/* server.h - what the parts of dllm-server share: its configuration and the loaded model. */
#ifndef DLLM_SERVER_SERVER_H
#define DLLM_SERVER_SERVER_H

#include "../../dllm.h"
#include "scheduler.h"

#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

typedef struct server_config {
    const char *model_dir;
    int random_weights;         /* --random-weights: model_dir gives the shape and the tokenizer, the GPU the weights */
    const char *host;
    int port;
    dllm_backend backend;
    dllm_precision precision;
    int n_threads;              /* CPU backend threads, 0 = all */
    int max_batch;              /* sequences decoded together */
    int max_fill_rows;          /* K/V-cache fill rows one step forwards (dllm_stepper_params' max_fill_rows) */
    int max_queue;              /* sequences waiting for the worker; more is 429 */
    int max_streams;            /* concurrent streaming responses; more is 429 */
    int max_tokens;             /* the largest max_tokens a request may ask for */
    int max_n;                  /* the largest n (choices) a request may ask for */
    size_t max_body;            /* request body bytes; more is 413 */
    const char *api_key;        /* NULL: no key needed */
    int drain_seconds;          /* on SIGINT/SIGTERM: how long running requests may go on before they are cancelled */
    int verbose;
} server_config;

typedef struct server {
    server_config cfg;
    dllm_model *model;
    dllm_tokenizer *tok;
    dllm_model_info info;
    char model_id[256];         /* what /v1/models lists and requests name: the model directory's last component */
    dllm_backend backend_used;  /* what the context runs on (never AUTO) */
    scheduler *sched;
    time_t started;
    atomic_int stopping;        /* SIGINT/SIGTERM seen: new requests get 503 */
    atomic_int active_streams;  /* streaming responses open now */
    atomic_int in_flight;       /* completion requests not yet freed (drain waits for 0) */
    atomic_int cancel_all;      /* the drain ran out of time: every sequence stops at its next step */
    atomic_ulong next_request_id;
} server;

#endif
