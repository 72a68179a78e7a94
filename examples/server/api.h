/* api.h - OpenAI request bodies into dllm's generation parameters, and OpenAI-style error objects. */
#ifndef DLLM_SERVER_API_H
#define DLLM_SERVER_API_H

#include "server.h"

#include <cjson/cJSON.h>

#define API_MAX_STOPS 16

/* An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status. */
typedef struct api_error {
    int http_status;
    const char *type;           /* "invalid_request_error", "authentication_error", "rate_limit_error", "server_error" */
    const char *param;          /* the request field at fault, or NULL */
    const char *code;           /* a short machine-readable reason, or NULL */
    char message[512];
} api_error;

#if defined(__GNUC__)
__attribute__((format(printf, 6, 7)))
#endif
void api_error_set(api_error *e, int http_status, const char *type, const char *param, const char *code, const char *fmt, ...);

/* The error object as a JSON text (malloc'ed; NULL when out of memory). */
char *api_error_json(const api_error *e);

/* A parsed, checked completion request: everything the decoding and the response need. */
typedef struct api_request {
    int chat;                   /* /v1/chat/completions; else /v1/completions */
    int stream;
    int include_usage;          /* stream_options.include_usage: a last chunk with the usage */
    int canvas;                 /* dllm_canvas: per-step canvas events in the stream */
    int n_choices;              /* n */
    dllm_gen_params gen;        /* CLI defaults, then the request's fields; choice i decodes with seed + i */
    int seed_drawn;             /* no seed given and something is random: a fresh one was drawn */
    char *stops[API_MAX_STOPS]; /* stop strings (malloc'ed) */
    int n_stops;
    int32_t *prompt;            /* the prompt's ids (malloc'ed): the chat template applied for chat */
    int n_prompt;
    int32_t mask_id, eos_id, eot_id; /* what the streaming needs to find the settled text (CLI's rules) */
    int out_capacity;           /* ids the output may need */
} api_request;

/* Parses and checks body (len bytes) for the endpoint; 0 on success, else -1 with *err filled. On failure nothing
 * is left allocated in *req. */
int api_parse_request(const server *srv, int chat, const char *body, size_t len, api_request *req, api_error *err);

void api_request_free(api_request *req);

/* The settled answer of a canvas (dllm-generate's rules, so that the server answers what the CLI prints). */
typedef struct answer_text {
    const api_request *req;
    const dllm_tokenizer *tok;
    char *text;                 /* detokenisation scratch */
    size_t text_cap;
    int stop_ids;               /* >= 0: a stop string ends the text of the first stop_ids ids */
    long stop_at;
} answer_text;

/* ids[0..n) to text (special tokens skipped) into a->text; its length, or -1. */
long answer_detok(answer_text *a, const int32_t *ids, int n);
/* The generated ids that are settled: up to the first mask (and, with stop_at_eos, the first EOS/EoT). */
int answer_settled_prefix(const answer_text *a, const int32_t *gen, int n_gen);
/* If the text of gen[0..n) holds a stop string: records the fewest ids whose text holds it; returns 1. */
int answer_reached_stop(answer_text *a, const int32_t *gen, int n);
/* How much of text[0..len) may be shown: before a stop string and, unless final, not a tail that may become one
 * nor a trailing U+FFFD that may be half a character. */
long answer_shown_length(const answer_text *a, const char *text, long len, int final);

#endif
