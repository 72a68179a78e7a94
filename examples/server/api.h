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
    int32_t mask_id, eos_id, eot_id; /* what the streaming needs to find the settled text (../common.h) */
    int out_capacity;           /* ids the output may need */
} api_request;

/* Parses and checks body (len bytes) for the endpoint; 0 on success, else -1 with *err filled. On failure nothing
 * is left allocated in *req. */
int api_parse_request(const server *srv, int chat, const char *body, size_t len, api_request *req, api_error *err);

void api_request_free(api_request *req);

#endif
