/* completion.h - one completion request from submission to its last byte: the bridge between the HTTP thread
 * that serves it and the scheduler's worker that decodes its choices.
 *
 * The worker turns each step into OpenAI stream chunks (and, on request, dllm canvas events) appended to the
 * completion's pending bytes; the HTTP thread waits on the completion and writes those bytes, or the final JSON.
 * Reference counted: the HTTP side holds one reference and each choice being decoded one, so either side may go
 * first (a client that disconnects cancels and lets go; the worker's last callback frees). */
#ifndef DLLM_SERVER_COMPLETION_H
#define DLLM_SERVER_COMPLETION_H

#include "api.h"

typedef struct completion completion;

/* Takes over req's allocations (req is zeroed). NULL when out of memory (req is then freed). */
completion *completion_create(server *srv, api_request *req);

/* Queues the choices on the scheduler; 0, or -1 with *err (429 queue full, 503 shutting down). */
int completion_submit(completion *c, api_error *err);

/* Waits up to timeout_ms for news; returns 1 when the completion is finished, or (stream) has bytes to write. */
int completion_wait(completion *c, int timeout_ms);

/* Streaming: copies up to max pending bytes into buf; returns the count (0: nothing now), -1 at the end of the
 * stream (every byte written). */
long completion_read_stream(completion *c, char *buf, size_t max);

/* After completion_wait says ready. The response when nothing was streamed: 0 and the JSON (malloc'ed; NULL for a
 * stream that is to be written instead), or -1 with *err when the request failed as a whole. */
int completion_result(completion *c, char **json, api_error *err);

/* The client is gone: its sequences stop at their next step. */
void completion_cancel(completion *c);

/* The HTTP side lets go of it. */
void completion_release(completion *c);

#endif
