/* scheduler.h - the one thread that drives the dllm context, and the queue in front of it.
 *
 * The HTTP side knows only this interface: it submits sequences (a prompt, its generation parameters and two
 * callbacks) and raises a cancel flag when their client is gone. How sequences are grouped onto the context is the
 * scheduler's business: the worker runs a dllm_stepper (continuous batching), so a queued sequence joins the running
 * batch at the next step whenever fewer than max_batch decode, and one that ends leaves its place at once.
 */
#ifndef DLLM_SERVER_SCHEDULER_H
#define DLLM_SERVER_SCHEDULER_H

#include "../../dllm.h"

#include <stdatomic.h>

typedef struct scheduler scheduler;

/* One sequence to decode. The scheduler copies this descriptor; prompt, cancel and owner must stay valid until
 * on_done has been called for it. */
typedef struct sched_sequence {
    const int32_t *prompt;
    int n_prompt;
    dllm_gen_params params;     /* on_step / on_step_data are the scheduler's: whatever is set here is ignored */
    int out_capacity;           /* ids the output may need (gen_length, + 1 for block diffusion's AR seed) */
    /* Called on the worker thread after each of this sequence's steps; nonzero stops this sequence alone (it then
     * ends with DLLM_ERR_CANCELLED and the canvas so far). May be NULL. */
    int (*on_step)(void *owner, const dllm_step_info *info);
    /* Called once on the worker thread when the sequence is over, whatever the reason: status, its output (valid
     * during the call only), the library's stats and, for a failure, the message. */
    void (*on_done)(void *owner, dllm_status status, const int32_t *out, int n_out, const dllm_gen_stats *stats, const char *error);
    void *owner;
    const atomic_int *cancel;   /* nonzero: drop the sequence (before it starts) or stop it (at its next step); may be NULL */
} sched_sequence;

typedef enum sched_submit_result {
    SCHED_ACCEPTED = 0,
    SCHED_QUEUE_FULL = 1,       /* more than max_queue sequences would wait */
    SCHED_STOPPING = 2,         /* sched_drain was called: no new work */
    SCHED_NO_MEMORY = 3
} sched_submit_result;

/* Starts the worker thread on ctx (which the scheduler then owns for its lifetime; the caller frees it after
 * sched_free). max_batch >= 1 sequences decode together, a step forwarding at most max_fill_rows rows of K/V-cache
 * fills (dllm_stepper_params; 0: no bound); at most max_queue sequences wait. NULL on failure. */
scheduler *sched_create(dllm_ctx *ctx, int max_batch, int max_fill_rows, int max_queue);

/* Queues n sequences, all or none (the n choices of one request). */
sched_submit_result sched_submit(scheduler *s, const sched_sequence *seqs, int n);

/* Sequences waiting (not yet decoding) and decoding now. */
void sched_counts(scheduler *s, int *waiting, int *running);

/* Refuses new work; the worker finishes what is queued and running, then exits. Returns at once. */
void sched_drain(scheduler *s);

/* Drains (if not yet asked), waits for the worker to exit and frees the scheduler. */
void sched_free(scheduler *s);

#endif
