/* completion.c - see completion.h. Everything the worker does here runs between two denoising steps, so it is kept
 * to detokenising the settled prefix and printing a small JSON object. */
#include "completion.h"
#include "../common.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct choice {
    struct completion *c;
    int index;
    /* worker side, while decoding */
    answer_text answer;         /* dllm-generate's settled-text rules and the detokenisation scratch */
    char *streamed;             /* the answer text already sent as deltas */
    size_t n_streamed, streamed_cap;
    int opened;                 /* the first chunk (chat: the role) is out */
    /* the outcome, set once by on_done */
    dllm_status status;
    char error[256];
    char *text;                 /* the final answer (malloc'ed) */
    int n_tokens;               /* completion tokens: the ids behind the answer */
    const char *finish_reason;  /* "stop" (EOS, stop string) or "length" */
    dllm_gen_stats stats;
} choice;

struct completion {
    server *srv;
    api_request req;
    char id[48];
    long created;
    atomic_int cancel;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int refs;
    choice *choices;
    int n_done;
    int finished;               /* every choice is over and (stream) the last bytes are queued */
    char *pending;              /* stream bytes not yet handed to the HTTP side */
    size_t pending_len, pending_cap, pending_read;
    size_t bytes_queued;        /* stream bytes ever queued: 0 means the response can still be a plain error */
};

/* ---- stream bytes -------------------------------------------------------------------------------------------- */

/* Appends "data: JSON\n\n" (or the raw text when json is NULL) to the pending bytes; under c->lock. A failed
 * allocation drops the event: the stream goes on without it rather than failing the request. */
static void queue_bytes(completion *c, const char *prefix, const char *text, const char *suffix) {
    size_t need = strlen(prefix) + strlen(text) + strlen(suffix);
    if (c->pending_read == c->pending_len) c->pending_read = c->pending_len = 0;
    if (c->pending_len + need + 1 > c->pending_cap) {
        size_t cap = (c->pending_len + need + 1) * 2;
        char *grown = (char *)realloc(c->pending, cap);
        if (!grown) return;
        c->pending = grown;
        c->pending_cap = cap;
    }
    c->pending_len += (size_t)sprintf(c->pending + c->pending_len, "%s%s%s", prefix, text, suffix);
    c->bytes_queued += need;
}

static void queue_event(completion *c, cJSON *event) {
    char *text = event ? cJSON_PrintUnformatted(event) : NULL;
    if (text) {
        pthread_mutex_lock(&c->lock);
        queue_bytes(c, "data: ", text, "\n\n");
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
    }
    free(text);
    cJSON_Delete(event);
}

/* {"id", "object", "created", "model"}: what every response and chunk starts with. */
static cJSON *response_head(const completion *c, const char *object) {
    cJSON *o = cJSON_CreateObject();
    char fingerprint[64];
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->srv->model_id);
    snprintf(fingerprint, sizeof fingerprint, "dllm-%s", dllm_version());
    cJSON_AddStringToObject(o, "system_fingerprint", fingerprint);
    return o;
}

/* One stream chunk of a choice: a text delta (NULL: none) and/or its finish reason. */
static cJSON *delta_chunk(const completion *c, const choice *ch, const char *text, size_t len, const char *finish_reason) {
    cJSON *chunk = response_head(c, c->req.chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(chunk, "choices"), *item = cJSON_CreateObject();
    char *copy = (char *)malloc(len + 1);
    if (copy) {
        memcpy(copy, text ? text : "", len);
        copy[len] = 0;
    }
    cJSON_AddItemToArray(choices, item);
    cJSON_AddNumberToObject(item, "index", ch->index);
    if (c->req.chat) {
        cJSON *delta = cJSON_AddObjectToObject(item, "delta");
        if (!ch->opened) cJSON_AddStringToObject(delta, "role", "assistant");
        if (text) cJSON_AddStringToObject(delta, "content", copy ? copy : "");
    } else {
        cJSON_AddStringToObject(item, "text", copy ? copy : "");
    }
    cJSON_AddNullToObject(item, "logprobs");
    if (finish_reason) cJSON_AddStringToObject(item, "finish_reason", finish_reason);
    else cJSON_AddNullToObject(item, "finish_reason");
    free(copy);
    return chunk;
}

/* Streams the answer text beyond what is out: text[0..len) is the shown answer now, which only ever grows (the
 * settled prefix of committed tokens). */
static void stream_text(choice *ch, const char *text, size_t len, const char *finish_reason) {
    completion *c = ch->c;
    if (len < ch->n_streamed || (ch->n_streamed && memcmp(text, ch->streamed, ch->n_streamed))) {
        /* cannot happen with dllm's detokeniser (a prefix of ids decodes to a prefix of the text); never resend */
        len = ch->n_streamed;
        text = ch->streamed;
    }
    if (len > ch->n_streamed || !ch->opened) {
        if (len > ch->streamed_cap) {
            char *grown = (char *)realloc(ch->streamed, len * 2);
            if (!grown) return;  /* the delta waits for the next step */
            ch->streamed = grown;
            ch->streamed_cap = len * 2;
        }
        queue_event(c, delta_chunk(c, ch, text + ch->n_streamed, len - ch->n_streamed, NULL));
        if (len > ch->n_streamed) memmove(ch->streamed + ch->n_streamed, text + ch->n_streamed, len - ch->n_streamed);
        ch->n_streamed = len;
        ch->opened = 1;
    }
    if (finish_reason) queue_event(c, delta_chunk(c, ch, c->req.chat ? NULL : "", 0, finish_reason));
}

/* The canvas page's event: every generated position (its token's text, or null while masked), which ones this
 * step committed and where the current block lies (positions counted from the answer's first). */
static void stream_canvas(choice *ch, const dllm_step_info *info) {
    completion *c = ch->c;
    const int32_t *gen = info->canvas + info->prompt_len;
    const int n_gen = info->canvas_len - info->prompt_len, block = c->req.gen.block_length;
    int i, block_start, block_end;
    cJSON *event = cJSON_CreateObject(), *tokens, *committed;
    if (c->srv->info.block_size > 0) {  /* block diffusion appends blocks: the one denoised is the canvas's last */
        block_end = n_gen;
        block_start = n_gen > block ? n_gen - block : 0;
    } else {
        block_start = info->block * block;
        block_end = block_start + block;
    }
    cJSON_AddStringToObject(event, "object", "dllm.canvas");
    cJSON_AddStringToObject(event, "id", c->id);
    cJSON_AddNumberToObject(event, "index", ch->index);
    cJSON_AddNumberToObject(event, "step", info->global_step);
    cJSON_AddNumberToObject(event, "total_steps", info->total_steps);
    cJSON_AddNumberToObject(event, "block", info->block);
    cJSON_AddNumberToObject(event, "n_blocks", info->n_blocks);
    cJSON_AddNumberToObject(event, "block_start", block_start);
    cJSON_AddNumberToObject(event, "block_end", block_end);
    cJSON_AddNumberToObject(event, "gen_length", c->req.gen.gen_length);
    cJSON_AddNumberToObject(event, "n_masked", info->n_masked);
    committed = cJSON_AddArrayToObject(event, "committed");
    for (i = 0; i < info->n_committed; i++) cJSON_AddItemToArray(committed, cJSON_CreateNumber(info->committed_pos[i] - info->prompt_len));
    tokens = cJSON_AddArrayToObject(event, "tokens");
    for (i = 0; i < n_gen; i++) {
        char piece[256];
        size_t len = 0;
        if (gen[i] == c->req.mask_id) cJSON_AddItemToArray(tokens, cJSON_CreateNull());
        else if (dllm_detokenize(c->srv->tok, gen + i, 1, 0, piece, sizeof piece, &len) == DLLM_OK) cJSON_AddItemToArray(tokens, cJSON_CreateString(piece));
        else cJSON_AddItemToArray(tokens, cJSON_CreateString("?"));
    }
    queue_event(c, event);
}

/* ---- the scheduler's callbacks (worker thread) ---------------------------------------------------------------- */

static int choice_step(void *owner, const dllm_step_info *info) {
    choice *ch = (choice *)owner;
    completion *c = ch->c;
    const int32_t *gen = info->canvas + info->prompt_len;
    int n, stop = 0;
    long len;
    if (atomic_load(&c->srv->cancel_all)) return 1;
    if (!c->req.stream) return c->req.n_stops ? answer_reached_stop(&ch->answer, gen, answer_settled_prefix(&ch->answer, gen, info->canvas_len - info->prompt_len)) : 0;
    n = answer_settled_prefix(&ch->answer, gen, info->canvas_len - info->prompt_len);
    if (c->req.n_stops && answer_reached_stop(&ch->answer, gen, n)) {
        stop = 1;
        n = ch->answer.stop_ids;
    }
    if ((len = answer_detok(&ch->answer, gen, n)) >= 0) stream_text(ch, ch->answer.text, (size_t)answer_shown_length(&ch->answer, ch->answer.text, len, stop), NULL);
    if (c->req.canvas) stream_canvas(ch, info);
    return stop;  /* a stop string: nothing after it is wanted */
}

static void completion_free(completion *c) {
    int i;
    for (i = 0; i < c->req.n_choices; i++) {
        free(c->choices[i].answer.text);
        free(c->choices[i].streamed);
        free(c->choices[i].text);
    }
    free(c->choices);
    free(c->pending);
    api_request_free(&c->req);
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->lock);
    atomic_fetch_sub(&c->srv->in_flight, 1);
    free(c);
}

static void unref(completion *c) {
    int last;
    pthread_mutex_lock(&c->lock);
    last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (last) completion_free(c);
}

static cJSON *usage_object(const completion *c) {
    cJSON *usage = cJSON_CreateObject();
    int i, generated = 0;
    for (i = 0; i < c->req.n_choices; i++) generated += c->choices[i].n_tokens;
    cJSON_AddNumberToObject(usage, "prompt_tokens", c->req.n_prompt);
    cJSON_AddNumberToObject(usage, "completion_tokens", generated);
    cJSON_AddNumberToObject(usage, "total_tokens", c->req.n_prompt + generated);
    return usage;
}

static int http_status_of(dllm_status s) {
    switch (s) {
    case DLLM_ERR_INVALID_ARGUMENT: case DLLM_ERR_UNSUPPORTED: case DLLM_ERR_BUFFER_TOO_SMALL: return 400;
    case DLLM_ERR_OUT_OF_MEMORY: case DLLM_ERR_CANCELLED: return 503;
    default: return 500;
    }
}

static void fill_error(const choice *ch, api_error *err) {
    int status = http_status_of(ch->status);
    api_error_set(err, status, status == 400 ? "invalid_request_error" : "server_error", NULL, dllm_status_str(ch->status), "%s",
                  ch->status == DLLM_ERR_CANCELLED ? "the request was cancelled (the server is shutting down)" : ch->error);
}

/* The last choice is over: the stream's closing bytes (failures, usage, [DONE]). Under c->lock. */
static void close_stream(completion *c) {
    int i;
    if (c->bytes_queued == 0) {
        for (i = 0; i < c->req.n_choices && c->choices[i].status == DLLM_OK; i++) {}
        if (i < c->req.n_choices) return;  /* failed before any byte: completion_result answers with an HTTP error */
    }
    for (i = 0; i < c->req.n_choices; i++) {
        if (c->choices[i].status != DLLM_OK) {
            api_error err;
            char *json;
            fill_error(&c->choices[i], &err);
            if ((json = api_error_json(&err))) queue_bytes(c, "data: ", json, "\n\n");
            free(json);
        }
    }
    if (c->req.include_usage) {
        cJSON *chunk = response_head(c, c->req.chat ? "chat.completion.chunk" : "text_completion");
        char *json;
        cJSON_AddArrayToObject(chunk, "choices");
        cJSON_AddItemToObject(chunk, "usage", usage_object(c));
        if ((json = cJSON_PrintUnformatted(chunk))) queue_bytes(c, "data: ", json, "\n\n");
        free(json);
        cJSON_Delete(chunk);
    }
    queue_bytes(c, "", "data: [DONE]\n\n", "");
}

static void choice_done(void *owner, dllm_status status, const int32_t *out, int n_out, const dllm_gen_stats *stats, const char *error) {
    choice *ch = (choice *)owner;
    completion *c = ch->c;
    ch->stats = *stats;
    if (status == DLLM_OK || (status == DLLM_ERR_CANCELLED && ch->answer.stop_ids >= 0)) {
        /* dllm-generate's final answer: the ids up to a stop string's, their text cut before it */
        int n_ids = ch->answer.stop_ids >= 0 ? ch->answer.stop_ids : n_out;
        long len = answer_detok(&ch->answer, out, n_ids);
        if (len < 0) {
            ch->status = DLLM_ERR_INTERNAL;
            snprintf(ch->error, sizeof ch->error, "the answer does not detokenize: %s", dllm_last_error());
        } else {
            len = answer_shown_length(&ch->answer, ch->answer.text, len, 1);
            ch->status = (ch->text = (char *)malloc((size_t)len + 1)) ? DLLM_OK : DLLM_ERR_OUT_OF_MEMORY;
            if (ch->text) {
                memcpy(ch->text, ch->answer.text, (size_t)len);
                ch->text[len] = 0;
            } else {
                snprintf(ch->error, sizeof ch->error, "out of memory in the server");
            }
            ch->n_tokens = n_ids;
            ch->finish_reason = ch->answer.stop_ids >= 0 || n_out < c->req.gen.gen_length ? "stop" : "length";
            if (ch->text && c->req.stream) stream_text(ch, ch->text, (size_t)len, ch->finish_reason);
        }
    } else {
        ch->status = status;
        snprintf(ch->error, sizeof ch->error, "%s", error && *error ? error : dllm_status_str(status));
    }
    pthread_mutex_lock(&c->lock);
    if (++c->n_done == c->req.n_choices) {
        if (c->req.stream) close_stream(c);
        c->finished = 1;
    }
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    unref(c);
}

/* ---- the HTTP side ------------------------------------------------------------------------------------------- */

completion *completion_create(server *srv, api_request *req) {
    completion *c = (completion *)calloc(1, sizeof *c);
    int i;
    if (!c || !(c->choices = (choice *)calloc((size_t)req->n_choices, sizeof *c->choices))) {
        free(c);
        api_request_free(req);
        return NULL;
    }
    c->srv = srv;
    c->req = *req;
    memset(req, 0, sizeof *req);
    c->created = (long)time(NULL);
    snprintf(c->id, sizeof c->id, "%s-%lx", c->req.chat ? "chatcmpl" : "cmpl", (unsigned long)atomic_fetch_add(&srv->next_request_id, 1));
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    c->refs = 1;
    for (i = 0; i < c->req.n_choices; i++) {
        c->choices[i].c = c;
        c->choices[i].index = i;
        answer_text *a = &c->choices[i].answer;  /* dllm-generate's rules (../common.h) for this request */
        a->tok = srv->tok;
        a->stops = (const char *const *)c->req.stops;
        a->n_stops = c->req.n_stops;
        a->mask_id = c->req.mask_id, a->eos_id = c->req.eos_id, a->eot_id = c->req.eot_id;
        a->stop_at_eos = c->req.gen.stop_at_eos;
        a->stop_ids = -1;
    }
    atomic_fetch_add(&srv->in_flight, 1);
    return c;
}

int completion_submit(completion *c, api_error *err) {
    sched_sequence *seqs = (sched_sequence *)calloc((size_t)c->req.n_choices, sizeof *seqs);
    sched_submit_result r;
    int i;
    if (!seqs) {
        api_error_set(err, 503, "server_error", NULL, "out_of_memory", "out of memory");
        return -1;
    }
    for (i = 0; i < c->req.n_choices; i++) {
        seqs[i].prompt = c->req.prompt;
        seqs[i].n_prompt = c->req.n_prompt;
        seqs[i].params = c->req.gen;
        seqs[i].params.seed = c->req.gen.seed + (uint64_t)i;  /* n choices that differ where something is random */
        seqs[i].out_capacity = c->req.out_capacity;
        seqs[i].on_step = choice_step;
        seqs[i].on_done = choice_done;
        seqs[i].owner = &c->choices[i];
        seqs[i].cancel = &c->cancel;
    }
    pthread_mutex_lock(&c->lock);
    c->refs += c->req.n_choices;  /* before the worker can see them */
    pthread_mutex_unlock(&c->lock);
    r = sched_submit(c->srv->sched, seqs, c->req.n_choices);
    free(seqs);
    if (r == SCHED_ACCEPTED) return 0;
    pthread_mutex_lock(&c->lock);
    c->refs -= c->req.n_choices;
    pthread_mutex_unlock(&c->lock);
    if (r == SCHED_QUEUE_FULL)
        api_error_set(err, 429, "rate_limit_error", NULL, "queue_full", "the server's queue is full (%d waiting sequences): retry later", c->srv->cfg.max_queue);
    else if (r == SCHED_STOPPING)
        api_error_set(err, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
    else
        api_error_set(err, 503, "server_error", NULL, "out_of_memory", "out of memory");
    return -1;
}

static int ready(const completion *c) {
    return c->finished || (c->req.stream && c->pending_read < c->pending_len);
}

int completion_wait(completion *c, int timeout_ms) {
    struct timespec until;
    int r;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->lock);
    while (!ready(c) && pthread_cond_timedwait(&c->changed, &c->lock, &until) != ETIMEDOUT) {}
    r = ready(c);
    pthread_mutex_unlock(&c->lock);
    return r;
}

long completion_read_stream(completion *c, char *buf, size_t max) {
    long n;
    pthread_mutex_lock(&c->lock);
    n = (long)(c->pending_len - c->pending_read < max ? c->pending_len - c->pending_read : max);
    if (n > 0) memcpy(buf, c->pending + c->pending_read, (size_t)n);
    c->pending_read += (size_t)n;
    if (n == 0 && c->finished) n = -1;
    pthread_mutex_unlock(&c->lock);
    return n;
}

int completion_result(completion *c, char **json, api_error *err) {
    cJSON *root, *choices, *dllm;
    int i;
    *json = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->req.stream && (c->bytes_queued || !c->finished)) {
        pthread_mutex_unlock(&c->lock);
        return 0;  /* the stream answers */
    }
    pthread_mutex_unlock(&c->lock);
    /* finished: the choices' outcomes are written and no longer change */
    for (i = 0; i < c->req.n_choices; i++)
        if (c->choices[i].status != DLLM_OK) {
            fill_error(&c->choices[i], err);
            return -1;
        }
    root = response_head(c, c->req.chat ? "chat.completion" : "text_completion");
    choices = cJSON_AddArrayToObject(root, "choices");
    for (i = 0; i < c->req.n_choices; i++) {
        cJSON *item = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, item);
        cJSON_AddNumberToObject(item, "index", i);
        if (c->req.chat) {
            cJSON *message = cJSON_AddObjectToObject(item, "message");
            cJSON_AddStringToObject(message, "role", "assistant");
            cJSON_AddStringToObject(message, "content", c->choices[i].text);
        } else {
            cJSON_AddStringToObject(item, "text", c->choices[i].text);
        }
        cJSON_AddNullToObject(item, "logprobs");
        cJSON_AddStringToObject(item, "finish_reason", c->choices[i].finish_reason);
    }
    cJSON_AddItemToObject(root, "usage", usage_object(c));
    /* dllm's own account of the decoding (the first choice's): what a user needs to reproduce it with the CLI */
    dllm = cJSON_AddObjectToObject(root, "dllm");
    cJSON_AddNumberToObject(dllm, "seed", (double)c->req.gen.seed);
    cJSON_AddNumberToObject(dllm, "steps", c->choices[0].stats.steps);
    cJSON_AddNumberToObject(dllm, "forwards", c->choices[0].stats.forwards);
    cJSON_AddNumberToObject(dllm, "gen_length", c->req.gen.gen_length);
    cJSON_AddNumberToObject(dllm, "block_length", c->req.gen.block_length);
    cJSON_AddNumberToObject(dllm, "wall_ms", c->choices[0].stats.wall_ms);
    *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!*json) {
        api_error_set(err, 503, "server_error", NULL, "out_of_memory", "out of memory");
        return -1;
    }
    return 0;
}

void completion_cancel(completion *c) {
    atomic_store(&c->cancel, 1);
}

void completion_release(completion *c) {
    unref(c);
}
