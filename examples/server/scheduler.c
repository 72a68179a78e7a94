/* scheduler.c - rounds of dllm_generate_batch over a FIFO queue (see scheduler.h for why it is shaped so). */
#include "scheduler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct queued_sequence {
    sched_sequence seq;
    struct queued_sequence *next;
} queued_sequence;

struct scheduler {
    dllm_ctx *ctx;
    int max_batch, max_queue;
    pthread_t worker;
    pthread_mutex_t lock;
    pthread_cond_t work_arrived;
    queued_sequence *head, *tail;   /* FIFO: the oldest sequence is decoded first */
    int n_waiting, n_running;
    int draining;
    queued_sequence **round;        /* the worker's: the sequences of the round being decoded */
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

/* Decodes one round of n sequences together (a batch of one goes through dllm_generate, whose single-sequence
 * path is the fast one today) and reports each to its owner. */
static void decode_round(scheduler *s, queued_sequence **round, int n) {
    dllm_batch_item *items = (dllm_batch_item *)calloc((size_t)n, sizeof *items);
    dllm_batch_result *results = (dllm_batch_result *)calloc((size_t)n, sizeof *results);
    int32_t **outs = (int32_t **)calloc((size_t)n, sizeof *outs);
    int i, ok = items && results && outs;
    for (i = 0; ok && i < n; i++) {
        const sched_sequence *seq = &round[i]->seq;
        ok = (outs[i] = (int32_t *)malloc(sizeof(int32_t) * (size_t)(seq->out_capacity > 0 ? seq->out_capacity : 1))) != NULL;
        items[i].prompt = seq->prompt;
        items[i].n_prompt = seq->n_prompt;
        items[i].params = seq->params;
        items[i].params.on_step = sequence_step;
        items[i].params.on_step_data = round[i];
        items[i].out = outs[i];
        items[i].out_capacity = seq->out_capacity;
    }
    if (!ok) {
        for (i = 0; i < n; i++) finish_without_decoding(&round[i]->seq, DLLM_ERR_OUT_OF_MEMORY, "out of memory in the server");
    } else {
        if (n == 1) {
            results[0].status = dllm_generate(s->ctx, items[0].prompt, items[0].n_prompt, items[0].params, items[0].out, items[0].out_capacity,
                                              &results[0].n_out, &results[0].stats);
            if (results[0].status != DLLM_OK)
                snprintf(results[0].error, sizeof results[0].error, "%s", dllm_ctx_last_error(s->ctx));
        } else {
            dllm_generate_batch(s->ctx, items, n, results, NULL);  /* each item's outcome is in results[] */
        }
        for (i = 0; i < n; i++)
            round[i]->seq.on_done(round[i]->seq.owner, results[i].status, outs[i], results[i].status == DLLM_OK || results[i].status == DLLM_ERR_CANCELLED ? results[i].n_out : 0,
                                  &results[i].stats, results[i].error);
    }
    for (i = 0; outs && i < n; i++) free(outs[i]);
    free(outs);
    free(results);
    free(items);
}

static void *worker_main(void *arg) {
    scheduler *s = (scheduler *)arg;
    for (;;) {
        int n = 0, i;
        pthread_mutex_lock(&s->lock);
        while (!s->head && !s->draining) pthread_cond_wait(&s->work_arrived, &s->lock);
        if (!s->head) {  /* draining and nothing left */
            pthread_mutex_unlock(&s->lock);
            break;
        }
        while (s->head && n < s->max_batch) {
            queued_sequence *q = s->head;
            s->head = q->next;
            if (!s->head) s->tail = NULL;
            s->n_waiting--;
            if (q->seq.cancel && atomic_load(q->seq.cancel)) {  /* its client left while it waited: no forward for it */
                pthread_mutex_unlock(&s->lock);
                finish_without_decoding(&q->seq, DLLM_ERR_CANCELLED, "cancelled before it started");
                free(q);
                pthread_mutex_lock(&s->lock);
                continue;
            }
            s->round[n++] = q;
        }
        s->n_running = n;
        pthread_mutex_unlock(&s->lock);
        if (n) decode_round(s, s->round, n);
        for (i = 0; i < n; i++) free(s->round[i]);
        pthread_mutex_lock(&s->lock);
        s->n_running = 0;
        pthread_mutex_unlock(&s->lock);
    }
    return NULL;
}

scheduler *sched_create(dllm_ctx *ctx, int max_batch, int max_queue) {
    scheduler *s = (scheduler *)calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctx = ctx;
    s->max_batch = max_batch > 0 ? max_batch : 1;
    s->max_queue = max_queue > 0 ? max_queue : 1;
    if (!(s->round = (queued_sequence **)calloc((size_t)s->max_batch, sizeof *s->round))) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work_arrived, NULL);
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        pthread_cond_destroy(&s->work_arrived);
        pthread_mutex_destroy(&s->lock);
        free(s->round);
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
    free(s->round);
    free(s);
}
