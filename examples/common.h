/* examples/common.h - what the example programs share, stb-style: static inline functions (no warning where a program
 * uses only some of them), included by each program that uses them (C99 and C++; no library of its own).
 *
 * The answer's settled text and its stop strings, dllm-generate's rules: dllm-server applies the same ones, so that
 * the server answers what the CLI prints.
 *   - settled: the generated ids up to the first mask (and, with stop_at_eos, the first EOS/EoT);
 *   - a stop string ends the answer before it, at the fewest ids whose text holds it (decoding then stops);
 *   - while decoding goes on, a tail that could still become a stop string, or a trailing U+FFFD that may be half a
 *     character whose other bytes are not committed yet, is not shown. */
#ifndef DLLM_EXAMPLES_COMMON_H
#define DLLM_EXAMPLES_COMMON_H

#include "../dllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A seed nobody chose (dllm-generate's and dllm-server's): from the OS, else the clock. 32 bits, so that it is easy to
 * type back. */
static inline uint64_t fresh_seed(void) {
    uint32_t s = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&s, sizeof s, 1, f) != 1) s = (uint32_t)time(NULL) ^ ((uint32_t)getpid() << 16);
    if (f) fclose(f);
    return s;
}

/* Picks value i of names[] for s; 0 if s is none of them (the command lines' choice options). */
static inline int parse_choice(const char *s, const char *const *names, int n, int *out) {
    int i;
    for (i = 0; i < n; i++)
        if (!strcmp(s, names[i])) { *out = i; return 1; }
    return 0;
}

/* One answer's rules and its detokenisation scratch. Zero it, set the fields above `text`, and stop_ids = -1;
 * free(text) when done. */
typedef struct answer_text {
    const dllm_tokenizer *tok;       /* NULL: ids only */
    const char *const *stops;        /* the stop strings */
    int n_stops;
    int32_t mask_id, eos_id, eot_id; /* the ids the settled prefix ends at */
    int stop_at_eos;                 /* the answer ends at the first EOS/EoT */
    char *text;                      /* detokenisation scratch (malloc'ed) */
    size_t text_cap;
    int stop_ids;                    /* >= 0: a stop string ends the text of the first stop_ids ids */
    long stop_at;                    /* its offset in that text */
} answer_text;

/* ids[0..n) to text (special tokens skipped) into a->text; its length, or -1. */
static inline long answer_detok(answer_text *a, const int32_t *ids, int n) {
    size_t need = 0;
    dllm_status st = dllm_detokenize(a->tok, ids, n, 1, a->text, a->text_cap, &need);
    if (st == DLLM_ERR_BUFFER_TOO_SMALL) {
        char *grown = (char *)realloc(a->text, need);
        if (!grown) return -1;
        a->text = grown;
        a->text_cap = need;
        st = dllm_detokenize(a->tok, ids, n, 1, a->text, a->text_cap, &need);
    }
    return st == DLLM_OK ? (long)need - 1 : -1;
}

/* The offset of the first stop string in text[0..len), or -1. */
static inline long answer_find_stop(const answer_text *a, const char *text, long len) {
    long best = -1;
    int i;
    for (i = 0; i < a->n_stops; i++) {
        size_t sl = strlen(a->stops[i]);
        long p;
        for (p = 0; p + (long)sl <= len && (best < 0 || p < best); p++)
            if (!memcmp(text + p, a->stops[i], sl)) { best = p; break; }
    }
    return best;
}

/* How much of text[0..len) may be shown: before a stop string and, unless final, not a tail that may become one
 * nor a trailing U+FFFD that may be half a character. */
static inline long answer_shown_length(const answer_text *a, const char *text, long len, int final) {
    long stop, keep;
    int i;
    if (!final)
        while (len >= 3 && !memcmp(text + len - 3, "\xEF\xBF\xBD", 3)) len -= 3;
    stop = answer_find_stop(a, text, len);
    keep = len;
    if (stop >= 0) return stop;
    if (final) return len;
    for (i = 0; i < a->n_stops; i++) {
        long sl = (long)strlen(a->stops[i]), k;
        for (k = sl - 1 < len ? sl - 1 : len; k > 0; k--)
            if (!memcmp(text + len - k, a->stops[i], (size_t)k)) {
                if (len - k < keep) keep = len - k;
                break;
            }
    }
    return keep;
}

/* The generated ids that are settled: up to the first mask (and, with stop_at_eos, the first EOS/EoT). */
static inline int answer_settled_prefix(const answer_text *a, const int32_t *gen, int n_gen) {
    int n = 0;
    while (n < n_gen && gen[n] != a->mask_id) {
        if (a->stop_at_eos && (gen[n] == a->eos_id || gen[n] == a->eot_id)) break;
        n++;
    }
    return n;
}

/* If the text of gen[0..n) holds a stop string: records the fewest ids whose text holds it; returns 1. */
static inline int answer_reached_stop(answer_text *a, const int32_t *gen, int n) {
    long len = answer_detok(a, gen, n), at;
    int m;
    if (len < 0 || (at = answer_find_stop(a, a->text, len)) < 0) return 0;
    for (m = 1; m < n; m++) {
        long l = answer_detok(a, gen, m);
        if (l >= 0 && answer_find_stop(a, a->text, l) >= 0) break;
    }
    a->stop_ids = m;
    a->stop_at = at;
    return 1;
}

#endif
