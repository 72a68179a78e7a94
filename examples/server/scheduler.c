/* scheduler.c - continuous batching over a FIFO queue: the worker's dllm_stepper takes queued sequences at every step
 * boundary (see scheduler.h for why it is shaped so). */
#include "scheduler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct queued_sequence {
    sched_sequence seq;
    struct queued_sequence *next;
    int id;          /* its stepper id once added */
    int32_t *out;    /* its output, written by the stepper when it ends */
} queued_sequence;

struct scheduler {
    dllm_ctx *ctx;
    int max_batch, max_fill_rows, max_queue;
    pthread_t worker;
    pthread_mutex_t lock;
    pthread_cond_t work_arrived;
    queued_sequence *head, *tail;   /* FIFO: the oldest sequence joins first */
    int n_waiting, n_running;
    int draining;
    queued_sequence **running;      /* the worker's: the sequences in its stepper (n_running of them) */
};

/* The library's per-step callback for one sequence: the cancel flag first, so that a client that left stops
 * costing forwards at the next step boundary, then the owner's streaming. */
static int sequence_step(const dllm_step_info *info, void *user_data) {
    const sched_sequence *seq = &((const queued_sequence *)user_data)->seq;
    if (seq->cancel && atomic_load(seq->cancel)) return 1;
    return seq->on_step ? seq->on_step(seq->owner, info) : 0;
}

static void finish_without_decoding(const sched_sequence *seq, dllm_status status, const char *why) {
    dllm_gen_stats none;
    memset(&none, 0, sizeof none);
    seq->on_done(seq->owner, status, NULL, 0, &none, why);
}

/* Adds a sequence to the stepper; false if it ended already (cancelled while it waited, refused by the library, no
 * memory, no stepper), its owner told and the sequence freed. */
static int join(scheduler *s, dllm_stepper *stepper, queued_sequence *q) {
    dllm_batch_item item;
    dllm_status status;
    if (q->seq.cancel && atomic_load(q->seq.cancel)) {  /* its client left while it waited: no forward for it */
        finish_without_decoding(&q->seq, DLLM_ERR_CANCELLED, "cancelled before it started");
    } else if (!stepper) {
        finish_without_decoding(&q->seq, DLLM_ERR_INTERNAL, "the server could not start decoding (see its log)");
    } else if (!(q->out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(q->seq.out_capacity > 0 ? q->seq.out_capacity : 1)))) {
        finish_without_decoding(&q->seq, DLLM_ERR_OUT_OF_MEMORY, "out of memory in the server");
    } else {
        item.prompt = q->seq.prompt;
        item.n_prompt = q->seq.n_prompt;
        item.params = q->seq.params;
        item.params.on_step = sequence_step;
        item.params.on_step_data = q;
        item.out = q->out;
        item.out_capacity = q->seq.out_capacity;
        if ((status = dllm_stepper_add(stepper, &item, &q->id)) == DLLM_OK) return 1;
        finish_without_decoding(&q->seq, status, dllm_ctx_last_error(s->ctx));
    }
    free(q->out);
    free(q);
    return 0;
}

/* After a step: each sequence that ended is reported to its owner and leaves the stepper and the running list. */
static void report_ended(scheduler *s, dllm_stepper *stepper) {
    int i, kept = 0;
    for (i = 0; i < s->n_running; i++) {
        queued_sequence *q = s->running[i];
        dllm_seq_event ev;
        const dllm_batch_result *r = &ev.result;
        if (dllm_stepper_poll(stepper, q->id, &ev) != DLLM_OK || !ev.finished) {
            s->running[kept++] = q;
            continue;
        }
        q->seq.on_done(q->seq.owner, r->status, q->out, r->status == DLLM_OK || r->status == DLLM_ERR_CANCELLED ? r->n_out : 0,
                       &r->stats, r->error);
        dllm_stepper_remove(stepper, q->id);
        free(q->out);
        free(q);
    }
    pthread_mutex_lock(&s->lock);
    s->n_running = kept;
    pthread_mutex_unlock(&s->lock);
}

/* The worker: the queue's oldest sequences join the stepper while fewer than max_batch decode, then one step. */
static void *worker_main(void *arg) {
    scheduler *s = (scheduler *)arg;
    dllm_stepper_params params = dllm_stepper_default_params();
    dllm_stepper *stepper = NULL;
    params.max_sequences = s->max_batch;
    params.max_fill_rows = s->max_fill_rows;
    if (dllm_stepper_create(s->ctx, params, &stepper) != DLLM_OK)
        fprintf(stderr, "dllm-server: cannot start decoding: %s\n", dllm_ctx_last_error(s->ctx));
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->head && !s->n_running && !s->draining) pthread_cond_wait(&s->work_arrived, &s->lock);
        if (!s->head && !s->n_running) {  /* draining and nothing left */
            pthread_mutex_unlock(&s->lock);
            break;
        }
        while (s->head && s->n_running < s->max_batch) {
            queued_sequence *q = s->head;
            s->head = q->next;
            if (!s->head) s->tail = NULL;
            s->n_waiting--;
            pthread_mutex_unlock(&s->lock);
            const int joined = join(s, stepper, q);
            pthread_mutex_lock(&s->lock);
            if (joined) s->running[s->n_running++] = q;
        }
        pthread_mutex_unlock(&s->lock);
        if (s->n_running) {
            dllm_stepper_step(stepper);  /* a failure ends the sequences of the step, each with its status */
            report_ended(s, stepper);
        }
    }
    dllm_stepper_free(stepper);
    return NULL;
}

scheduler *sched_create(dllm_ctx *ctx, int max_batch, int max_fill_rows, int max_queue) {
    scheduler *s = (scheduler *)calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctx = ctx;
    s->max_batch = max_batch > 0 ? max_batch : 1;
    s->max_fill_rows = max_fill_rows > 0 ? max_fill_rows : 0;
    s->max_queue = max_queue > 0 ? max_queue : 1;
    if (!(s->running = (queued_sequence **)calloc((size_t)s->max_batch, sizeof *s->running))) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work_arrived, NULL);
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        pthread_cond_destroy(&s->work_arrived);
        pthread_mutex_destroy(&s->lock);
        free(s->running);
        free(s);
        return NULL;
    }
    return s;
}

sched_submit_result sched_submit(scheduler *s, const sched_sequence *seqs, int n) {
    queued_sequence *first = NULL, *last = NULL;
    int i;
    /* allocated before taking the lock, so that a full queue is the only reason to refuse under it */
    for (i = 0; i < n; i++) {
        queued_sequence *q = (queued_sequence *)calloc(1, sizeof *q);
        if (!q) {
            while (first) { queued_sequence *next = first->next; free(first); first = next; }
            return SCHED_NO_MEMORY;
        }
        q->seq = seqs[i];
        if (last) last->next = q; else first = q;
        last = q;
    }
    pthread_mutex_lock(&s->lock);
    if (s->draining || s->n_waiting + n > s->max_queue) {
        sched_submit_result why = s->draining ? SCHED_STOPPING : SCHED_QUEUE_FULL;
        pthread_mutex_unlock(&s->lock);
        while (first) { queued_sequence *next = first->next; free(first); first = next; }
        return why;
    }
    if (!first) {  /* n == 0 */
        pthread_mutex_unlock(&s->lock);
        return SCHED_ACCEPTED;
    }
    if (s->tail) s->tail->next = first; else s->head = first;
    s->tail = last;
    s->n_waiting += n;
    pthread_cond_signal(&s->work_arrived);
    pthread_mutex_unlock(&s->lock);
    return SCHED_ACCEPTED;
}

void sched_counts(scheduler *s, int *waiting, int *running) {
    pthread_mutex_lock(&s->lock);
    if (waiting) *waiting = s->n_waiting;
    if (running) *running = s->n_running;
    pthread_mutex_unlock(&s->lock);
}

void sched_drain(scheduler *s) {
    pthread_mutex_lock(&s->lock);
    s->draining = 1;
    pthread_cond_signal(&s->work_arrived);
    pthread_mutex_unlock(&s->lock);
}

void sched_free(scheduler *s) {
    if (!s) return;
    sched_drain(s);
    pthread_join(s->worker, NULL);
    pthread_cond_destroy(&s->work_arrived);
    pthread_mutex_destroy(&s->lock);
    free(s->running);
    free(s);
}
